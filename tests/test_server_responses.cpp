// OpenAI's Responses API (src/server/responses_api.*) without a model: the real tokenizer.
// - Requests: input items render the same prompt as the same conversation sent to
//   /v1/chat/completions (so the prefix cache serves both); previous_response_id continues a
//   kept conversation exactly as if it were sent whole; bad fields are 400s naming them, an
//   unknown previous response a 404.
// - Answers: the stream's typed events, fed recorded-style model output in pieces of every size,
//   rebuild the non-streamed output items (reasoning, message, function calls) with no markup,
//   in order, sequence numbers counting up; the kept response continues with its sampled DSML.
// Tests skip when the tokenizer has not been fetched (scripts/fetch-tokenizer.sh).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "server/request.h"
#include "server/response.h"
#include "server/responses_api.h"
#include "text/chat.h"
#include "test_util.h"

using namespace dsv4;
using namespace dsv4::server;
using dsv4::testing::real_tokenizer;
using dsv4::testing::tokenizer_dir;
using ojson = nlohmann::ordered_json;

namespace {

constexpr int64_t kContext = 2048;
const std::string D = kDsmlText;

class Responses : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = real_tokenizer();
    if (!tok_) GTEST_SKIP() << "no " << tokenizer_dir() << "/tokenizer.json (scripts/fetch-tokenizer.sh)";
    lim_.default_max_tokens = 64;
  }
  ParsedRequest parse(Api api, const ojson& body) const {
    return parse_request(api, body.dump(), {*tok_, kContext, tok_->vocab_size()}, lim_, &calls_, &kept_);
  }
  // The refusal's status and field ("" when accepted).
  std::pair<int, std::string> refused(const ojson& body) const {
    try {
      (void)parse(Api::OpenAiResponses, body);
    } catch (const ApiError& e) {
      if (!e.param.empty()) {
        EXPECT_NE(std::string(e.what()).find(e.param), std::string::npos) << e.what();
      }
      return {e.status, e.param};
    }
    return {0, ""};
  }
  const Tokenizer* tok_ = nullptr;
  RequestLimits lim_;
  ToolCallStore calls_;
  ResponseStore kept_;
};

const ojson kWeatherParams = ojson::parse(R"({"type":"object","properties":{"city":{"type":"string"},
  "days":{"type":"integer"}},"required":["city"]})");

ojson responses_tools() { return ojson::array({{{"type", "function"}, {"name", "get_weather"}, {"description", "Weather"}, {"parameters", kWeatherParams}}}); }
ojson chat_tools() {
  return ojson::array({{{"type", "function"}, {"function", {{"name", "get_weather"}, {"description", "Weather"}, {"parameters", kWeatherParams}}}}});
}

// Feeds `text` to a responder in pieces of `piece` bytes, the ids counted one per byte and the
// "</think>" token given where that text ends; returns the SSE text (stream) or the body.
std::string run(Responder& resp, const Tokenizer& tok, const std::string& text, size_t piece, const std::string& finish,
                bool stream) {
  std::string out = stream ? resp.start() : "";
  const int32_t think_end = tok.find_token("</think>").value_or(-1);
  const size_t think_at = text.find("</think>");
  for (size_t i = 0; i < text.size(); i += piece) {
    Event e = Event::of(Event::Text);
    e.text = text.substr(i, piece);
    for (size_t k = i; k < i + e.text.size(); ++k) e.ids.push_back(k + 1 == think_at + 8 ? think_end : 100);
    const std::string s = resp.event(e);
    if (stream) out += s;
  }
  Event f = Event::of(Event::Finish);
  f.finish_reason = finish;
  const std::string s = resp.event(f);
  Usage u;
  u.prompt_tokens = 30, u.completion_tokens = static_cast<int64_t>(text.size()), u.cached_tokens = 4;
  if (stream) return out + s + resp.end(u);
  return resp.body(u);
}

// The SSE text as (event name, data) pairs; the name must match the data's "type".
std::vector<ojson> events(const std::string& sse) {
  std::vector<ojson> out;
  size_t at = 0;
  while ((at = sse.find("event: ", at)) != std::string::npos) {
    const size_t nl = sse.find('\n', at);
    const std::string name = sse.substr(at + 7, nl - at - 7);
    const size_t end = sse.find("\n\n", nl);
    ojson d = ojson::parse(sse.substr(nl + 7, end - nl - 7));
    EXPECT_EQ(d["type"], name);
    out.push_back(std::move(d));
    at = end;
  }
  return out;
}

// Rebuilds the output items from the events, as a client does, checking each event refers to
// an open item of its kind; returns the final response object's output next to it.
ojson rebuild(const std::vector<ojson>& ev) {
  ojson items = ojson::array();
  int64_t seq = 0;
  for (const ojson& e : ev) {
    EXPECT_EQ(e["sequence_number"], seq++);
    const std::string t = e["type"];
    if (t == "response.output_item.added") {
      EXPECT_EQ(e["output_index"], items.size());
      items.push_back(e["item"]);
      continue;
    }
    if (!e.contains("output_index")) continue;
    ojson& item = items.at(e["output_index"].get<size_t>());
    if (e.contains("item_id")) {
      EXPECT_EQ(e["item_id"], item["id"]) << t;
    }
    if (t == "response.content_part.added") item["content"].push_back(e["part"]);
    if (t == "response.output_text.delta") {
      EXPECT_EQ(item["type"], "message");
      ojson& p = item["content"].at(e["content_index"].get<size_t>());
      p["text"] = p["text"].get<std::string>() + e["delta"].get<std::string>();
    }
    if (t == "response.reasoning_text.delta") {
      EXPECT_EQ(item["type"], "reasoning");
      ojson& p = item["content"].at(e["content_index"].get<size_t>());
      p["text"] = p["text"].get<std::string>() + e["delta"].get<std::string>();
    }
    if (t == "response.function_call_arguments.delta") {
      EXPECT_EQ(item["type"], "function_call");
      item["arguments"] = item["arguments"].get<std::string>() + e["delta"].get<std::string>();
    }
    if (t == "response.output_item.done") {
      item["status"] = e["item"].value("status", "");
      if (item["type"] != "message" && item["type"] != "function_call") item.erase("status");
      if (e["item"].contains("encrypted_content")) item["encrypted_content"] = e["item"]["encrypted_content"];
      EXPECT_EQ(item, e["item"]) << "the done item differs from its deltas";
    }
  }
  return items;
}

}  // namespace

TEST_F(Responses, InputItemsRenderTheChatConversation) {
  // One agent turn: instructions, a developer note, the user, the model's reasoning and call
  // (its turn's text first), the tool's output; tools beside. The chat form of the same.
  const ojson resp_body = {
      {"instructions", "Be brief."},
      {"input", ojson::array({{{"role", "developer"}, {"content", "Use tools when useful."}},
                              {{"type", "message"}, {"role", "user"}, {"content", ojson::array({{{"type", "input_text"}, {"text", "Weather in Oslo?"}}})}},
                              {{"type", "reasoning"}, {"id", "rs_1"}, {"summary", ojson::array()},
                               {"content", ojson::array({{{"type", "reasoning_text"}, {"text", "I should look it up."}}})}},
                              {{"type", "message"}, {"role", "assistant"}, {"content", ojson::array({{{"type", "output_text"}, {"text", "Checking."}}})}},
                              {{"type", "function_call"}, {"call_id", "call_1"}, {"name", "get_weather"}, {"arguments", R"({"city":"Oslo"})"}},
                              {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "Sunny, 21 C"}}})},
      {"tools", responses_tools()}};
  const ojson chat_body = {
      {"messages", ojson::array({{{"role", "system"}, {"content", "Be brief."}},
                                 {{"role", "developer"}, {"content", "Use tools when useful."}},
                                 {{"role", "user"}, {"content", "Weather in Oslo?"}},
                                 {{"role", "assistant"}, {"content", "Checking."}, {"reasoning_content", "I should look it up."},
                                  {"tool_calls", ojson::array({{{"id", "call_1"}, {"type", "function"},
                                                                {"function", {{"name", "get_weather"}, {"arguments", R"({"city":"Oslo"})"}}}}})}},
                                 {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "Sunny, 21 C"}}})},
      {"tools", chat_tools()}};
  for (const char* effort : {"high", "none"}) {
    ojson rb = resp_body, cb = chat_body;
    rb["reasoning"] = {{"effort", effort}};
    cb["thinking"] = {{"type", std::string(effort) == "none" ? "disabled" : "enabled"}};
    const ParsedRequest r = parse(Api::OpenAiResponses, rb), c = parse(Api::OpenAiChat, cb);
    EXPECT_EQ(r.prompt_text, c.prompt_text) << effort;
    EXPECT_EQ(r.gen.prompt, c.gen.prompt) << effort;
    EXPECT_EQ(r.mode, c.mode) << effort;
    EXPECT_EQ(r.tools, c.tools);
    EXPECT_EQ(r.settings["tools"], responses_tools());  // echoed as sent
  }
  // A string input is one user message.
  EXPECT_EQ(parse(Api::OpenAiResponses, {{"input", "Hi"}}).gen.prompt,
            parse(Api::OpenAiChat, {{"messages", ojson::array({{{"role", "user"}, {"content", "Hi"}}})}}).gen.prompt);
  // max_output_tokens, sampling and the format are read.
  const ParsedRequest f = parse(Api::OpenAiResponses, {{"input", "Hi"}, {"max_output_tokens", 9}, {"temperature", 0.5},
                                                       {"text", {{"format", {{"type", "json_object"}}}}}, {"store", false}});
  EXPECT_EQ(f.gen.max_tokens, 9);
  EXPECT_FLOAT_EQ(f.gen.sampling.temperature, 0.5f);
  EXPECT_TRUE(f.gen.json != nullptr);
  EXPECT_FALSE(f.store_response);
}

TEST_F(Responses, BadFieldsAreNamed) {
  const std::vector<std::pair<ojson, std::string>> cases = {
      {{{"input", 3}}, "input"},
      {{{"input", ojson::array()}}, "input"},
      {{{"input", ojson::array({{{"type", "item_reference"}, {"id", "x"}}})}}, "input[0].type"},
      {{{"input", ojson::array({{{"role", "tool"}, {"content", "x"}}})}}, "input[0].role"},
      {{{"input", ojson::array({{{"role", "user"}, {"content", ojson::array({{{"type", "input_image"}}})}}})}}, "input[0].content[0].type"},
      {{{"input", ojson::array({{{"type", "function_call"}, {"name", "f"}, {"arguments", "{}"}}})}}, "input[0].call_id"},
      {{{"input", ojson::array({{{"type", "function_call_output"}, {"call_id", "c"}}})}}, "input[0].output"},
      {{{"input", "x"}, {"tools", ojson::array({{{"type", "file_search"}}})}}, "tools[0].type"},
      {{{"input", "x"}, {"tools", ojson::array({{{"type", "namespace"}, {"name", "ns"},
                                                 {"tools", ojson::array({{{"type", "custom"}, {"name", "patch"}}})}}})}},
       "tools[0].tools[0].type"},
      {{{"input", "x"}, {"tools", ojson::array({{{"type", "namespace"}, {"tools", ojson::array()}}})}}, "tools[0].name"},
      // A namespace's function named as another tool is.
      {{{"input", "x"}, {"tools", ojson::array({{{"type", "function"}, {"name", "ns__f"}},
                                                {{"type", "namespace"}, {"name", "ns"}, {"tools", ojson::array({{{"type", "function"}, {"name", "f"}}})}}})}},
       "tools[1].tools[0].name"},
      {{{"input", "x"}, {"tools", responses_tools()}, {"tool_choice", {{"type", "function"}, {"name", "nope"}}}}, "tool_choice.name"},
      {{{"input", "x"}, {"tools", responses_tools()}, {"tool_choice", "required"}}, "tool_choice"},  // while reasoning
      {{{"input", "x"}, {"reasoning", {{"effort", "extreme"}}}}, "reasoning.effort"},
      {{{"input", "x"}, {"text", {{"format", {{"type", "json_schema"}, {"schema", {{"type", "object"}, {"minProperties", 1}}}}}}}},
       "text.format.schema.minProperties"},
      {{{"input", "x"}, {"include", ojson::array({3})}}, "include[0]"},
      {{{"input", "x"}, {"top_logprobs", 21}}, "top_logprobs"},
      {{{"input", "x"}, {"n", 2}}, "n"},
      {{{"input", "x"}, {"background", true}}, "background"},
      {{{"input", "x"}, {"truncation", "auto"}}, "truncation"},
      {{{"input", "x"}, {"max_output_tokens", 0}}, "max_output_tokens"},
  };
  for (const auto& [body, field] : cases) EXPECT_EQ(refused(body), std::make_pair(400, field)) << body.dump();
  EXPECT_EQ(refused({{"input", "x"}, {"previous_response_id", "resp_gone"}}), std::make_pair(404, std::string("previous_response_id")));
  // Forced calls work where the model does not reason first.
  const ParsedRequest r = parse(Api::OpenAiResponses, {{"input", "x"}, {"tools", responses_tools()}, {"reasoning", {{"effort", "none"}}},
                                                       {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}}});
  EXPECT_NE(r.forced_prefix.find("invoke name=\"get_weather\""), std::string::npos);
  // Counting needs no room to generate.
  lim_.count_only = true;
  EXPECT_EQ(refused({{"input", std::string(3 * kContext, 'a')}}).first, 0);
}

TEST_F(Responses, NamespaceToolsAndWebSearchAsCodexSendsThem) {
  // Codex sends function tools grouped in a namespace, and web_search. The model sees each
  // function as NAMESPACE__NAME with the namespace's description first; web_search is left out.
  const ojson fn = {{"type", "function"}, {"name", "spawn"}, {"description", "Start one."}, {"parameters", kWeatherParams}};
  const ojson resp_tools = ojson::array({{{"type", "namespace"}, {"name", "agents"}, {"description", "Sub-agents."}, {"tools", ojson::array({fn})}},
                                         {{"type", "web_search"}, {"external_web_access", false}}});
  const ojson chat_tool = ojson::array({{{"type", "function"},
                                         {"function", {{"name", "agents__spawn"}, {"description", "Sub-agents.\n\nStart one."}, {"parameters", kWeatherParams}}}}});
  // The call sent back names its namespace; it renders as the model wrote it.
  const ojson resp_input = ojson::array({{{"role", "user"}, {"content", "Go"}},
                                         {{"type", "function_call"}, {"call_id", "c1"}, {"namespace", "agents"}, {"name", "spawn"}, {"arguments", R"({"city":"x"})"}},
                                         {{"type", "function_call_output"}, {"call_id", "c1"}, {"output", "ok"}}});
  const ojson chat_msgs = ojson::array({{{"role", "user"}, {"content", "Go"}},
                                        {{"role", "assistant"}, {"tool_calls", ojson::array({{{"id", "c1"}, {"type", "function"},
                                                                                            {"function", {{"name", "agents__spawn"}, {"arguments", R"({"city":"x"})"}}}}})}},
                                        {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "ok"}}});
  const ParsedRequest r = parse(Api::OpenAiResponses, {{"input", resp_input}, {"tools", resp_tools}});
  const ParsedRequest c = parse(Api::OpenAiChat, {{"messages", chat_msgs}, {"tools", chat_tool}});
  EXPECT_EQ(r.prompt_text, c.prompt_text);
  EXPECT_EQ(r.prompt_text.find("web_search"), std::string::npos);
  EXPECT_EQ(r.settings["tools"], resp_tools);  // echoed as sent
  // A forced call names the namespace beside the function.
  const ParsedRequest forced = parse(Api::OpenAiResponses, {{"input", "Go"}, {"tools", resp_tools}, {"reasoning", {{"effort", "none"}}},
                                                            {"tool_choice", {{"type", "function"}, {"namespace", "agents"}, {"name", "spawn"}}}});
  EXPECT_NE(forced.forced_prefix.find("invoke name=\"agents__spawn\""), std::string::npos);
  // The model's call comes back as the namespace's function, streamed and not.
  const std::string text = "</think>\n\n<" + D + "tool_calls>\n<" + D + "invoke name=\"agents__spawn\">\n<" + D +
                           "parameter name=\"city\" string=\"true\">Oslo</" + D + "parameter>\n</" + D + "invoke>\n</" + D + "tool_calls>";
  ParsedRequest q = parse(Api::OpenAiResponses, {{"input", "Go"}, {"tools", resp_tools}, {"store", false}});
  auto resp = make_responder(q, *tok_, calls_, nullptr);
  const ojson body = ojson::parse(run(*resp, *tok_, text, 1 << 20, "eos", false));
  const ojson& item = body["output"].back();
  EXPECT_EQ(item["type"], "function_call");
  EXPECT_EQ(item["name"], "spawn");
  EXPECT_EQ(item["namespace"], "agents");
  auto streamed = make_responder(q, *tok_, calls_, nullptr);
  const std::vector<ojson> ev = events(run(*streamed, *tok_, text, 5, "eos", true));
  const ojson items = rebuild(ev);
  EXPECT_EQ(items.back()["name"], "spawn");
  EXPECT_EQ(items.back()["namespace"], "agents");
}

TEST_F(Responses, StreamRebuildsTheBodyAndTheKeptResponseContinues) {
  const std::string call = "<" + D + "invoke name=\"get_weather\">\n<" + D + "parameter name=\"city\" string=\"true\">Oslo \"Sentrum\"</" + D +
                           "parameter>\n<" + D + "parameter name=\"days\" string=\"false\">2</" + D + "parameter>\n</" + D + "invoke>";
  const std::string text = "Weather needs a tool.</think>Let me check.\n\n<" + D + "tool_calls>\n" + call + "\n" + call + "\n</" + D + "tool_calls>";
  ParsedRequest r = parse(Api::OpenAiResponses, {{"input", "Weather in Oslo?"}, {"tools", responses_tools()}, {"stream", true},
                                                 {"include", ojson::array({"reasoning.encrypted_content"})}});
  auto body_resp = make_responder(r, *tok_, calls_, &kept_);
  const ojson body = ojson::parse(run(*body_resp, *tok_, text, 1 << 20, "eos", false));
  EXPECT_EQ(body["object"], "response");
  EXPECT_EQ(body["status"], "completed");
  const ojson& out = body["output"];
  ASSERT_EQ(out.size(), 4u) << out.dump();
  EXPECT_EQ(out[0]["type"], "reasoning");
  EXPECT_EQ(out[0]["content"][0]["text"], "Weather needs a tool.");
  EXPECT_EQ(out[0]["encrypted_content"], "Weather needs a tool.");
  EXPECT_EQ(out[1]["type"], "message");
  EXPECT_EQ(out[1]["content"][0]["text"], "Let me check.");
  for (int k : {2, 3}) {
    EXPECT_EQ(out[k]["type"], "function_call");
    EXPECT_EQ(out[k]["name"], "get_weather");
    EXPECT_EQ(ojson::parse(out[k]["arguments"].get<std::string>()), ojson::parse(R"({"city":"Oslo \"Sentrum\"","days":2})"));
    EXPECT_EQ(calls_.get(out[k]["call_id"]).value_or(""), call);  // the sampled DSML, for the re-render
  }
  EXPECT_EQ(body["usage"]["input_tokens"], 30);
  EXPECT_EQ(body["usage"]["input_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(body["usage"]["output_tokens_details"]["reasoning_tokens"], std::string("Weather needs a tool.</think>").size());
  EXPECT_EQ(body.dump().find("DSML"), std::string::npos);

  for (size_t piece : {1, 2, 3, 7, 64}) {
    auto resp = make_responder(r, *tok_, calls_, nullptr);
    const std::string sse = run(*resp, *tok_, text, piece, "eos", true);
    const std::vector<ojson> ev = events(sse);
    ASSERT_GE(ev.size(), 3u);
    EXPECT_EQ(ev.front()["type"], "response.created");
    EXPECT_EQ(ev.front()["response"]["status"], "in_progress");
    EXPECT_EQ(ev.back()["type"], "response.completed");
    ojson items = rebuild(ev);
    ojson want = out;
    for (size_t k = 0; k < items.size() && k < want.size(); ++k) {
      items[k].erase("id"), want[k].erase("id");
      if (items[k]["type"] == "function_call") items[k].erase("call_id"), want[k].erase("call_id");
    }
    EXPECT_EQ(items, want) << piece;
    EXPECT_EQ(ev.back()["response"]["output"].size(), 4u);
    EXPECT_EQ(sse.find("DSML"), std::string::npos) << "markup leaked at piece " << piece;
  }

  // Kept: a request naming it renders as the whole conversation sent again, the calls with
  // their sampled DSML (the prefix cache then holds).
  auto kept = kept_.get(body["id"]);
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->response, body);
  ojson outputs = ojson::array();
  for (const auto& id : {out[2]["call_id"], out[3]["call_id"]})
    outputs.push_back({{"type", "function_call_output"}, {"call_id", id}, {"output", "sunny"}});
  const ParsedRequest next = parse(Api::OpenAiResponses, {{"previous_response_id", body["id"]}, {"input", outputs}, {"tools", responses_tools()}});
  ojson whole = ojson::array({{{"role", "user"}, {"content", "Weather in Oslo?"}}});
  for (const auto& item : out) whole.push_back(item);
  for (const auto& o : outputs) whole.push_back(o);
  const ParsedRequest sent = parse(Api::OpenAiResponses, {{"input", whole}, {"tools", responses_tools()}});
  EXPECT_EQ(next.gen.prompt, sent.gen.prompt);
  EXPECT_NE(next.prompt_text.find(call + "\n" + call), std::string::npos) << "the calls re-render as sampled";
  EXPECT_EQ(next.settings["previous_response_id"], body["id"]);
}

TEST_F(Responses, CutShortIsIncompleteAndFailuresAreEvents) {
  ParsedRequest r = parse(Api::OpenAiResponses, {{"input", "Hi"}, {"reasoning", {{"effort", "none"}}}, {"max_output_tokens", 5}, {"store", false}});
  auto resp = make_responder(r, *tok_, calls_, &kept_);
  const ojson body = ojson::parse(run(*resp, *tok_, "Hello th", 3, "length", false));
  EXPECT_EQ(body["status"], "incomplete");
  EXPECT_EQ(body["incomplete_details"]["reason"], "max_output_tokens");
  ASSERT_EQ(body["output"].size(), 1u);
  EXPECT_EQ(body["output"][0]["status"], "incomplete");
  EXPECT_EQ(body["output"][0]["content"][0]["text"], "Hello th");
  EXPECT_EQ(body["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
  EXPECT_FALSE(kept_.get(body["id"])) << "store: false";
  // A call cut short is incomplete too (finish() closes it).
  ParsedRequest t = parse(Api::OpenAiResponses, {{"input", "Hi"}, {"reasoning", {{"effort", "none"}}}, {"tools", responses_tools()}});
  auto cut = make_responder(t, *tok_, calls_, &kept_);
  const ojson cb = ojson::parse(run(*cut, *tok_, "\n\n<" + D + "tool_calls>\n<" + D + "invoke name=\"get_weather\">\n<" + D +
                                    "parameter name=\"city\" string=\"true\">Os", 5, "length", false));
  ASSERT_EQ(cb["output"].size(), 1u) << cb.dump();
  EXPECT_EQ(cb["output"][0]["type"], "function_call");
  EXPECT_EQ(cb["output"][0]["status"], "incomplete");
  EXPECT_EQ(ojson::parse(cb["output"][0]["arguments"].get<std::string>()), ojson::parse(R"({"city":"Os"})"));
  auto s = make_responder(r, *tok_, calls_, &kept_);
  const std::vector<ojson> ev = events(s->start() + s->failed(ApiError(500, "server_error", "boom")));
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[2]["type"], "response.failed");
  EXPECT_EQ(ev[2]["response"]["status"], "failed");
  EXPECT_EQ(ev[2]["response"]["error"]["message"], "boom");
}

TEST_F(Responses, LogprobsFollowTheMessageText) {
  // include message.output_text.logprobs: each output_text delta carries the entries of the
  // tokens that wrote it, the part all of them; reasoning tokens (through "</think>") and a tool
  // call's have none. One token per byte here, each with one alternative.
  ParsedRequest r = parse(Api::OpenAiResponses, {{"input", "Hi"}, {"tools", responses_tools()}, {"top_logprobs", 1},
                                                 {"include", ojson::array({"message.output_text.logprobs"})}});
  ASSERT_TRUE(r.logprobs);
  EXPECT_EQ(r.gen.top_logprobs, 1);
  EXPECT_FALSE(parse(Api::OpenAiResponses, {{"input", "Hi"}}).logprobs);
  const int32_t think_end = tok_->find_token("</think>").value();
  const std::string text = std::string("Hmm.</think>Sure thing.\n\n<") + D + "tool_calls>\n<" + D + "invoke name=\"get_weather\">\n<" + D +
                           "parameter name=\"city\" string=\"true\">Oslo</" + D + "parameter>\n</" + D + "invoke>\n</" + D + "tool_calls>";
  for (bool stream : {false, true}) {
    auto resp = make_responder(r, *tok_, calls_, nullptr);
    std::string out = stream ? resp->start() : "";
    const size_t end_at = text.find("</think>");
    for (size_t i = 0; i < text.size();) {
      // "</think>" is one token; every other byte one token (id 65 + its value, for the check).
      Event e = Event::of(Event::Text);
      const bool tag = i == end_at;
      e.text = tag ? "</think>" : text.substr(i, 1);
      e.ids = {tag ? think_end : 65 + static_cast<int32_t>(static_cast<unsigned char>(text[i]) % 50)};
      e.logprobs = {-0.25f};
      e.top = {{{e.ids[0], -0.25f}}};
      out += resp->event(e);
      i += e.text.size();
    }
    Event f = Event::of(Event::Finish);
    f.finish_reason = "eos";
    out += resp->event(f);
    Usage u;
    ojson message;
    std::string deltas;
    size_t delta_entries = 0;
    if (stream) {
      for (const ojson& e : events(out + resp->end(u))) {
        if (e["type"] == "response.output_text.delta") deltas += e["delta"].get<std::string>(), delta_entries += e["logprobs"].size();
        if (e["type"] == "response.completed") message = e["response"]["output"][1];
      }
      EXPECT_EQ(deltas, "Sure thing.");
    } else {
      message = ojson::parse(resp->body(u))["output"][1];
    }
    ASSERT_EQ(message["type"], "message") << message.dump();
    const ojson& lp = message["content"][0]["logprobs"];
    for (const auto& t : lp) {
      EXPECT_EQ(t["logprob"], -0.25f);
      EXPECT_EQ(t["top_logprobs"].size(), 1u);
    }
    EXPECT_EQ(lp.size(), std::string("Sure thing.").size()) << lp.dump();
    if (stream) {
      EXPECT_EQ(delta_entries, lp.size());
    }
  }
}

TEST(ResponseStore, BoundedByBytesOldestFirst) {
  ResponseStore s(4000);
  const ojson conv = ojson::array({{{"role", "user"}, {"content", std::string(900, 'x')}}});
  for (int i = 0; i < 10; ++i) s.put("r" + std::to_string(i), {ojson::object(), conv, ojson()});
  EXPECT_LE(s.bytes(), 4000u);
  EXPECT_FALSE(s.get("r0"));
  EXPECT_TRUE(s.get("r9"));
  // Put again: queued again, so it outlives those put between.
  s.put("r6", {ojson::object(), conv, ojson()});
  for (int i = 10; i < 13; ++i) s.put("r" + std::to_string(i), {ojson::object(), conv, ojson()});
  EXPECT_TRUE(s.get("r6"));
  EXPECT_FALSE(s.get("r7"));
  EXPECT_TRUE(s.erase("r6"));
  EXPECT_FALSE(s.erase("r6"));
  EXPECT_FALSE(s.get("r6"));
  s.put("big", {ojson::object(), ojson(std::string(5000, 'y')), ojson()});  // larger than the budget: not kept
  EXPECT_FALSE(s.get("big"));
  EXPECT_TRUE(s.get("r12"));
}

// GET /v1/responses/{id}/input_items: the page's parameters. Items as kept (ids made at parse
// time); a reasoning item loses its encrypted_content unless include asks for it.
TEST(ResponseStore, InputItemPages) {
  StoredResponse s;
  for (int i = 0; i < 5; ++i) s.input_items.push_back({{"id", "m" + std::to_string(i)}, {"type", "message"}});
  s.input_items.push_back({{"id", "rs"}, {"type", "reasoning"}, {"encrypted_content", "secret"}});
  using Q = std::multimap<std::string, std::string>;
  auto ids = [](const ojson& page) {
    std::string out;
    for (const auto& o : page["data"]) out += o["id"].get<std::string>() + ",";
    return out;
  };
  ojson p = list_input_items(s, {});
  EXPECT_EQ(ids(p), "rs,m4,m3,m2,m1,m0,");  // newest first
  EXPECT_EQ(p["object"], "list");
  EXPECT_EQ(p["first_id"], "rs");
  EXPECT_EQ(p["last_id"], "m0");
  EXPECT_EQ(p["has_more"], false);
  EXPECT_FALSE(p["data"][0].contains("encrypted_content"));
  EXPECT_EQ(list_input_items(s, Q{{"include[]", "reasoning.encrypted_content"}})["data"][0]["encrypted_content"], "secret");
  EXPECT_EQ(list_input_items(s, Q{{"include", "reasoning.encrypted_content"}})["data"][0]["encrypted_content"], "secret");
  p = list_input_items(s, Q{{"order", "asc"}, {"limit", "2"}, {"after", "m1"}});
  EXPECT_EQ(ids(p), "m2,m3,");
  EXPECT_EQ(p["has_more"], true);
  p = list_input_items(s, Q{{"order", "asc"}, {"after", "rs"}});  // after the last: an empty page
  EXPECT_EQ(ids(p), "");
  EXPECT_TRUE(p["first_id"].is_null());
  EXPECT_EQ(p["has_more"], false);
  EXPECT_EQ(ids(list_input_items(s, Q{{"limit", "100"}, {"unknown", "x"}})), "rs,m4,m3,m2,m1,m0,");
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"limit", "0"}, {"limit", "101"}, {"limit", "-1"}, {"limit", "2x"}, {"limit", ""}, {"limit", "1000000000000"},
           {"order", "up"}, {"after", "nope"}}) {
    try {
      list_input_items(s, Q{{k, v}});
      ADD_FAILURE() << k << "=" << v << " was taken";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << k << "=" << v;
      EXPECT_EQ(e.param, k) << v;
    }
  }
}
