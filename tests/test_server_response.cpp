// The server's answer formats fed recorded-style model outputs as the scheduler's events, split
// into pieces of every size: the OpenAI stream (SSE chunks) joins to the non-streamed body,
// tool calls come out as tool_calls / tool_use with typed arguments, no DSML markup ever
// reaches content or reasoning, malformed markup becomes plain content, and the exact DSML of
// each call is kept for the re-render.
#include <gtest/gtest.h>

#include <filesystem>

#include "server/response.h"
#include "test_util.h"

using namespace dsv4;
using namespace dsv4::server;
using dsv4::testing::tokenizer_dir;
using ojson = nlohmann::ordered_json;

namespace {

const std::string D = kDsmlText;
const std::string kCall = "<" + D + "invoke name=\"get_weather\">\n<" + D + "parameter name=\"city\" string=\"true\">Paris \"Nord\"</" + D +
                          "parameter>\n<" + D + "parameter name=\"days\" string=\"false\">3</" + D + "parameter>\n<" + D +
                          "parameter name=\"opts\" string=\"false\">{\"unit\": \"C\"}</" + D + "parameter>\n</" + D + "invoke>";
const std::string kToolText = "Let me check.\n\n<" + D + "tool_calls>\n" + kCall + "\n</" + D + "tool_calls>";

ojson weather_tools() {
  return ojson::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])");
}

class ServerResponse : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string t = tokenizer_dir() + "/tokenizer.json";
    if (std::filesystem::exists(t)) tok_ = new Tokenizer(Tokenizer::load(t));
  }
  static void TearDownTestSuite() { delete tok_; }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << "no tokenizer.json (scripts/test.sh fetches it)";
  }
  static Tokenizer* tok_;
};
Tokenizer* ServerResponse::tok_ = nullptr;

ParsedRequest request(Api api, ChatMode mode, const ojson& tools, bool stream) {
  ParsedRequest r;
  r.api = api;
  r.mode = mode;
  r.tools = tools;
  r.stream = stream;
  r.model = "m";
  r.gen.n = 1;
  r.gen.prompt = {1, 2, 3};
  return r;
}

// Runs `text` through a responder in pieces of `piece` bytes; returns the SSE text (stream) or
// the body (non-stream).
std::string run(Responder& resp, const std::string& text, size_t piece, const std::string& finish, bool stream) {
  std::string out = stream ? resp.start() : "";
  for (size_t i = 0; i < text.size(); i += piece) {
    Event e = Event::of(Event::Text);
    e.text = text.substr(i, piece);
    const std::string s = resp.event(e);
    if (stream) out += s;
  }
  Event f = Event::of(Event::Finish);
  f.finish_reason = finish;
  const std::string s = resp.event(f);
  Usage u;
  u.prompt_tokens = 3, u.completion_tokens = 7;
  if (stream) return out + s + resp.end(u);
  return resp.body(u);
}

// The data lines of an SSE text, parsed ("[DONE]" kept as a string).
std::vector<ojson> sse_data(const std::string& s) {
  std::vector<ojson> out;
  size_t at = 0;
  while ((at = s.find("data: ", at)) != std::string::npos) {
    const size_t end = s.find("\n\n", at);
    const std::string d = s.substr(at + 6, end - at - 6);
    out.push_back(d == "[DONE]" ? ojson(d) : ojson::parse(d));
    at = end;
  }
  return out;
}

struct Joined {
  std::string content, reasoning, finish;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  std::vector<std::string> ids;
};

Joined join_openai_stream(const std::string& sse) {
  Joined j;
  for (const ojson& c : sse_data(sse)) {
    if (c.is_string()) continue;
    for (const auto& ch : c["choices"]) {
      const ojson& d = ch["delta"];
      if (d.contains("content")) j.content += d["content"].get<std::string>();
      if (d.contains("reasoning_content")) j.reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const auto& t : d["tool_calls"]) {
          const size_t k = t["index"].get<size_t>();
          if (k >= j.calls.size()) j.calls.resize(k + 1), j.ids.resize(k + 1);
          if (t.contains("id")) j.ids[k] = t["id"];
          if (t["function"].contains("name")) j.calls[k].first += t["function"]["name"].get<std::string>();
          j.calls[k].second += t["function"]["arguments"].get<std::string>();
        }
      if (!ch["finish_reason"].is_null()) j.finish = ch["finish_reason"];
    }
  }
  return j;
}

}  // namespace

TEST_F(ServerResponse, OpenAiToolCallStreamJoinsToBody) {
  ToolCallStore store;
  const ParsedRequest r = request(Api::OpenAiChat, ChatMode::Chat, weather_tools(), true);
  auto body_resp = make_responder(r, *tok_, store);
  const ojson body = ojson::parse(run(*body_resp, kToolText, 1 << 20, "eos", false));
  const ojson& msg = body["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "Let me check.");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(ojson::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            ojson::parse(R"({"city": "Paris \"Nord\"", "days": 3, "opts": {"unit": "C"}})"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  // The exact DSML is kept under the call's id for the re-render.
  EXPECT_EQ(store.get(msg["tool_calls"][0]["id"]).value_or(""), kCall);

  for (size_t piece : {1, 2, 3, 7, 64}) {
    auto resp = make_responder(r, *tok_, store);
    const std::string sse = run(*resp, kToolText, piece, "eos", true);
    const Joined j = join_openai_stream(sse);
    EXPECT_EQ(j.content, "Let me check.") << piece;
    ASSERT_EQ(j.calls.size(), 1u) << piece;
    EXPECT_EQ(j.calls[0].first, "get_weather");
    EXPECT_EQ(j.calls[0].second, msg["tool_calls"][0]["function"]["arguments"]) << piece;
    EXPECT_EQ(j.finish, "tool_calls");
    EXPECT_EQ(sse_data(sse).back(), "[DONE]");
    EXPECT_EQ(sse.find("DSML"), std::string::npos) << "markup leaked at piece " << piece;
  }
}

TEST_F(ServerResponse, ArgumentsTypedBySchema) {
  // "days" written as a string, "city" as a bare number: both answered in the schema's type, in
  // the body and in the stream, and the DSML kept as sampled.
  const std::string call = "<" + D + "invoke name=\"get_weather\">\n<" + D + "parameter name=\"city\" string=\"false\">75001</" + D +
                           "parameter>\n<" + D + "parameter name=\"days\" string=\"true\">3</" + D + "parameter>\n</" + D + "invoke>";
  const std::string text = "\n\n<" + D + "tool_calls>\n" + call + "\n</" + D + "tool_calls>";
  const ojson tools = ojson::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
    "properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}])");
  ToolCallStore store;
  const ojson want = ojson::parse(R"({"city": "75001", "days": 3})");
  for (Api api : {Api::OpenAiChat, Api::Anthropic}) {
    const ParsedRequest r = request(api, ChatMode::Chat, tools, true);
    auto a = make_responder(r, *tok_, store);
    const ojson body = ojson::parse(run(*a, text, 1 << 20, "eos", false));
    if (api == Api::Anthropic) {
      EXPECT_EQ(body["content"][0]["input"], want);
    } else {
      const ojson& tc = body["choices"][0]["message"]["tool_calls"][0];
      EXPECT_EQ(ojson::parse(tc["function"]["arguments"].get<std::string>()), want);
      EXPECT_EQ(store.get(tc["id"]).value_or(""), call);
      for (size_t piece : {1, 4, 9}) {
        auto b = make_responder(r, *tok_, store);
        const Joined j = join_openai_stream(run(*b, text, piece, "eos", true));
        ASSERT_EQ(j.calls.size(), 1u);
        EXPECT_EQ(ojson::parse(j.calls[0].second), want) << piece;
      }
    }
  }
}

TEST_F(ServerResponse, ThinkingSplitsReasoningAndContent) {
  ToolCallStore store;
  const ParsedRequest r = request(Api::OpenAiChat, ChatMode::Thinking, ojson::array(), true);
  const std::string text = "I should greet.</think>Hello!";
  auto a = make_responder(r, *tok_, store);
  const ojson body = ojson::parse(run(*a, text, 5, "eos", false));
  EXPECT_EQ(body["choices"][0]["message"]["reasoning_content"], "I should greet.");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello!");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  auto b = make_responder(r, *tok_, store);
  const Joined j = join_openai_stream(run(*b, text, 1, "eos", true));
  EXPECT_EQ(j.reasoning, "I should greet.");
  EXPECT_EQ(j.content, "Hello!");
}

TEST_F(ServerResponse, MalformedMarkupIsPlainContent) {
  ToolCallStore store;
  const ParsedRequest r = request(Api::OpenAiChat, ChatMode::Chat, weather_tools(), true);
  // An invoke of an unknown tool, and a block that never closes its tag.
  for (const std::string& text : {"A\n\n<" + D + "tool_calls>\n<" + D + "invoke name=\"nope\">\n</" + D + "invoke>\n</" + D + "tool_calls>",
                                 "B\n\n<" + D + "tool_calls>\n<" + D + "invo"}) {
    auto a = make_responder(r, *tok_, store);
    const ojson body = ojson::parse(run(*a, text, 1 << 20, "length", false));
    EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls")) << text;
    EXPECT_EQ(body["choices"][0]["message"]["content"], text);
    EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
    auto b = make_responder(r, *tok_, store);
    const Joined j = join_openai_stream(run(*b, text, 1, "length", true));
    EXPECT_EQ(j.content, text);
    EXPECT_TRUE(j.calls.empty());
  }
}

TEST_F(ServerResponse, AnthropicToolUseBlocks) {
  ToolCallStore store;
  const ParsedRequest r = request(Api::Anthropic, ChatMode::Chat, weather_tools(), true);
  auto a = make_responder(r, *tok_, store);
  const ojson body = ojson::parse(run(*a, kToolText, 3, "eos", false));
  ASSERT_EQ(body["content"].size(), 2u);
  EXPECT_EQ(body["content"][0]["type"], "text");
  EXPECT_EQ(body["content"][0]["text"], "Let me check.");
  EXPECT_EQ(body["content"][1]["type"], "tool_use");
  EXPECT_EQ(body["content"][1]["name"], "get_weather");
  EXPECT_EQ(body["content"][1]["input"]["days"], 3);
  EXPECT_EQ(body["stop_reason"], "tool_use");

  // The stream: text deltas and input_json_delta fragments join to the same blocks.
  auto b = make_responder(r, *tok_, store);
  const std::string sse = run(*b, kToolText, 1, "eos", true);
  std::string text, json;
  std::string stop;
  for (const ojson& e : sse_data(sse)) {
    if (e["type"] == "content_block_delta" && e["delta"]["type"] == "text_delta") text += e["delta"]["text"].get<std::string>();
    if (e["type"] == "content_block_delta" && e["delta"]["type"] == "input_json_delta")
      json += e["delta"]["partial_json"].get<std::string>();
    if (e["type"] == "message_delta") stop = e["delta"]["stop_reason"];
  }
  EXPECT_EQ(text, "Let me check.");
  EXPECT_EQ(ojson::parse(json), body["content"][1]["input"]);
  EXPECT_EQ(stop, "tool_use");
  EXPECT_EQ(sse.find("DSML"), std::string::npos);
  EXPECT_EQ(sse.find("event: message_stop"), sse.rfind("event: "));
}

TEST_F(ServerResponse, ParallelCallsOffAnswersTheFirstCall) {
  // parallel_tool_calls: false (disable_parallel_tool_use): a second call is dropped, in the
  // body and in the stream, on every API; the first keeps its id and DSML.
  const std::string two = "\n\n<" + D + "tool_calls>\n" + kCall + "\n" + kCall + "\n</" + D + "tool_calls>";
  for (Api api : {Api::OpenAiChat, Api::Anthropic, Api::OpenAiResponses}) {
    ToolCallStore store;
    ParsedRequest r = request(api, ChatMode::Chat, weather_tools(), true);
    r.single_tool_call = true;
    auto a = make_responder(r, *tok_, store);
    const std::string body = run(*a, two, 1 << 20, "eos", false);
    auto b = make_responder(r, *tok_, store);
    const std::string sse = run(*b, two, 5, "eos", true);
    const ojson j = ojson::parse(body);
    size_t calls = 0;
    if (api == Api::OpenAiChat) calls = j["choices"][0]["message"]["tool_calls"].size();
    for (const auto& x : j.value("content", ojson::array())) calls += x["type"] == "tool_use";
    for (const auto& x : j.value("output", ojson::array())) calls += x["type"] == "function_call";
    EXPECT_EQ(calls, 1u) << body;
    EXPECT_EQ(sse.find("\"index\":1"), std::string::npos) << "a second call streamed";
    EXPECT_EQ(sse.find("\"output_index\":1"), std::string::npos) << "a second call streamed";
    EXPECT_EQ(sse.find("DSML"), std::string::npos);
    r.single_tool_call = false;
    auto c = make_responder(r, *tok_, store);
    EXPECT_NE(run(*c, two, 1 << 20, "eos", false), body) << "two calls without the flag";
    // As the scheduler ends such an answer: right after the first call's "</｜DSML｜invoke>",
    // finished "tool_call". The same one call, finished as a call, nothing else said.
    r.single_tool_call = true;
    const std::string first = "\n\n<" + D + "tool_calls>\n" + kCall;
    for (bool stream : {false, true}) {
      auto d = make_responder(r, *tok_, store);
      const std::string out = run(*d, first, stream ? 7 : 1 << 20, "tool_call", stream);
      EXPECT_EQ(out.find("DSML"), std::string::npos) << out;
      EXPECT_NE(out.find("get_weather"), std::string::npos) << out;
      if (stream) continue;
      const ojson k = ojson::parse(out);
      if (api == Api::OpenAiChat) {
        EXPECT_EQ(k["choices"][0]["finish_reason"], "tool_calls") << out;
        EXPECT_EQ(k["choices"][0]["message"]["tool_calls"].size(), 1u) << out;
        EXPECT_EQ(k["choices"][0]["message"]["content"], j["choices"][0]["message"]["content"]) << out;
      } else if (api == Api::Anthropic) {
        EXPECT_EQ(k["stop_reason"], "tool_use") << out;
        EXPECT_EQ(k["content"].size(), 1u) << out;
      } else {
        EXPECT_EQ(k["status"], "completed") << out;
        EXPECT_EQ(k["output"].size(), 1u) << out;
      }
    }
  }
}

TEST_F(ServerResponse, AnthropicOmittedThinkingGoesInTheSignature) {
  // thinking.display "omitted": the block's text is empty, no thinking_delta is sent, and the
  // signature (a signature_delta before the block stops) carries the reasoning.
  ToolCallStore store;
  ParsedRequest r = request(Api::Anthropic, ChatMode::Thinking, weather_tools(), true);
  r.reasoning_in_signature = true;
  const std::string text = std::string("Think \"hard\" 東京.") + kThinkEndText + "Answer.";
  auto a = make_responder(r, *tok_, store);
  const ojson body = ojson::parse(run(*a, text, 1 << 20, "eos", false));
  ASSERT_EQ(body["content"].size(), 2u);
  EXPECT_EQ(body["content"][0]["thinking"], "");
  EXPECT_EQ(body["content"][0]["signature"], std::string(kReasoningSignature) + "Think \"hard\" 東京.");
  EXPECT_EQ(body["content"][1]["text"], "Answer.");
  for (size_t piece : {1, 4}) {
    auto b = make_responder(r, *tok_, store);
    const std::string sse = run(*b, text, piece, "eos", true);
    std::string sig;
    for (const ojson& e : sse_data(sse)) {
      EXPECT_FALSE(e["type"] == "content_block_delta" && e["delta"]["type"] == "thinking_delta") << e.dump();
      if (e["type"] == "content_block_delta" && e["delta"]["type"] == "signature_delta") {
        EXPECT_EQ(e["index"], 0);
        sig += e["delta"]["signature"].get<std::string>();
      }
    }
    EXPECT_EQ(sig, body["content"][0]["signature"]) << piece;
    EXPECT_EQ(sse.find("hard"), sse.rfind("hard")) << "the text only in the signature";
  }
}

TEST_F(ServerResponse, ForcedCallContinuesThePrefix) {
  // tool_choice names a function: the prompt ended with the block and invoke opener, so the
  // model's text starts at the parameters.
  ToolCallStore store;
  ParsedRequest r = request(Api::OpenAiChat, ChatMode::Chat, weather_tools(), false);
  r.forced_prefix = "\n\n<" + D + "tool_calls>\n<" + D + "invoke name=\"get_weather\">\n";
  const std::string rest = kToolText.substr(kToolText.find("<" + D + "parameter"));
  auto a = make_responder(r, *tok_, store);
  const ojson body = ojson::parse(run(*a, rest, 4, "eos", false));
  const ojson& msg = body["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(ojson::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>())["city"], "Paris \"Nord\"");
}
