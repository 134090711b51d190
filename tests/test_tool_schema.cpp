// Tool-call arguments typed by the tool's JSON schema (text/tool_schema.h): the rules one by one
// on plain values, the types read from each schema form, and the whole path through
// parse_completion and the completion stream (every split), then a typed call sent back with its
// DSML rendering byte-identically.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "text/chat.h"
#include "text/completion_stream.h"
#include "text/tool_schema.h"

using namespace dsv4;
using ojson = nlohmann::ordered_json;
using Types = std::set<std::string>;

namespace {

const std::string D = kDsmlText;

std::string param(const std::string& name, bool is_string, const std::string& value) {
  return "<" + D + "parameter name=\"" + name + "\" string=\"" + (is_string ? "true" : "false") + "\">" + value + "</" +
         D + "parameter>\n";
}
std::string invoke(const std::string& name, const std::string& params) {
  return "<" + D + "invoke name=\"" + name + "\">\n" + params + "</" + D + "invoke>";
}
std::string block(const std::string& invokes) {
  return "\n\n<" + D + "tool_calls>\n" + invokes + "\n</" + D + "tool_calls>";
}

ojson tools() {
  return ojson::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{
    "s":{"type":"string"}, "i":{"type":"integer"}, "x":{"type":"number"}, "b":{"type":"boolean"},
    "o":{"type":["object","null"]}, "a":{"type":"array"}, "e":{"enum":[1,2,3]}, "u":{"anyOf":[{"type":"integer"},{"type":"string"}]},
    "c":{"const":true}, "free":{"description":"no type"}}}}},
    {"name":"g"}])");
}

}  // namespace

TEST(ToolSchema, TypesFromEachSchemaForm) {
  const ToolSchemas t(tools());
  EXPECT_EQ(t.types("f", "s"), Types{"string"});
  EXPECT_EQ(t.types("f", "o"), (Types{"object", "null"}));
  EXPECT_EQ(t.types("f", "e"), Types{"integer"});
  EXPECT_EQ(t.types("f", "u"), (Types{"integer", "string"}));
  EXPECT_EQ(t.types("f", "c"), Types{"boolean"});
  EXPECT_TRUE(t.types("f", "free").empty());
  EXPECT_TRUE(t.types("f", "unknown").empty());
  EXPECT_TRUE(t.types("g", "s").empty());
  EXPECT_TRUE(t.has_tool("f") && t.has_tool("g") && !t.has_tool("h"));
  EXPECT_TRUE(ToolSchemas(nullptr).empty());
  EXPECT_THROW(ToolSchemas(ojson::object()), Error);
  EXPECT_THROW(ToolSchemas(ojson::parse(R"([{"type":"function"}])")), Error);
}

TEST(ToolSchema, StringFlagAgainstNonStringSchema) {
  // string="true" where the schema wants another type: the text as JSON when it is one.
  EXPECT_EQ(typed_argument("5", true, {"integer"}), "5");
  EXPECT_EQ(typed_argument("5", true, {"number"}), "5");
  EXPECT_EQ(typed_argument("2.5", true, {"number"}), "2.5");
  EXPECT_EQ(typed_argument("2.5", true, {"integer"}), "\"2.5\"");  // not an integer: left a string
  EXPECT_EQ(typed_argument("true", true, {"boolean"}), "true");
  EXPECT_EQ(typed_argument("{\"k\": [1]}", true, {"object"}), "{\"k\": [1]}");
  EXPECT_EQ(typed_argument("[1, 2]", true, {"array"}), "[1, 2]");
  EXPECT_EQ(typed_argument("five", true, {"integer"}), "\"five\"");  // not JSON: the client's validator says so
  EXPECT_EQ(typed_argument("\"5\"", true, {"integer"}), "\"\\\"5\\\"\"");
  // A schema that allows a string, or none: the raw text is the string.
  EXPECT_EQ(typed_argument("5", true, {"integer", "string"}), "\"5\"");
  EXPECT_EQ(typed_argument("5", true, {}), "\"5\"");
  EXPECT_EQ(typed_argument("Zürich \"N\"", true, {"string"}), "\"Zürich \\\"N\\\"\"");
}

TEST(ToolSchema, JsonFlagAgainstStringSchema) {
  EXPECT_EQ(typed_argument("42", false, {"string"}), "\"42\"");
  EXPECT_EQ(typed_argument("null", false, {"string"}), "null");  // optional parameters stay null
  EXPECT_EQ(typed_argument("\"x\"", false, {"string"}), "\"x\"");
  EXPECT_EQ(typed_argument("42", false, {"integer"}), "42");
  EXPECT_EQ(typed_argument("42", false, {"number"}), "42");
  EXPECT_EQ(typed_argument("42", false, {"boolean"}), "42");  // no string allowed: left as written
  EXPECT_EQ(typed_argument("42", false, {}), "42");
  EXPECT_EQ(typed_argument("not json", false, {}), "\"not json\"");
  EXPECT_EQ(typed_argument("not json", false, {"integer"}), "\"not json\"");
}

TEST(ToolSchema, ParseCompletionAndStreamAgree) {
  const std::string text =
      "Checking." +
      block(invoke("f", param("s", false, "12") + param("i", true, "7") + param("x", true, " 1.5 ") + param("b", true, "false") +
                            param("o", true, "{\"k\": \"v\"}") + param("a", true, "[1, \"two\"]") + param("e", true, "3") +
                            param("u", true, "9") + param("c", true, "true") + param("free", true, "8")) +
            "\n" + invoke("g", param("s", false, "12"))) +
      kEosText;
  const ParsedCompletion untyped = parse_completion(text, ChatMode::Chat);
  EXPECT_EQ(ojson::parse(untyped.tool_calls[0]["function"]["arguments"].get<std::string>())["i"], "7");
  const ParsedCompletion p = parse_completion(text, ChatMode::Chat, ToolSchemas(tools()));
  ASSERT_EQ(p.tool_calls.size(), 2u);
  EXPECT_EQ(ojson::parse(p.tool_calls[0]["function"]["arguments"].get<std::string>()),
            ojson::parse(R"({"s": "12", "i": 7, "x": 1.5, "b": false, "o": {"k": "v"}, "a": [1, "two"], "e": 3,
                             "u": "9", "c": true, "free": "8"})"));
  EXPECT_EQ(p.tool_calls[1]["function"]["arguments"], "{\"s\": 12}");  // g has no schema

  // The stream gives the same, whatever the split, with the same events once joined.
  const auto run = [&](size_t piece) {
    CompletionStream s(ChatMode::Chat, tools());
    std::string args;
    for (size_t i = 0; i < text.size(); i += piece)
      for (const auto& e : s.feed(std::string_view(text).substr(i, piece)))
        if (e.kind == CompletionEvent::Kind::ToolCallArguments && e.index == 0) args += e.text;
    for (const auto& e : s.finish())
      if (e.kind == CompletionEvent::Kind::ToolCallArguments && e.index == 0) args += e.text;
    EXPECT_TRUE(s.result().well_formed) << piece;
    EXPECT_EQ(s.result().parsed.tool_calls, p.tool_calls) << piece;
    return args;
  };
  for (size_t piece : {1, 2, 3, 5, 8, 13, 64, 100000}) EXPECT_EQ(run(piece), p.tool_calls[0]["function"]["arguments"]) << piece;
}

TEST(ToolSchema, TypedCallRendersThroughItsDsml) {
  // The server answers with typed arguments; the client sends them back with the call's id, the
  // server attaches the exact DSML, and the prompt renders the sampled text byte for byte.
  const std::string dsml = invoke("f", param("i", true, "7") + param("s", false, "12"));
  const ojson call_back = {{"role", "assistant"},
                           {"content", ""},
                           {"tool_calls", ojson::array({{{"type", "function"},
                                                         {"id", "c1"},
                                                         {"dsml", dsml},
                                                         {"function", {{"name", "f"}, {"arguments", R"({"i": 7, "s": "12"})"}}}}})}};
  const ojson msgs = ojson::array({{{"role", "system"}, {"content", "S"}, {"tools", ojson::array({tools()[0]})}},
                                   {{"role", "user"}, {"content", "U"}},
                                   call_back,
                                   {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "ok"}}});
  ChatOptions o;
  o.mode = ChatMode::Chat;
  const std::string prompt = render_chat(msgs, o);
  EXPECT_NE(prompt.find(dsml), std::string::npos);
  // As written is accepted too; a value that is neither is refused, naming the field.
  ojson as_written = msgs;
  as_written[2]["tool_calls"][0]["function"]["arguments"] = R"({"i": "7", "s": 12})";
  EXPECT_EQ(render_chat(as_written, o), prompt);
  ojson wrong = msgs;
  wrong[2]["tool_calls"][0]["function"]["arguments"] = R"({"i": 8, "s": "12"})";
  try {
    render_chat(wrong, o);
    ADD_FAILURE() << "a dsml contradicting the arguments was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dsml"), std::string::npos) << e.what();
  }
  ojson missing = msgs;
  missing[2]["tool_calls"][0]["function"]["arguments"] = R"({"i": 7})";
  EXPECT_THROW(render_chat(missing, o), Error);
}
