// parse_request (src/server/request.*) without a model: the real tokenizer and ModelFacts. Each
// bad field is a 400 naming it; defaults; the thinking switches; tool_choice forcing a call in
// chat mode and refused in thinking mode; Anthropic tool_use / tool_result blocks rendering the
// same prompt as the OpenAI form of the conversation; token-id prompts of /v1/completions.
// Tests skip when the tokenizer has not been fetched (scripts/fetch-tokenizer.sh).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "server/request.h"
#include "server/response.h"
#include "text/chat.h"
#include "text/json_grammar.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "test_util.h"

using namespace dsv4;
using namespace dsv4::server;
using dsv4::testing::real_tokenizer;
using dsv4::testing::tokenizer_dir;

namespace {

constexpr int64_t kContext = 1024;

class ServerRequest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = real_tokenizer();
    if (!tok_) GTEST_SKIP() << "no " << tokenizer_dir() << "/tokenizer.json (scripts/fetch-tokenizer.sh)";
    lim_.max_n = 4;
    lim_.default_max_tokens = 64;
  }
  ModelFacts facts(int64_t context = kContext) const { return {*tok_, context, tok_->vocab_size()}; }
  ParsedRequest parse(Api api, const std::string& body, int64_t context = kContext) const {
    return parse_request(api, body, facts(context), lim_, nullptr);
  }
  // The field a refused body names ("" if accepted); any refusal must be a 400 whose message
  // quotes the field.
  std::string refused(Api api, const std::string& body, int64_t context = kContext) const {
    try {
      (void)parse(api, body, context);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << body;
      EXPECT_EQ(e.type, "invalid_request_error") << body;
      if (!e.param.empty()) {
        EXPECT_NE(std::string(e.what()).find("'" + e.param + "'"), std::string::npos) << e.what();
      }
      return e.param.empty() ? "(no param: " + std::string(e.what()) + ")" : e.param;
    }
    return "";
  }

  const Tokenizer* tok_ = nullptr;
  RequestLimits lim_;
};

const std::string DSML = kDsmlText;

std::string chat_body(const std::string& extra) {
  return R"({"messages":[{"role":"user","content":"Hi"}])" + (extra.empty() ? "" : "," + extra) + "}";
}
std::string completion_body(const std::string& extra) {
  return R"({"prompt":"Hello")" + (extra.empty() ? "" : "," + extra) + "}";
}
std::string anthropic_body(const std::string& extra) {
  return R"({"max_tokens":16,"messages":[{"role":"user","content":"Hi"}])" + (extra.empty() ? "" : "," + extra) + "}";
}

const std::string kTool = R"({"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}})";
const std::string kAnthropicTool = R"({"name":"get_weather","input_schema":{"type":"object"}})";

struct Bad {
  std::string extra, param;
};

TEST_F(ServerRequest, ChatBadFieldsName) {
  const std::vector<Bad> cases = {
      {R"("temperature":"hot")", "temperature"},
      {R"("temperature":2.5)", "temperature"},
      {R"("modalities":["text","audio"])", "modalities"},
      {R"("audio":{"voice":"alloy","format":"wav"})", "audio"},
      {R"("web_search_options":{})", "web_search_options"},
      {R"("top_p":0)", "top_p"},
      {R"("top_k":-2)", "top_k"},
      {R"("min_p":1)", "min_p"},
      {R"("presence_penalty":3)", "presence_penalty"},
      {R"("frequency_penalty":-2.1)", "frequency_penalty"},
      {R"("repetition_penalty":0)", "repetition_penalty"},
      {R"("seed":"x")", "seed"},
      {R"("seed":18446744073709551615)", "seed"},
      {R"("n":0)", "n"},
      {R"("n":5)", "n"},  // past RequestLimits::max_n
      {R"("stop":[1])", "stop"},
      {R"("stop":"")", "stop"},
      {R"("stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"])", "stop"},
      {R"("stream":"true")", "stream"},
      {R"("stream_options":1)", "stream_options"},
      {R"("stream_options":{"include_usage":1})", "stream_options.include_usage"},
      {R"("logprobs":"yes")", "logprobs"},
      {R"("top_logprobs":3)", "top_logprobs"},  // without logprobs
      {R"("logprobs":true,"top_logprobs":21)", "top_logprobs"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string"}}})",
       "response_format.json_schema.schema"},
      {R"("response_format":{"type":"xml"})", "response_format.type"},
      {R"("response_format":{"type":1})", "response_format.type"},
      {R"("response_format":[])", "response_format"},
      {R"("logit_bias":[1])", "logit_bias"},
      {R"("logit_bias":{"abc":1})", "logit_bias"},
      {R"("logit_bias":{"-1":1})", "logit_bias"},
      {R"("logit_bias":{"999999999":1})", "logit_bias"},  // past the vocabulary
      {R"("logit_bias":{"4":101})", "logit_bias.4"},
      {R"("logit_bias":{"4":"up"})", "logit_bias.4"},
      {R"("thinking":"on")", "thinking"},
      {R"("thinking":{"type":"sometimes"})", "thinking.type"},
      {R"("chat_template_kwargs":{"thinking":1})", "chat_template_kwargs.thinking"},
      {R"("reasoning_effort":"extreme")", "reasoning_effort"},
      {R"("tools":{})", "tools"},
      {R"("tools":[{"type":"retrieval"}])", "tools[0].type"},
      {R"("tools":[{"type":2}])", "tools[0].type"},
      {R"("tools":[{"type":"function"}])", "tools[0].function"},
      {R"("tools":[{"type":"function","function":{"name":""}}])", "tools[0].function.name"},
      {R"("tool_choice":"sometimes")", "tool_choice"},
      {R"("tool_choice":3)", "tool_choice"},
      {R"("tool_choice":"required","thinking":{"type":"disabled"})", "tool_choice"},  // no tools
      {"\"tools\":[" + kTool + R"(],"tool_choice":{"type":"function","function":{"name":"other"}},"thinking":{"type":"disabled"})",
       "tool_choice.function.name"},
      {R"("max_tokens":0)", "max_tokens"},
      {R"("max_tokens":1024)", "max_tokens"},  // the prompt leaves less than that
      {R"("max_completion_tokens":2000)", "max_completion_tokens"},
  };
  for (const auto& c : cases) EXPECT_EQ(refused(Api::OpenAiChat, chat_body(c.extra)), c.param) << c.extra;
}

TEST_F(ServerRequest, ChatBadMessagesName) {
  const std::vector<Bad> cases = {
      {R"({})", "messages"},
      {R"({"messages":"hi"})", "messages"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":[1]})", "messages[0]"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"robot","content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content[0].type"},
      {R"({"messages":[{"role":"user","content":[{"type":"text","text":1}]}]})", "messages[0].content[0].text"},
      {R"({"messages":[{"role":"user","content":"x"},{"role":"assistant"}]})", "messages[1].content"},
      {R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y","reasoning_content":2}]})",
       "messages[1].reasoning_content"},
      {R"({"messages":[{"role":"user","content":"x"},{"role":"tool","content":"r","tool_call_id":5}]})",
       "messages[1].tool_call_id"},
  };
  for (const auto& c : cases) EXPECT_EQ(refused(Api::OpenAiChat, c.extra), c.param) << c.extra;
  // Not an object, not JSON, not UTF-8: a 400 without a field.
  for (const std::string body : {"[1]", "{\"messages\":", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xC3\x28\"}]}"})
    EXPECT_NE(refused(Api::OpenAiChat, body).find("(no param"), std::string::npos) << body;
}

TEST_F(ServerRequest, CompletionBadFieldsName) {
  const std::string V = std::to_string(tok_->vocab_size());
  const std::vector<Bad> cases = {
      {R"({})", "prompt"},
      {R"({"prompt":5})", "prompt"},
      {R"({"prompt":["a","b"]})", "prompt"},
      {R"({"prompt":""})", "prompt"},
      {R"({"prompt":[1,"a"]})", "prompt[1]"},
      {R"({"prompt":[-1]})", "prompt[0]"},
      {R"({"prompt":[1,2,)" + V + "]}", "prompt[2]"},
      {completion_body(R"("logprobs":21)"), "logprobs"},
      {completion_body(R"("logprobs":true)"), "logprobs"},  // an integer in the legacy API
      {completion_body(R"("echo":1)"), "echo"},
      {R"({"prompt":[1,2],"suffix":"x"})", "suffix"},  // fill-in-the-middle needs text
      {completion_body(R"("suffix":3)"), "suffix"},
      {completion_body(R"("max_tokens":0)"), "max_tokens"},
      {completion_body(R"("max_tokens":1024)"), "max_tokens"},
      {completion_body(R"("n":5)"), "n"},
  };
  for (const auto& c : cases) EXPECT_EQ(refused(Api::OpenAiCompletion, c.extra), c.param) << c.extra;
}

TEST_F(ServerRequest, AnthropicBadFieldsName) {
  const std::vector<Bad> cases = {
      {R"({"messages":[{"role":"user","content":"Hi"}]})", "max_tokens"},
      {anthropic_body(R"("temperature":1.5)"), "temperature"},  // Anthropic's range is [0, 1]
      {anthropic_body(R"("top_k":-1)"), "top_k"},
      {anthropic_body(R"("stop_sequences":[""])"), "stop_sequences"},
      {anthropic_body(R"("system":5)"), "system"},
      {anthropic_body(R"("thinking":{"type":"maybe"})"), "thinking.type"},
      {anthropic_body(R"("thinking":{"type":"adaptive","display":"full"})"), "thinking.display"},
      {anthropic_body(R"("output_config":{"effort":"extreme"})"), "output_config.effort"},
      {anthropic_body(R"("mcp_servers":[{"type":"url","url":"https://x","name":"x"}])"), "mcp_servers"},
      {anthropic_body(R"("tools":[{"type":"web_search_20250305","name":"web_search","max_uses":3}])"), "tools[0].type"},
      {anthropic_body(R"("tools":[{"description":"no name"}])"), "tools[0].name"},
      {anthropic_body(R"("output_config":3)"), "output_config"},
      {anthropic_body(R"("output_config":{"format":{"type":"json_object"}})"), "output_config.format.type"},
      {anthropic_body(R"("output_config":{"format":{"type":"json_schema"}})"), "output_config.format.schema"},
      {anthropic_body(R"("output_format":{"type":"json_schema","schema":{"type":"object","minProperties":1}})"),
       "output_format.schema.minProperties"},
      {anthropic_body(R"("tool_choice":"auto")"), "tool_choice"},
      {anthropic_body(R"("tool_choice":{"type":"sometimes"})"), "tool_choice.type"},
      {anthropic_body(R"("tool_choice":{"type":"any"})"), "tool_choice"},  // no tools
      {anthropic_body("\"tools\":[" + kAnthropicTool + R"(],"tool_choice":{"type":"tool","name":"other"})"),
       "tool_choice.name"},
      {anthropic_body("\"tools\":[" + kAnthropicTool + R"(],"tool_choice":{"type":"tool","name":3})"), "tool_choice.name"},
      {R"({"max_tokens":16})", "messages"},
      {R"({"max_tokens":16,"messages":[{"role":"system","content":"x"}]})", "messages[0].role"},
      {R"({"max_tokens":16,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"},{"role":"system","content":"z"}]})",
       "messages[2].role"},  // a mid-conversation system message follows a user turn
      {R"({"max_tokens":16,"messages":[{"role":"user","content":"x"},{"role":"system","content":[{"type":"image"}]}]})",
       "messages[1].content[0].type"},
      {R"({"max_tokens":16,"messages":[{"role":1,"content":"x"}]})", "messages[0].role"},
      {R"({"max_tokens":16,"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"max_tokens":16,"messages":[{"role":"user","content":[{"type":"image"}]}]})", "messages[0].content[0].type"},
      {R"({"max_tokens":16,"messages":[{"role":"user","content":[{"type":"text","text":1}]}]})",
       "messages[0].content[0].text"},
      // tool_use belongs to the assistant, tool_result to the user.
      {R"({"max_tokens":16,"messages":[{"role":"user","content":[{"type":"tool_use","id":"t","name":"f"}]}]})",
       "messages[0].content[0].type"},
      {R"({"max_tokens":16,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","name":"f"}]}]})",
       "messages[1].content[0]"},
      {R"({"max_tokens":16,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":[1]}]}]})",
       "messages[1].content[0].input"},
      {R"({"max_tokens":16,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"thinking","thinking":5}]}]})",
       "messages[1].content[0].thinking"},
  };
  for (const auto& c : cases) EXPECT_EQ(refused(Api::Anthropic, c.extra), c.param) << c.extra;
}

TEST_F(ServerRequest, ChatDefaults) {
  const ParsedRequest r = parse(Api::OpenAiChat, chat_body(""));
  EXPECT_EQ(r.api, Api::OpenAiChat);
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.mode, ChatMode::Thinking);  // DeepSeek's default
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(r.gen.top_logprobs, -1);
  EXPECT_EQ(r.gen.n, 1);
  EXPECT_TRUE(r.gen.stop.empty());
  EXPECT_EQ(r.gen.sampling.temperature, 1.0f);
  EXPECT_EQ(r.gen.sampling.top_p, 1.0f);
  EXPECT_EQ(r.gen.sampling.top_k, 0);
  EXPECT_TRUE(r.tools.empty());
  EXPECT_TRUE(r.forced_prefix.empty());
  EXPECT_EQ(r.prompt_text, std::string(kBosText) + kUserText + "Hi" + kAssistantText + kThinkStartText);
  EXPECT_EQ(r.gen.prompt, tok_->encode(r.prompt_text));
  EXPECT_EQ(r.gen.max_tokens, lim_.default_max_tokens);
  // Without a default cap, the answer may fill the context.
  RequestLimits big;
  big.default_max_tokens = 1 << 20;
  const ParsedRequest b = parse_request(Api::OpenAiChat, chat_body(""), facts(), big);
  EXPECT_EQ(b.gen.max_tokens, kContext - static_cast<int64_t>(b.gen.prompt.size()));
}

TEST_F(ServerRequest, ChatFieldsAreRead) {
  const ParsedRequest r =
      parse(Api::OpenAiChat, chat_body(R"("model":"m","temperature":0.5,"top_p":0.9,"top_k":-1,"seed":-1,"n":3,)"
                                       R"("stop":["x","y"],"logprobs":true,"top_logprobs":4,"stream":true,)"
                                       R"("stream_options":{"include_usage":true},"max_completion_tokens":7)"));
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.gen.sampling.temperature, 0.5f);
  EXPECT_EQ(r.gen.sampling.top_p, 0.9f);
  EXPECT_EQ(r.gen.sampling.top_k, 0);  // -1 = off
  EXPECT_EQ(r.gen.sampling.seed, ~0ull);
  EXPECT_EQ(r.gen.n, 3);
  EXPECT_EQ(r.gen.stop, (std::vector<std::string>{"x", "y"}));
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.gen.top_logprobs, 4);
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(r.gen.max_tokens, 7);
  // max_completion_tokens wins over max_tokens.
  EXPECT_EQ(parse(Api::OpenAiChat, chat_body(R"("max_tokens":5,"max_completion_tokens":9)")).gen.max_tokens, 9);
  EXPECT_EQ(parse(Api::OpenAiChat, chat_body(R"("max_tokens":5)")).gen.max_tokens, 5);
  const ParsedRequest b = parse(Api::OpenAiChat, chat_body(R"("logit_bias":{"4":100,"95":-2.5})"));
  EXPECT_EQ(b.gen.logit_bias, (std::vector<std::pair<int32_t, float>>{{4, 100.0f}, {95, -2.5f}}));
  EXPECT_EQ(parse(Api::OpenAiCompletion, R"({"prompt":"x","logit_bias":{"7":1}})").gen.logit_bias.size(), 1u);
  const ParsedRequest c = parse(Api::OpenAiCompletion, R"({"prompt":"x","response_format":{"type":"json_object"}})");
  EXPECT_TRUE(c.gen.json);
  EXPECT_FALSE(c.gen.reasoning_first);
  EXPECT_EQ(c.prompt_text, "x");
  // null is "absent".
  EXPECT_EQ(parse(Api::OpenAiChat, chat_body(R"("temperature":null,"n":null)")).gen.n, 1);
}

TEST_F(ServerRequest, ResponseFormatJsonObject) {
  const ParsedRequest plain = parse(Api::OpenAiChat, chat_body(R"("response_format":{"type":"text"})"));
  EXPECT_FALSE(plain.gen.json);
  const ParsedRequest think = parse(Api::OpenAiChat, chat_body(R"("response_format":{"type":"json_object"})"));
  EXPECT_EQ(think.gen.json, JsonGrammar::any_object());
  EXPECT_TRUE(think.gen.reasoning_first);
  // The prompt is the one without response_format (the client asks for JSON in its messages,
  // as with DeepSeek's API): the prefix cache is shared with plain requests.
  EXPECT_EQ(think.prompt_text, plain.prompt_text);
  const ParsedRequest chat =
      parse(Api::OpenAiChat, chat_body(R"("response_format":{"type":"json_object"},"thinking":{"type":"disabled"})"));
  EXPECT_TRUE(chat.gen.json);
  EXPECT_FALSE(chat.gen.reasoning_first);
  // tool_choice none leaves the tools out: the answer is the object.
  const ParsedRequest none =
      parse(Api::OpenAiChat, chat_body("\"tools\":[" + kTool + R"(],"tool_choice":"none","response_format":{"type":"json_object"})"));
  EXPECT_TRUE(none.gen.json);
  EXPECT_FALSE(none.gen.json_or_tool_call);
  // Beside tools the answer is the object or a tool call; a forced call is the answer, and the
  // format is for a later one.
  const ParsedRequest both = parse(Api::OpenAiChat, chat_body("\"tools\":[" + kTool + R"(],"response_format":{"type":"json_object"})"));
  EXPECT_TRUE(both.gen.json);
  EXPECT_TRUE(both.gen.json_or_tool_call);
  const ParsedRequest forced = parse(Api::OpenAiChat, chat_body("\"tools\":[" + kTool +
                                                                R"(],"tool_choice":"required","thinking":{"type":"disabled"},"response_format":{"type":"json_object"})"));
  EXPECT_FALSE(forced.gen.json);
  const ParsedRequest anthropic = parse(
      Api::Anthropic, anthropic_body("\"tools\":[" + kAnthropicTool + R"(],"output_format":{"type":"json_schema","schema":{"type":"object"}})"));
  EXPECT_TRUE(anthropic.gen.json);
  EXPECT_TRUE(anthropic.gen.json_or_tool_call);
}

TEST_F(ServerRequest, ResponseFormatJsonSchema) {
  const std::string schema = R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false})";
  const ParsedRequest r = parse(
      Api::OpenAiChat, chat_body(R"("response_format":{"type":"json_schema","json_schema":{"name":"place","schema":)" + schema + "}}"));
  ASSERT_TRUE(r.gen.json);
  EXPECT_NE(r.gen.json, JsonGrammar::any_object());
  // The schema is shown to the model in the system message's Response Format section (a system
  // message is put first when there is none).
  EXPECT_NE(r.prompt_text.find("## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{\"type\": "
                               "\"object\", \"properties\": {\"city\""),
            std::string::npos)
      << r.prompt_text;
  EXPECT_EQ(r.prompt_text.rfind("<｜begin▁of▁sentence｜>\n\n## Response Format:", 0), 0u) << r.prompt_text;
  // What the grammar cannot enforce is a 400 naming the keyword.
  const std::vector<Bad> cases = {
      {R"({"type":"json_schema"})", "response_format.json_schema"},
      {R"({"type":"json_schema","json_schema":{"name":"x"}})", "response_format.json_schema.schema"},
      {R"({"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"d":{"type":"string","pattern":"a\\1"}}}}})",
       "response_format.json_schema.schema.properties.d.pattern"},
      {R"({"type":"json_schema","json_schema":{"name":"x","schema":{"type":"array"}}})", "response_format.json_schema.schema"},
      {R"({"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"n":{"type":"integer","minimum":"0"}}}}})",
       "response_format.json_schema.schema.properties.n.minimum"},
  };
  for (const auto& c : cases) EXPECT_EQ(refused(Api::OpenAiChat, chat_body(R"("response_format":)" + c.extra)), c.param) << c.extra;
}

TEST_F(ServerRequest, ThinkingSwitches) {
  const std::string end = std::string(kAssistantText) + kThinkEndText;
  const auto mode = [&](Api api, const std::string& body) { return parse(api, body).mode; };
  EXPECT_EQ(mode(Api::OpenAiChat, chat_body(R"("thinking":{"type":"enabled"})")), ChatMode::Thinking);
  EXPECT_EQ(mode(Api::OpenAiChat, chat_body(R"("thinking":{"type":"disabled"})")), ChatMode::Chat);
  EXPECT_EQ(mode(Api::OpenAiChat, chat_body(R"("chat_template_kwargs":{"thinking":false})")), ChatMode::Chat);
  // chat_template_kwargs is read last and wins.
  EXPECT_EQ(mode(Api::OpenAiChat, chat_body(R"("thinking":{"type":"disabled"},"chat_template_kwargs":{"thinking":true})")),
            ChatMode::Thinking);
  const ParsedRequest off = parse(Api::OpenAiChat, chat_body(R"("thinking":{"type":"disabled"})"));
  EXPECT_EQ(off.prompt_text.substr(off.prompt_text.size() - end.size()), end);
  // Whether the state after the answer starts the next prompt (then --cache-dir keeps it): the
  // encoding drops earlier reasoning in thinking mode unless the conversation has tools.
  EXPECT_TRUE(off.gen.answer_reused);
  EXPECT_FALSE(parse(Api::OpenAiChat, chat_body("")).gen.answer_reused);
  EXPECT_TRUE(parse(Api::OpenAiChat, chat_body("\"tools\":[" + kTool + "]")).gen.answer_reused);
  // Anthropic: off unless enabled.
  EXPECT_EQ(mode(Api::Anthropic, anthropic_body("")), ChatMode::Chat);
  EXPECT_EQ(mode(Api::Anthropic, anthropic_body(R"("thinking":{"type":"enabled","budget_tokens":1024})")), ChatMode::Thinking);
  EXPECT_EQ(mode(Api::Anthropic, anthropic_body(R"("thinking":{"type":"disabled"})")), ChatMode::Chat);
  // Adaptive and between-tools thinking are V4's thinking mode too; display "omitted" puts the
  // reasoning in the signature, and such a block sent back renders as its text would.
  EXPECT_EQ(mode(Api::Anthropic, anthropic_body(R"("thinking":{"type":"adaptive"})")), ChatMode::Thinking);
  EXPECT_EQ(mode(Api::Anthropic, anthropic_body(R"("thinking":{"type":"between_tools"})")), ChatMode::Thinking);
  EXPECT_TRUE(parse(Api::Anthropic, anthropic_body(R"("thinking":{"type":"adaptive","display":"omitted"})")).reasoning_in_signature);
  EXPECT_FALSE(parse(Api::Anthropic, anthropic_body(R"("thinking":{"type":"adaptive"})")).reasoning_in_signature);
  const auto turn = [&](const std::string& thinking_block) {
    return parse(Api::Anthropic, R"({"max_tokens":16,"thinking":{"type":"adaptive"},"tools":[)" + kAnthropicTool +
                                     R"(],"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":[)" +
                                     thinking_block + R"(,{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Oslo"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny"}]}]})")
        .prompt_text;
  };
  const std::string shown = turn(R"({"type":"thinking","thinking":"Look it up.","signature":""})");
  EXPECT_NE(shown.find("Look it up."), std::string::npos);
  EXPECT_EQ(turn(R"({"type":"thinking","thinking":"","signature":"dsv4-reasoning:Look it up."})"), shown);
  EXPECT_NE(turn(R"({"type":"thinking","thinking":"","signature":"EqQBCkYIBx"})"), shown);  // another server's signature
  // output_config.effort: max (and xhigh) render the maximum effort, the others the default.
  const std::string plain = parse(Api::Anthropic, anthropic_body(R"("thinking":{"type":"adaptive"})")).prompt_text;
  EXPECT_EQ(parse(Api::Anthropic, anthropic_body(R"("thinking":{"type":"adaptive"},"output_config":{"effort":"low"})")).prompt_text, plain);
  EXPECT_NE(parse(Api::Anthropic, anthropic_body(R"("thinking":{"type":"adaptive"},"output_config":{"effort":"max"})")).prompt_text, plain);
  // reasoning_effort: low and medium map to high; max renders differently.
  const std::string high = parse(Api::OpenAiChat, chat_body(R"("reasoning_effort":"high")")).prompt_text;
  EXPECT_EQ(parse(Api::OpenAiChat, chat_body(R"("reasoning_effort":"low")")).prompt_text, high);
  EXPECT_EQ(parse(Api::OpenAiChat, chat_body(R"("reasoning_effort":"medium")")).prompt_text, high);
  EXPECT_NE(parse(Api::OpenAiChat, chat_body(R"("reasoning_effort":"max")")).prompt_text,
            parse(Api::OpenAiChat, chat_body("")).prompt_text);
}

TEST_F(ServerRequest, ParallelToolCallsSwitch) {
  const std::string tools = "\"tools\":[" + kTool + "]";
  EXPECT_FALSE(parse(Api::OpenAiChat, chat_body(tools)).single_tool_call);
  EXPECT_TRUE(parse(Api::OpenAiChat, chat_body(tools + R"(,"parallel_tool_calls":false)")).single_tool_call);
  EXPECT_TRUE(parse(Api::Anthropic, anthropic_body("\"tools\":[" + kAnthropicTool +
                                                   R"(],"tool_choice":{"type":"auto","disable_parallel_tool_use":true})"))
                  .single_tool_call);
  // (an Anthropic tool may say type "custom")
  EXPECT_EQ(parse(Api::Anthropic, anthropic_body(R"("tools":[{"type":"custom","name":"f","input_schema":{"type":"object"}}])")).tools.size(), 1u);
  const ParsedRequest r = parse(Api::OpenAiResponses, R"({"input":"Hi","parallel_tool_calls":false})");
  EXPECT_TRUE(r.single_tool_call);
  EXPECT_EQ(r.settings["parallel_tool_calls"], false);
  EXPECT_EQ(r.gen.end_at_first_call, nullptr);  // no tools: nothing to end at
  // With tools the answer ends at its first call, read with the request's mode, tools and
  // forced prefix (a named call in chat mode).
  EXPECT_EQ(parse(Api::OpenAiChat, chat_body(tools)).gen.end_at_first_call, nullptr);
  const ParsedRequest f = parse(Api::OpenAiChat, chat_body(tools + R"(,"parallel_tool_calls":false,"thinking":{"type":"disabled"},)"
                                                                   R"("tool_choice":{"type":"function","function":{"name":"get_weather"}})"));
  ASSERT_NE(f.gen.end_at_first_call, nullptr);
  EXPECT_EQ(f.gen.end_at_first_call->mode, ChatMode::Chat);
  EXPECT_EQ(f.gen.end_at_first_call->tools, f.tools);
  EXPECT_FALSE(f.forced_prefix.empty());
  EXPECT_EQ(f.gen.end_at_first_call->forced_prefix, f.forced_prefix);
}

TEST_F(ServerRequest, ToolChoiceForcesACallInChatModeOnly) {
  const std::string tools = "\"tools\":[" + kTool + "],";
  const std::string opening = "\n\n<" + DSML + "tool_calls>\n";
  const ParsedRequest any = parse(Api::OpenAiChat, chat_body(tools + R"("tool_choice":"required","thinking":{"type":"disabled"})"));
  EXPECT_EQ(any.forced_prefix, opening);
  // The prompt the model continues ends with the markup.
  EXPECT_EQ(any.gen.prompt, tok_->encode(any.prompt_text + opening));
  const ParsedRequest named = parse(
      Api::OpenAiChat,
      chat_body(tools + R"("tool_choice":{"type":"function","function":{"name":"get_weather"}},"chat_template_kwargs":{"thinking":false})"));
  EXPECT_EQ(named.forced_prefix, opening + "<" + DSML + "invoke name=\"get_weather\">\n");
  // In thinking mode the model reasons first: forcing markup would cut it.
  EXPECT_EQ(refused(Api::OpenAiChat, chat_body(tools + R"("tool_choice":"required")")), "tool_choice");
  EXPECT_EQ(refused(Api::OpenAiChat, chat_body(tools + R"("tool_choice":{"type":"function","function":{"name":"get_weather"}})")),
            "tool_choice");
  // auto keeps the tools in the prompt without forcing; none leaves them out.
  const ParsedRequest aut = parse(Api::OpenAiChat, chat_body(tools + R"("tool_choice":"auto")"));
  EXPECT_TRUE(aut.forced_prefix.empty());
  EXPECT_NE(aut.prompt_text.find("get_weather"), std::string::npos);
  const ParsedRequest none = parse(Api::OpenAiChat, chat_body(tools + R"("tool_choice":"none")"));
  EXPECT_TRUE(none.tools.empty());
  EXPECT_EQ(none.prompt_text.find("get_weather"), std::string::npos);
  // Anthropic: any / tool force in chat mode (its default), refused with thinking on.
  const std::string atools = "\"tools\":[" + kAnthropicTool + "],";
  EXPECT_EQ(parse(Api::Anthropic, anthropic_body(atools + R"("tool_choice":{"type":"any"})")).forced_prefix, opening);
  EXPECT_EQ(parse(Api::Anthropic, anthropic_body(atools + R"("tool_choice":{"type":"tool","name":"get_weather"})")).forced_prefix,
            opening + "<" + DSML + "invoke name=\"get_weather\">\n");
  EXPECT_EQ(refused(Api::Anthropic, anthropic_body(atools + R"("tool_choice":{"type":"any"},"thinking":{"type":"enabled"})")),
            "tool_choice");
  EXPECT_TRUE(parse(Api::Anthropic, anthropic_body(atools + R"("tool_choice":{"type":"none"})")).tools.empty());
}

TEST_F(ServerRequest, AnthropicToolBlocksRenderAsTheOpenAiConversation) {
  // The same conversation in both APIs: a tool call (with reasoning) and its result.
  const std::string anthropic = R"({"max_tokens":16,"system":"Be brief.","tools":[)" + kAnthropicTool + R"(],
    "messages":[
      {"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":[{"type":"thinking","thinking":"Use the tool.","signature":"s"},
                                     {"type":"text","text":"Checking."},
                                     {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"location":"Paris"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"22C"}]},
                                {"type":"text","text":"Thanks"}]}]})";
  const std::string openai = R"({"thinking":{"type":"disabled"},"tools":[)" + kTool + R"(],
    "messages":[
      {"role":"system","content":"Be brief."},
      {"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":"Checking.","reasoning_content":"Use the tool.",
       "tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"toolu_1","content":"22C"},
      {"role":"user","content":"Thanks"}]})";
  const ParsedRequest a = parse(Api::Anthropic, anthropic);
  const ParsedRequest o = parse(Api::OpenAiChat, openai);
  EXPECT_EQ(a.prompt_text, o.prompt_text);
  EXPECT_EQ(a.gen.prompt, o.gen.prompt);
  // And what it renders: the call as DSML, the result as a tool_result turn.
  EXPECT_NE(a.prompt_text.find("<" + DSML + "invoke name=\"get_weather\">"), std::string::npos);
  EXPECT_NE(a.prompt_text.find(">Paris</" + DSML + "parameter>"), std::string::npos);
  EXPECT_NE(a.prompt_text.find("<tool_result>22C</tool_result>"), std::string::npos);
  EXPECT_NE(a.prompt_text.find("Thanks"), std::string::npos);
}

TEST_F(ServerRequest, AnthropicMidConversationSystemRendersAsTheOpenAiOne) {
  // Claude Code sends a system message after the user's (Anthropic's mid-conversation system
  // messages): a system message where it sits, as in an OpenAI conversation.
  const ParsedRequest a = parse(Api::Anthropic, R"({"max_tokens":16,"system":"Be brief.","messages":[
      {"role":"user","content":"Hi"},
      {"role":"system","content":[{"type":"text","text":"Agents: ","cache_control":{"type":"ephemeral"}},{"type":"text","text":"none"}]},
      {"role":"assistant","content":"Hello."},{"role":"user","content":"Bye"}]})");
  const ParsedRequest o = parse(Api::OpenAiChat, R"({"thinking":{"type":"disabled"},"messages":[
      {"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},{"role":"system","content":"Agents: none"},
      {"role":"assistant","content":"Hello."},{"role":"user","content":"Bye"}]})");
  EXPECT_EQ(a.prompt_text, o.prompt_text);
  EXPECT_NE(a.prompt_text.find("Agents: none"), std::string::npos);
}

TEST_F(ServerRequest, CompletionPrompts) {
  const ParsedRequest s = parse(Api::OpenAiCompletion, completion_body(""));
  EXPECT_FALSE(s.chat);
  EXPECT_EQ(s.prompt_text, "Hello");  // raw text: no chat encoding
  EXPECT_EQ(s.gen.prompt, tok_->encode("Hello"));
  EXPECT_EQ(s.gen.max_tokens, 16);  // OpenAI's default for this endpoint
  EXPECT_FALSE(s.logprobs);
  const ParsedRequest lp = parse(Api::OpenAiCompletion, completion_body(R"("logprobs":0,"echo":true)"));
  EXPECT_TRUE(lp.logprobs && lp.echo);
  EXPECT_EQ(lp.gen.top_logprobs, 0);
  EXPECT_EQ(lp.echo_text, "Hello");

  // suffix: fill in the middle. The prompt is the prefix and suffix between the tokenizer's FIM
  // tokens (one token each), after the begin-of-sentence token; echo gives the prompt as sent.
  const ParsedRequest fim = parse(Api::OpenAiCompletion, R"({"prompt":"def f(a):\n","suffix":"    return b\n","echo":true})");
  const auto one = [&](const char* t) {
    const std::vector<int32_t> ids = tok_->encode(t);
    EXPECT_EQ(ids.size(), 1u) << t;
    return ids.at(0);
  };
  std::vector<int32_t> want = {one(kBosText), one(kFimBeginText)};
  for (int32_t id : tok_->encode("def f(a):\n")) want.push_back(id);
  want.push_back(one(kFimHoleText));
  for (int32_t id : tok_->encode("    return b\n")) want.push_back(id);
  want.push_back(one(kFimEndText));
  EXPECT_EQ(fim.gen.prompt, want);
  EXPECT_EQ(one(kFimHoleText), 128800);
  EXPECT_EQ(fim.echo_text, "def f(a):\n");

  // Token ids are taken as they are, and the text is their decoding.
  const std::vector<int32_t> ids = tok_->encode("Größe 東京");
  std::string list;
  for (int32_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
  const ParsedRequest t = parse(Api::OpenAiCompletion, "{\"prompt\":[" + list + "]}");
  EXPECT_EQ(t.gen.prompt, ids);
  EXPECT_EQ(t.prompt_text, "Größe 東京");
  // The last id of the vocabulary is in it.
  const int32_t last = tok_->vocab_size() - 1;
  EXPECT_EQ(parse(Api::OpenAiCompletion, "{\"prompt\":[" + std::to_string(last) + "]}").gen.prompt,
            std::vector<int32_t>{last});
  // The model's vocabulary bounds the ids, not the tokenizer's.
  ModelFacts small{*tok_, kContext, 1000};
  EXPECT_THROW(parse_request(Api::OpenAiCompletion, R"({"prompt":[1000]})", small, lim_), ApiError);
  EXPECT_NO_THROW(parse_request(Api::OpenAiCompletion, R"({"prompt":[999]})", small, lim_));
}

TEST_F(ServerRequest, TokenIdPromptsEchoValidUtf8) {
  // A character the tokenizer splits over byte tokens: its first token alone is not UTF-8, and
  // the echoed text (JSON) must be (found by fuzz_server_request).
  std::vector<int32_t> split;
  for (const char* s : {"🙂", "𝔘", "ꙮ", "🦜"}) {
    const std::vector<int32_t> ids = tok_->encode(s);
    if (ids.size() > 1 && !unicode::is_valid_utf8(tok_->decode({ids[0]}))) {
      split = ids;
      break;
    }
  }
  ASSERT_FALSE(split.empty()) << "no character split over byte tokens";
  const ParsedRequest r = parse(Api::OpenAiCompletion, "{\"echo\":true,\"prompt\":[" + std::to_string(split[0]) + "]}");
  EXPECT_TRUE(unicode::is_valid_utf8(r.prompt_text));
  EXPECT_EQ(r.prompt_text, "\xEF\xBF\xBD");  // U+FFFD for the unfinished character
  EXPECT_EQ(r.gen.prompt, std::vector<int32_t>{split[0]});
}

TEST_F(ServerRequest, ContextBounds) {
  // A prompt of n tokens needs a context of n + max_tokens; without room for one token of answer
  // it is refused naming the endpoint's prompt field.
  const std::vector<int32_t> ids = tok_->encode("one two three four five six seven");
  std::string list;
  for (int32_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
  const auto n = static_cast<int64_t>(ids.size());
  const std::string one = "{\"max_tokens\":1,\"prompt\":[" + list + "]}";
  EXPECT_EQ(parse(Api::OpenAiCompletion, one, n + 1).gen.max_tokens, 1);
  EXPECT_EQ(refused(Api::OpenAiCompletion, one, n), "prompt");
  EXPECT_EQ(refused(Api::OpenAiCompletion, "{\"max_tokens\":2,\"prompt\":[" + list + "]}", n + 1), "max_tokens");
  // Chat without max_tokens: the rest of the context when smaller than the default cap.
  const ParsedRequest chat = parse(Api::OpenAiChat, chat_body(""));
  const auto m = static_cast<int64_t>(chat.gen.prompt.size());
  EXPECT_EQ(parse(Api::OpenAiChat, chat_body(""), m + 3).gen.max_tokens, 3);
  EXPECT_EQ(refused(Api::OpenAiChat, chat_body(""), m), "messages");
  EXPECT_EQ(refused(Api::Anthropic, anthropic_body(""), 4), "messages");
}

TEST_F(ServerRequest, DeepNestingIsRefusedNotACrash) {
  // ~100 KB of nesting inside a tool's parameters (well under the 8 MB body limit) overflowed the
  // stack while the value was copied and rendered: now a 400 before parsing.
  const auto body = [](int depth, const std::string& inner) {
    return chat_body("\"thinking\":{\"type\":\"disabled\"},\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                     "\"parameters\":" + std::string(static_cast<size_t>(depth), '[') + inner +
                     std::string(static_cast<size_t>(depth), ']') + "}}]");
  };
  EXPECT_NE(refused(Api::OpenAiChat, body(200000, "")).find("nests deeper"), std::string::npos);
  EXPECT_NE(refused(Api::Anthropic, anthropic_body("\"x\":" + std::string(129, '[') + std::string(129, ']'))).find("nests deeper"),
            std::string::npos);
  // The count ignores brackets inside strings (and escaped quotes do not end them); nesting of
  // a real schema passes.
  EXPECT_EQ(refused(Api::OpenAiChat, body(100, "\"[[[[\\\"[[[[[\"")), "");
  EXPECT_EQ(refused(Api::Anthropic, anthropic_body("\"x\":" + std::string(120, '[') + std::string(120, ']'))), "");
}

TEST_F(ServerRequest, RenderErrorsSayWhichListTheyCount) {
  // A tool call the renderer refuses (its function is not an object): the renderer names the
  // message by its index in the list it got, which has a system message put first for the tools.
  const std::string calls = R"({"role":"assistant","tool_calls":[{"type":"function","function":5}]})";
  const auto what = [&](Api api, const std::string& body) {
    try {
      (void)parse(api, body);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, "messages");
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string with_tools =
      what(Api::OpenAiChat, R"({"tools":[)" + kTool + R"(],"messages":[{"role":"user","content":"x"},)" + calls + "]}");
  EXPECT_NE(with_tools.find("messages[2]"), std::string::npos) << with_tools;
  EXPECT_NE(with_tools.find("added first for the tools"), std::string::npos) << with_tools;
  const std::string without = what(Api::OpenAiChat, R"({"messages":[{"role":"user","content":"x"},)" + calls + "]}");
  EXPECT_NE(without.find("messages[1]"), std::string::npos) << without;
  EXPECT_EQ(without.find("added first"), std::string::npos) << without;
}

// The answer side of two fixes above: what the parsed requests lead to must format as JSON.
TEST_F(ServerRequest, AnswersFormatWithoutThrowing) {
  ToolCallStore store;
  // Logprobs of an id the tokenizer has no text for (a model vocabulary padded past it).
  const ParsedRequest chat = parse(Api::OpenAiChat, chat_body(R"("logprobs":true,"top_logprobs":1,"thinking":{"type":"disabled"})"));
  auto resp = make_responder(chat, *tok_, store);
  Event e = Event::of(Event::Text);
  e.text = "Hi";
  e.ids = {tok_->vocab_size() + 5};
  e.logprobs = {-0.5f};
  e.top = {{{tok_->vocab_size() + 6, -1.0f}}};
  EXPECT_NO_THROW(resp->event(e));
  Event fin = Event::of(Event::Finish);
  fin.finish_reason = "eos";
  (void)resp->event(fin);
  const nlohmann::json body = nlohmann::json::parse(resp->body(Usage{}));
  EXPECT_EQ(body["choices"][0]["logprobs"]["content"][0]["token"], "");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hi");

  // Echo of a token-id prompt that splits a character.
  const std::vector<int32_t> ids = tok_->encode("🙂");
  ASSERT_GT(ids.size(), 1u);
  const ParsedRequest comp =
      parse(Api::OpenAiCompletion, "{\"echo\":true,\"max_tokens\":2,\"prompt\":[" + std::to_string(ids[0]) + "]}");
  auto cresp = make_responder(comp, *tok_, store);
  (void)cresp->event(fin);
  const nlohmann::json cbody = nlohmann::json::parse(cresp->body(Usage{}));
  EXPECT_EQ(cbody["choices"][0]["text"], "\xEF\xBF\xBD");
}

}  // namespace
