// CompletionStream: the incremental parse of a completion. For recorded-style model outputs fed
// whole, at every split point, byte by byte and in random pieces: the same events, deltas that
// join to the final parse, no markup in the text deltas, and for well-formed text exactly what
// parse_completion returns. Then the malformed cases, one by one, and the byte-identical
// re-render through the calls' "dsml".
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/chat.h"
#include "text/completion_stream.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "test_util.h"

using namespace dsv4;
using ojson = nlohmann::ordered_json;
using Kind = CompletionEvent::Kind;
using unicode::is_valid_utf8;

namespace {

const std::string EOS = kEosText, DSML = kDsmlText;
const std::string BLOCK = "\n\n<" + DSML + "tool_calls>\n", BLOCK_END = "</" + DSML + "tool_calls>";

std::string invoke(const std::string& name, const std::string& params) {
  return "<" + DSML + "invoke name=\"" + name + "\">\n" + params + "</" + DSML + "invoke>\n";
}
std::string param(const std::string& name, bool is_string, const std::string& value) {
  return "<" + DSML + "parameter name=\"" + name + "\" string=\"" + (is_string ? "true" : "false") + "\">" +
         value + "</" + DSML + "parameter>\n";
}
std::string calls(const std::string& invokes) { return BLOCK + invokes + BLOCK_END; }

// Consecutive deltas of one kind joined: the form in which two runs must agree.
std::vector<CompletionEvent> joined(const std::vector<CompletionEvent>& in) {
  std::vector<CompletionEvent> out;
  for (const auto& e : in) {
    const bool delta = e.kind == Kind::Reasoning || e.kind == Kind::Content || e.kind == Kind::ToolCallArguments;
    if (delta && !out.empty() && out.back().kind == e.kind && out.back().index == e.index)
      out.back().text += e.text;
    else
      out.push_back(e);
  }
  return out;
}

struct Fed {
  std::vector<CompletionEvent> events;  // as emitted (not joined)
  StreamedCompletion result;
};

Fed feed_all(const std::string& text, const std::vector<size_t>& cuts, ChatMode mode, const ojson& tools = nullptr) {
  CompletionStream s(mode, tools);
  Fed r;
  size_t at = 0;
  for (size_t c : cuts) {
    auto ev = s.feed(std::string_view(text).substr(at, c - at));
    r.events.insert(r.events.end(), ev.begin(), ev.end());
    at = c;
  }
  auto ev = s.feed(std::string_view(text).substr(at));
  r.events.insert(r.events.end(), ev.begin(), ev.end());
  ev = s.finish();
  r.events.insert(r.events.end(), ev.begin(), ev.end());
  r.result = s.result();
  return r;
}

std::string describe(const std::vector<CompletionEvent>& evs) {
  static const char* const names[] = {"R", "C", "Begin", "Args", "End"};
  std::string s;
  for (const auto& e : evs)
    s += std::string(names[static_cast<int>(e.kind)]) + "(" + std::to_string(e.index) + ",'" + e.text + "') ";
  return s;
}

// What every run must satisfy on its own.
void check_invariants(const std::string& text, const Fed& r, ChatMode mode, const std::string& where,
                      const ojson& tools = nullptr) {
  std::string reasoning, content;
  std::vector<std::string> args, names;
  std::vector<int> state;  // per call: 0 none, 1 begun, 2 ended
  for (const auto& e : r.events) {
    switch (e.kind) {
      case Kind::Reasoning: reasoning += e.text; break;
      case Kind::Content: content += e.text; break;
      case Kind::ToolCallBegin:
        ASSERT_EQ(e.index, static_cast<int>(names.size())) << where;
        names.push_back(e.text);
        args.emplace_back();
        state.push_back(1);
        break;
      case Kind::ToolCallArguments:
        ASSERT_TRUE(e.index >= 0 && e.index < static_cast<int>(state.size()) && state[e.index] == 1) << where;
        args[e.index] += e.text;
        break;
      case Kind::ToolCallEnd:
        ASSERT_TRUE(e.index >= 0 && e.index < static_cast<int>(state.size()) && state[e.index] == 1) << where;
        state[e.index] = 2;
        break;
    }
    // A delta never splits a character of valid UTF-8 text.
    if (is_valid_utf8(text)) {
      EXPECT_TRUE(is_valid_utf8(e.text)) << where << ": '" << e.text << "'";
    }
  }
  const ParsedCompletion& p = r.result.parsed;
  EXPECT_EQ(reasoning, p.reasoning_content) << where;
  EXPECT_EQ(content, p.content) << where;
  ASSERT_EQ(p.tool_calls.size(), names.size()) << where;
  ASSERT_EQ(r.result.tool_call_dsml.size(), names.size()) << where;
  for (size_t k = 0; k < names.size(); ++k) {
    EXPECT_EQ(state[k], 2) << where << ": call " << k << " not ended";
    EXPECT_FALSE(names[k].empty()) << where;
    EXPECT_EQ(p.tool_calls[k]["function"]["name"], names[k]) << where;
    EXPECT_EQ(p.tool_calls[k]["function"]["arguments"], args[k]) << where;
    if (is_valid_utf8(text)) {
      const ojson a = ojson::parse(args[k], nullptr, false);
      EXPECT_TRUE(a.is_object()) << where << ": arguments " << args[k];
    }
  }
  if (r.result.well_formed) {
    const ParsedCompletion ref = parse_completion(text, mode, ToolSchemas(tools));
    EXPECT_EQ(p.reasoning_content, ref.reasoning_content) << where;
    EXPECT_EQ(p.content, ref.content) << where;
    EXPECT_EQ(p.tool_calls, ref.tool_calls) << where;
  }
}

// The text fed whole, at every split point, byte by byte and in random pieces: the same joined
// events and result each time. Returns the one-piece run.
Fed check_all_splits(const std::string& text, ChatMode mode, const ojson& tools = nullptr) {
  const Fed whole = feed_all(text, {}, mode, tools);
  check_invariants(text, whole, mode, "whole", tools);
  const auto same = [&](const Fed& r, const std::string& where) {
    EXPECT_EQ(joined(r.events), joined(whole.events))
        << where << "\n got:  " << describe(joined(r.events)) << "\n want: " << describe(joined(whole.events));
    EXPECT_EQ(r.result.parsed.reasoning_content, whole.result.parsed.reasoning_content) << where;
    EXPECT_EQ(r.result.parsed.content, whole.result.parsed.content) << where;
    EXPECT_EQ(r.result.parsed.tool_calls, whole.result.parsed.tool_calls) << where;
    EXPECT_EQ(r.result.tool_call_dsml, whole.result.tool_call_dsml) << where;
    EXPECT_EQ(r.result.well_formed, whole.result.well_formed) << where;
    EXPECT_EQ(r.result.ended, whole.result.ended) << where;
  };
  for (size_t c = 0; c <= text.size(); ++c) {
    const Fed r = feed_all(text, {c}, mode, tools);
    same(r, "split at " + std::to_string(c));
    if (::testing::Test::HasFailure()) return whole;
  }
  std::vector<size_t> every;
  for (size_t c = 1; c < text.size(); ++c) every.push_back(c);
  const Fed bytes = feed_all(text, every, mode, tools);
  same(bytes, "byte by byte");
  check_invariants(text, bytes, mode, "byte by byte", tools);
  std::mt19937 rng(1234);
  for (int t = 0; t < 50; ++t) {
    std::vector<size_t> cuts;
    for (size_t c = 1; c < text.size(); ++c)
      if (rng() % 5 == 0) cuts.push_back(c);
    same(feed_all(text, cuts, mode, tools), "random split " + std::to_string(t));
  }
  return whole;
}

CompletionEvent R(const std::string& s) { return {Kind::Reasoning, -1, s}; }
CompletionEvent C(const std::string& s) { return {Kind::Content, -1, s}; }
CompletionEvent Begin(int i, const std::string& name) { return {Kind::ToolCallBegin, i, name}; }
CompletionEvent Args(int i, const std::string& s) { return {Kind::ToolCallArguments, i, s}; }
CompletionEvent End(int i) { return {Kind::ToolCallEnd, i, ""}; }

ojson tools_list(std::initializer_list<const char*> names) {
  ojson t = ojson::array();
  for (const char* n : names) t.push_back({{"type", "function"}, {"function", {{"name", n}, {"parameters", ojson::object()}}}});
  return t;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Well-formed completions
// ---------------------------------------------------------------------------------------------

TEST(CompletionStream, PlainContent) {
  for (const std::string& text : {std::string("Hello, wörld! 你好 🙂 a<b> </thin") + EOS, std::string("No EOS: cut by max_tokens")}) {
    const Fed r = check_all_splits(text, ChatMode::Chat);
    EXPECT_TRUE(r.result.well_formed);
    EXPECT_EQ(r.result.ended, text.ends_with(EOS));
    EXPECT_EQ(joined(r.events), std::vector<CompletionEvent>{C(text.substr(0, text.find(EOS)))});
  }
}

TEST(CompletionStream, ReasoningThenContent) {
  const std::string text = "The user greets me. </thi is not the tag.\n\n</think>Hi there!" + EOS;
  const Fed r = check_all_splits(text, ChatMode::Thinking);
  EXPECT_TRUE(r.result.well_formed);
  EXPECT_EQ(joined(r.events), (std::vector<CompletionEvent>{R("The user greets me. </thi is not the tag.\n\n"), C("Hi there!")}));
  // Empty reasoning, empty answer.
  const Fed e = check_all_splits("</think>" + EOS, ChatMode::Thinking);
  EXPECT_TRUE(e.events.empty());
  EXPECT_TRUE(e.result.well_formed && e.result.ended);
}

TEST(CompletionStream, OneToolCall) {
  const std::string call = invoke("get_weather", param("city", true, "Paris \"FR\"\nline 2") + param("days", false, "3"));
  const std::string text = "I should look it up.</think>Let me check." + calls(call) + EOS;
  const Fed r = check_all_splits(text, ChatMode::Thinking, tools_list({"get_weather", "other"}));
  EXPECT_TRUE(r.result.well_formed);
  EXPECT_EQ(joined(r.events), (std::vector<CompletionEvent>{
                                  R("I should look it up."), C("Let me check."), Begin(0, "get_weather"),
                                  Args(0, R"({"city": "Paris \"FR\"\nline 2", "days": 3})"), End(0)}));
  ASSERT_EQ(r.result.tool_call_dsml.size(), 1u);
  EXPECT_EQ(r.result.tool_call_dsml[0] + "\n", call);
}

TEST(CompletionStream, SeveralToolCalls) {
  const std::string text =
      "Both." + calls(invoke("a", param("x", true, "1")) + invoke("b", "") + invoke("c", param("y", false, "[1, 2]")));
  const Fed r = check_all_splits(text, ChatMode::Chat);
  EXPECT_TRUE(r.result.well_formed);
  EXPECT_FALSE(r.result.ended);
  EXPECT_EQ(joined(r.events), (std::vector<CompletionEvent>{C("Both."), Begin(0, "a"), Args(0, R"({"x": "1"})"), End(0),
                                                            Begin(1, "b"), Args(1, "{}"), End(1), Begin(2, "c"),
                                                            Args(2, R"({"y": [1, 2]})"), End(2)}));
  EXPECT_EQ(r.result.tool_call_dsml[1], "<" + DSML + "invoke name=\"b\">\n</" + DSML + "invoke>");
}

TEST(CompletionStream, TypedParameters) {
  const std::string text = calls(invoke(
      "f", param("n", false, "-1.25e-07") + param("i", false, "42") + param("t", false, "true") +
               param("z", false, "null") + param("o", false, "{\"k\": {\"a\": [1, \"x\"]}}") +
               param("l", false, "[true, false]") + param("s", false, "\"quoted\"") +
               param("bad", false, "not json") + param("empty", false, "") + param("str", true, "42") +
               param("u", true, "ü <b>\t") + param("nl", true, "ends with newline\n")));
  const Fed r = check_all_splits(text, ChatMode::Chat);
  EXPECT_TRUE(r.result.well_formed);
  ASSERT_EQ(r.result.parsed.tool_calls.size(), 1u);
  const ojson args = ojson::parse(r.result.parsed.tool_calls[0]["function"]["arguments"].get<std::string>());
  EXPECT_EQ(args.dump(),
            R"({"n":-1.25e-07,"i":42,"t":true,"z":null,"o":{"k":{"a":[1,"x"]}},"l":[true,false],"s":"quoted",)"
            R"("bad":"not json","empty":"","str":"42","u":"ü <b>\t","nl":"ends with newline\n"})");
  // Typed values as the model wrote them (number spelling kept).
  EXPECT_NE(r.result.parsed.tool_calls[0]["function"]["arguments"].get<std::string>().find("\"n\": -1.25e-07"),
            std::string::npos);
}

TEST(CompletionStream, HeldBackUntilDecided) {
  CompletionStream s(ChatMode::Chat);
  EXPECT_EQ(s.feed("Hello\n"), std::vector<CompletionEvent>{C("Hello")});
  EXPECT_TRUE(s.feed("\n<｜DS").empty());
  EXPECT_TRUE(s.feed("ML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n").empty());  // name not closed yet
  EXPECT_EQ(s.feed("<｜DSML｜parameter name=\"city\" string=\"true\">Par"),
            (std::vector<CompletionEvent>{Begin(0, "get_weather"), Args(0, "{\"city\": \"Par")}));
  EXPECT_EQ(s.feed("is<"), std::vector<CompletionEvent>{Args(0, "is")});
  EXPECT_EQ(s.feed("x"), std::vector<CompletionEvent>{Args(0, "<x")});  // not a tag after all
  EXPECT_TRUE(s.feed("\xC3").empty());                                    // half a character
  EXPECT_EQ(s.feed("\xA9</｜DSML｜parameter>\n"), (std::vector<CompletionEvent>{Args(0, "é\"")}));
  EXPECT_TRUE(s.feed("<｜DSML｜parameter name=\"days\" string=\"false\">1").empty());  // typed: held whole
  EXPECT_EQ(s.feed("0</｜DSML｜parameter>\n</｜DSML｜invoke>"),
            (std::vector<CompletionEvent>{Args(0, ", \"days\": 10}"), End(0)}));
  EXPECT_TRUE(s.feed("\n</｜DSML｜tool_calls><｜end▁of▁sent").empty());
  EXPECT_TRUE(s.feed("ence｜>").empty());
  EXPECT_TRUE(s.finish().empty());
  EXPECT_TRUE(s.result().well_formed);
  EXPECT_TRUE(s.result().ended);
  EXPECT_EQ(s.result().parsed.content, "Hello");
}

TEST(CompletionStream, PartialTagsAtTheEndArePlainText) {
  for (const std::string& tail : {std::string("\n"), std::string("\n\n<｜DSML｜tool_c"), std::string("<｜end▁of"), std::string("\xE4\xBD")}) {
    const Fed r = check_all_splits("Answer" + tail, ChatMode::Chat);
    EXPECT_EQ(r.result.parsed.content, "Answer" + tail);
  }
  const Fed t = check_all_splits("Thinking</thi", ChatMode::Thinking);
  EXPECT_EQ(t.result.parsed.reasoning_content, "Thinking</thi");
  EXPECT_FALSE(t.result.well_formed);  // no "</think>"
}

// ---------------------------------------------------------------------------------------------
// Malformed markup
// ---------------------------------------------------------------------------------------------

TEST(CompletionStream, UnclosedParameterClosesTheCall) {
  const std::string text = "Sure." + BLOCK + "<｜DSML｜invoke name=\"search\">\n" + param("q", true, "cats") +
                           "<｜DSML｜parameter name=\"note\" string=\"true\">half a valu";
  const Fed r = check_all_splits(text, ChatMode::Chat);
  EXPECT_FALSE(r.result.well_formed);
  EXPECT_EQ(joined(r.events), (std::vector<CompletionEvent>{C("Sure."), Begin(0, "search"),
                                                            Args(0, R"({"q": "cats", "note": "half a valu"})"), End(0)}));
  EXPECT_EQ(r.result.tool_call_dsml, std::vector<std::string>{""});  // cut short: no exact text
  // An unclosed typed value: the parameter is not taken, its text becomes content.
  const std::string typed = BLOCK + "<｜DSML｜invoke name=\"search\">\n" + param("q", true, "cats") +
                            "<｜DSML｜parameter name=\"n\" string=\"false\">12";
  const Fed t = check_all_splits(typed, ChatMode::Chat);
  EXPECT_EQ(t.result.parsed.tool_calls[0]["function"]["arguments"], R"({"q": "cats"})");
  EXPECT_EQ(t.result.parsed.content, "<｜DSML｜parameter name=\"n\" string=\"false\">12");
  // Cut right after an invoke tag or a parameter: parse_completion takes these, so do we.
  for (const std::string& cut : {BLOCK + "<｜DSML｜invoke name=\"a\">\n",
                                 BLOCK + "<｜DSML｜invoke name=\"a\">\n" + param("x", false, "1"),
                                 BLOCK + "<｜DSML｜invoke name=\"a\">\n" + param("x", false, "1") + "</｜DSML｜invoke"}) {
    const Fed c = check_all_splits("C" + cut, ChatMode::Chat);
    EXPECT_TRUE(c.result.well_formed) << cut;
    EXPECT_EQ(c.result.parsed.tool_calls.size(), 1u) << cut;
    EXPECT_EQ(c.result.parsed.content, "C") << cut;
  }
}

// parallel_tool_calls false ends the answer right after its first call's "</｜DSML｜invoke>"
// (server/scheduler.h): that call is whole, with its exact text, and nothing is content.
TEST(CompletionStream, EndRightAfterACall) {
  const std::string call = invoke("a", param("x", true, "1"));
  const std::string text = "Sure." + BLOCK + call.substr(0, call.size() - 1);
  const Fed r = check_all_splits(text, ChatMode::Chat);
  EXPECT_EQ(joined(r.events), (std::vector<CompletionEvent>{C("Sure."), Begin(0, "a"), Args(0, R"({"x": "1"})"), End(0)}));
  EXPECT_EQ(r.result.tool_call_dsml, std::vector<std::string>{call.substr(0, call.size() - 1)});
  EXPECT_EQ(r.result.parsed.content, "Sure.");
}

TEST(CompletionStream, BadAttributesAreContent) {
  const std::vector<std::string> bad = {
      BLOCK + "<｜DSML｜invoke nam=\"a\">\n</｜DSML｜invoke>\n" + BLOCK_END,
      BLOCK + "<｜DSML｜invoke name=a>\n</｜DSML｜invoke>\n" + BLOCK_END,
      BLOCK + "<｜DSML｜invoke name=\"\">\n</｜DSML｜invoke>\n" + BLOCK_END,  // empty name
      "\n\n<｜DSML｜tool_calls><｜DSML｜invoke name=\"a\">\n</｜DSML｜invoke>\n" + BLOCK_END,  // no ">\n"
      BLOCK + "junk",
  };
  for (const auto& b : bad) {
    const Fed r = check_all_splits("Text" + b + EOS, ChatMode::Chat);
    EXPECT_FALSE(r.result.well_formed) << b;
    EXPECT_TRUE(r.result.parsed.tool_calls.empty()) << b;
    EXPECT_EQ(r.result.parsed.content, "Text" + b) << b;  // the whole block, as it was
    EXPECT_THROW(parse_completion("Text" + b + EOS, ChatMode::Chat), Error) << b;
  }
  // A bad parameter after a good one: the call keeps what it had, the rest is content.
  const std::string text = BLOCK + "<｜DSML｜invoke name=\"a\">\n" + param("x", true, "1") +
                           "<｜DSML｜parameter name=\"y\" string=\"maybe\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n" +
                           BLOCK_END;
  const Fed r = check_all_splits(text, ChatMode::Chat);
  EXPECT_EQ(joined(r.events),
            (std::vector<CompletionEvent>{Begin(0, "a"), Args(0, R"({"x": "1"})"), End(0),
                                          C("<｜DSML｜parameter name=\"y\" string=\"maybe\">2</｜DSML｜parameter>\n"
                                            "</｜DSML｜invoke>\n" + BLOCK_END)}));
  // Duplicate parameter names.
  const Fed d = check_all_splits(calls(invoke("a", param("x", true, "1") + param("x", true, "2"))), ChatMode::Chat);
  EXPECT_EQ(d.result.parsed.tool_calls[0]["function"]["arguments"], R"({"x": "1"})");
  EXPECT_FALSE(d.result.well_formed);
}

TEST(CompletionStream, UnknownToolIsContent) {
  const std::string block = calls(invoke("rm_rf", param("path", true, "/")));
  const Fed r = check_all_splits("Ok." + block, ChatMode::Chat, tools_list({"get_weather"}));
  EXPECT_FALSE(r.result.well_formed);
  EXPECT_TRUE(r.result.parsed.tool_calls.empty());
  EXPECT_EQ(r.result.parsed.content, "Ok." + block);
  // A known call first, then an unknown one: the first stays a call.
  const Fed m = check_all_splits(calls(invoke("get_weather", "") + invoke("rm_rf", "")), ChatMode::Chat,
                                 tools_list({"get_weather"}));
  ASSERT_EQ(m.result.parsed.tool_calls.size(), 1u);
  EXPECT_EQ(m.result.parsed.content, "\n" + invoke("rm_rf", "") + BLOCK_END);
  // Without a tools list any name is taken.
  EXPECT_EQ(check_all_splits(block, ChatMode::Chat).result.parsed.tool_calls.size(), 1u);
  EXPECT_THROW(CompletionStream(ChatMode::Chat, ojson::object()), Error);
  EXPECT_THROW(CompletionStream(ChatMode::Chat, ojson::parse(R"([{"type":"function"}])")), Error);
}

TEST(CompletionStream, TextAfterTheCalls) {
  const std::string block = calls(invoke("a", ""));
  const Fed r = check_all_splits("Before" + block + "After" + EOS + "ignored", ChatMode::Chat);
  EXPECT_FALSE(r.result.well_formed);
  EXPECT_TRUE(r.result.ended);
  EXPECT_EQ(r.result.parsed.content, "BeforeAfter");
  EXPECT_EQ(r.result.parsed.tool_calls.size(), 1u);
  // A second block is read too.
  const Fed two = check_all_splits(block + block, ChatMode::Chat);
  EXPECT_EQ(two.result.parsed.tool_calls.size(), 2u);
  EXPECT_EQ(two.result.parsed.content, "");
}

TEST(CompletionStream, ThinkingEdgeCases) {
  // A block before "</think>" ends the reasoning (parse_completion rejects it).
  const Fed r = check_all_splits("Need data." + calls(invoke("a", "")) + EOS, ChatMode::Thinking);
  EXPECT_FALSE(r.result.well_formed);
  EXPECT_EQ(r.result.parsed.reasoning_content, "Need data.");
  EXPECT_EQ(r.result.parsed.tool_calls.size(), 1u);
  // ... a malformed one stays reasoning.
  const Fed m = check_all_splits("Need" + BLOCK + "junk</think>Answer", ChatMode::Thinking);
  EXPECT_EQ(m.result.parsed.reasoning_content, "Need" + BLOCK + "junk");
  EXPECT_EQ(m.result.parsed.content, "Answer");
  // The end of sentence inside the reasoning ends everything.
  const Fed e = check_all_splits("Stop" + EOS + "</think>x", ChatMode::Thinking);
  EXPECT_EQ(e.result.parsed.reasoning_content, "Stop");
  EXPECT_EQ(e.result.parsed.content, "");
  EXPECT_TRUE(e.result.ended);
}

TEST(CompletionStream, SpecialTokensInText) {
  // Not markup of a completion: passed as text, but parse_completion rejects the text.
  const Fed r = check_all_splits("A<think>B<｜User｜>C" + EOS, ChatMode::Chat);
  EXPECT_EQ(r.result.parsed.content, "A<think>B<｜User｜>C");
  EXPECT_FALSE(r.result.well_formed);
  // The end of sentence inside a string value is value text when more follows...
  const Fed v = check_all_splits(calls(invoke("a", param("x", true, "p" + EOS + "q"))), ChatMode::Chat);
  EXPECT_TRUE(v.result.well_formed);
  EXPECT_EQ(v.result.parsed.tool_calls[0]["function"]["arguments"], "{\"x\": \"p" + EOS + "q\"}");
  // ... and ends the completion at the end.
  const Fed end = check_all_splits(BLOCK + "<｜DSML｜invoke name=\"a\">\n" + "<｜DSML｜parameter name=\"x\" string=\"true\">p" + EOS,
                                   ChatMode::Chat);
  EXPECT_EQ(end.result.parsed.tool_calls[0]["function"]["arguments"], R"({"x": "p"})");
  EXPECT_EQ(end.result.parsed.content, "");
  EXPECT_TRUE(end.result.ended);
}

TEST(CompletionStream, Misuse) {
  CompletionStream s(ChatMode::Chat);
  EXPECT_THROW(s.result(), Error);
  s.feed("x");
  s.finish();
  EXPECT_THROW(s.feed("y"), Error);
  EXPECT_THROW(s.finish(), Error);
  EXPECT_EQ(s.result().parsed.content, "x");
}

// ---------------------------------------------------------------------------------------------
// parse_completion changes, re-rendering through "dsml"
// ---------------------------------------------------------------------------------------------

TEST(CompletionStream, ParseCompletionQuotesNonJsonTypedValues) {
  const ParsedCompletion p = parse_completion(calls(invoke("a", param("x", false, "not json"))), ChatMode::Chat);
  EXPECT_EQ(p.tool_calls[0]["function"]["arguments"], R"({"x": "not json"})");
  EXPECT_THROW(parse_completion(calls(invoke("", "")), ChatMode::Chat), Error);
}

TEST(CompletionStream, ReRenderIsByteIdentical) {
  // Typed values spelled unlike Python's json.dumps, and a string="false" string: rendering the
  // call from its arguments would not give the sampled text back.
  const std::string sampled = "Think.</think>Calling." +
                              calls(invoke("f", param("o", false, "{\"a\":1}") + param("n", false, "1e5") +
                                                    param("s", false, "\"x\"") + param("t", true, "two\nlines")) +
                                    invoke("g", "")) +
                              EOS;
  CompletionStream s(ChatMode::Thinking);
  s.feed(sampled);
  s.finish();
  const StreamedCompletion& r = s.result();
  ASSERT_TRUE(r.well_formed);
  ojson assistant = {{"role", "assistant"}, {"reasoning_content", r.parsed.reasoning_content}, {"content", r.parsed.content}};
  assistant["tool_calls"] = r.parsed.tool_calls;
  ojson messages = ojson::array({{{"role", "user"}, {"content", "Q"}}, assistant});
  const std::string prefix = std::string(kBosText) + kUserText + "Q" + kAssistantText + kThinkStartText;
  EXPECT_NE(render_chat(messages), prefix + sampled);  // without "dsml": regenerated
  for (size_t k = 0; k < r.tool_call_dsml.size(); ++k) messages[1]["tool_calls"][k]["dsml"] = r.tool_call_dsml[k];
  EXPECT_EQ(render_chat(messages), prefix + sampled);
  // A "dsml" that does not match its call is refused.
  ojson wrong = messages;
  wrong[1]["tool_calls"][1]["dsml"] = r.tool_call_dsml[0];
  EXPECT_THROW(render_chat(wrong), Error);
  wrong = messages;
  wrong[1]["tool_calls"][0]["function"]["arguments"] = R"({"o": {"a": 2}, "n": 1e5, "s": "x", "t": "two\nlines"})";
  EXPECT_THROW(render_chat(wrong), Error);
  wrong[1]["tool_calls"][0]["dsml"] = "<｜DSML｜invoke name=\"f\">\n";
  EXPECT_THROW(render_chat(wrong), Error);
  wrong[1]["tool_calls"][0]["dsml"] = 5;
  EXPECT_THROW(render_chat(wrong), Error);
}

// ---------------------------------------------------------------------------------------------
// Generated completions: well-formed ones built from the grammar, then mutated (fragments of
// tags inserted, ranges deleted, the text cut). Every one must satisfy the invariants and give the
// same result split at random; the well-formed ones must equal parse_completion.
// ---------------------------------------------------------------------------------------------

TEST(CompletionStream, GeneratedAndMutated) {
  std::mt19937 rng(42);
  const auto pick = [&](const std::vector<std::string>& v) { return v[rng() % v.size()]; };
  const std::vector<std::string> words = {"a", "b c", "\n", "<", "</", "é", "你", "🙂", "</thi", "<｜", "\n\n<｜DSML｜tool",
                                          "<｜end▁of", "\"q\"", "\\", "x>y"};
  const std::vector<std::string> typed = {"1", "-2.5e3", "true", "null", "[1, {\"a\": \"b\"}]", "{\"k\": [true]}",
                                          "not json", "", "\"s\"", "{bad"};
  const std::vector<std::string> fragments = {
      "<｜DSML｜invoke name=\"a\">\n", "</｜DSML｜invoke>\n", "<｜DSML｜parameter name=\"p\" string=\"true\">",
      "</｜DSML｜parameter>\n", BLOCK, BLOCK_END, EOS, "</think>", ">\n", "\"", "\n", "<", "｜DSML｜", "\xE4"};
  const auto text = [&](int n) {
    std::string s;
    for (int k = 0; k < n; ++k) s += pick(words);
    return s;
  };
  int well_formed = 0, total = 0;
  for (int iter = 0; iter < 600; ++iter) {
    const ChatMode mode = rng() % 2 ? ChatMode::Thinking : ChatMode::Chat;
    std::string s;
    if (mode == ChatMode::Thinking) s += text(rng() % 4) + "</think>";
    s += text(rng() % 4);
    if (rng() % 3) {
      std::string invokes;
      const int n = rng() % 4;
      for (int c = 0; c < n; ++c) {
        std::string params;
        const int np = rng() % 4;
        for (int k = 0; k < np; ++k) {
          const bool str = rng() % 2;
          std::string name = "p";
          name += std::to_string(k);
          params += param(name, str, str ? text(rng() % 3) : pick(typed));
        }
        invokes += invoke(rng() % 4 ? "a" : "get_weather", params);
      }
      s += calls(invokes);
    }
    if (rng() % 2) s += EOS;
    const int mutations = rng() % 3;
    for (int m = 0; m < mutations; ++m) {
      const size_t at = rng() % (s.size() + 1);
      switch (rng() % 3) {
        case 0: s.insert(at, pick(fragments)); break;
        case 1: s.erase(at, rng() % 8); break;
        case 2: s.resize(at); break;
      }
    }
    const ojson tools = rng() % 3 ? ojson(nullptr) : tools_list({"a"});
    const Fed whole = feed_all(s, {}, mode, tools);
    check_invariants(s, whole, mode, "generated " + std::to_string(iter));
    well_formed += whole.result.well_formed;
    ++total;
    for (int t = 0; t < 3; ++t) {
      std::vector<size_t> cuts;
      const int every = t == 0 ? 1 : 1 + static_cast<int>(rng() % 6);
      for (size_t c = 1; c < s.size(); ++c)
        if (rng() % every == 0) cuts.push_back(c);
      const Fed r = feed_all(s, cuts, mode, tools);
      ASSERT_EQ(joined(r.events), joined(whole.events)) << "generated " << iter << ": " << s;
      ASSERT_EQ(r.result.parsed.tool_calls, whole.result.parsed.tool_calls);
      ASSERT_EQ(r.result.tool_call_dsml, whole.result.tool_call_dsml);
      ASSERT_EQ(r.result.well_formed, whole.result.well_formed);
    }
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "input: " << s;
      return;
    }
  }
  // Both kinds were generated.
  EXPECT_GT(well_formed, total / 5);
  EXPECT_LT(well_formed, total * 4 / 5);
}

TEST(CompletionStream, LargeInputsAreLinear) {
  // 1 MB in a string value, in a held typed value, in an unterminated invoke tag (a name, or
  // whitespace before it) and in reasoning and content, fed in 4-byte pieces: no rescans from the
  // start.
  const std::string big(1 << 20, 'x');
  for (const std::string& text :
       {calls(invoke("a", param("s", true, big))), calls(invoke("a", param("t", false, "\"" + big + "\""))),
        BLOCK + "<｜DSML｜invoke name=\"" + big, BLOCK + "<｜DSML｜invoke" + std::string(1 << 20, ' '),
        "R" + big + "</think>" + big}) {
    const auto t0 = std::chrono::steady_clock::now();
    CompletionStream s(ChatMode::Thinking);
    for (size_t at = 0; at < text.size(); at += 4) s.feed(std::string_view(text).substr(at, 4));
    s.finish();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(secs, 2.0) << text.substr(0, 40);
  }
}

// What the server feeds: the text of each sampled token (the real tokenizer; a token may end
// inside a character), or the characters StreamDecoder lets out.
TEST(CompletionStream, TokenByTokenWithTheRealTokenizer) {
  const std::string file = dsv4::testing::tokenizer_dir() + "/tokenizer.json";
  if (!std::filesystem::exists(file)) GTEST_SKIP() << "no " << file << ": run scripts/fetch-tokenizer.sh";
  const Tokenizer tok = Tokenizer::load(file);
  const std::string texts[] = {
      "Der Nutzer fragt nach dem Wetter 🌦️ in Zürich.</think>Ich sehe nach." +
          calls(invoke("get_weather", param("city", true, "Zürich, 中国 \"CH\"") + param("days", false, "3") +
                                          param("opts", false, "{\"units\": \"metric\", \"hourly\": [6, 12]}"))) +
          EOS,
      "短い答え。</think>答えは42です。" + EOS,
      "R</think>" + calls(invoke("a", param("x", true, "half")).substr(0, 60)),
  };
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = tok.encode(text);
    ASSERT_EQ(tok.decode(ids), text);
    const Fed whole = feed_all(text, {}, ChatMode::Thinking);
    CompletionStream raw(ChatMode::Thinking), chars(ChatMode::Thinking);
    StreamDecoder dec(tok);
    std::vector<CompletionEvent> raw_events, char_events;
    for (int32_t id : ids) {
      for (auto& e : raw.feed(tok.token_text(id))) raw_events.push_back(std::move(e));
      for (auto& e : chars.feed(dec.push(id))) char_events.push_back(std::move(e));
    }
    for (auto& e : raw.finish()) raw_events.push_back(std::move(e));
    for (auto& e : chars.feed(dec.flush())) char_events.push_back(std::move(e));
    for (auto& e : chars.finish()) char_events.push_back(std::move(e));
    EXPECT_EQ(joined(raw_events), joined(whole.events)) << text;
    EXPECT_EQ(joined(char_events), joined(whole.events)) << text;
    EXPECT_EQ(raw.result().parsed.tool_calls, whole.result.parsed.tool_calls);
    EXPECT_GT(ids.size(), 10u);
  }
}
