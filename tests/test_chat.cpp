// DeepSeek-V4 chat encoding: the prompts of tests/data/chat (rendered by the official
// encoding_dsv4.py) byte for byte, the round trip through parse_completion, and focused checks of
// each rule of the encoder.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/chat.h"

using namespace dsv4;
using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

const std::string BOS = kBosText, EOS = kEosText, USER = kUserText, ASSISTANT = kAssistantText,
                  REMINDER = kLatestReminderText, THINK = kThinkStartText, ENDTHINK = kThinkEndText;

fs::path data_dir() { return fs::path(DSV4_TEST_DATA) / "chat"; }

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ojson parse(const std::string& s) { return ojson::parse(s); }

ChatOptions thinking() { return ChatOptions{}; }
ChatOptions chat() {
  ChatOptions o;
  o.mode = ChatMode::Chat;
  return o;
}

// A mode file of a case: the suffix after "<case>-" and the options it stands for.
struct ModeFile {
  const char* suffix;
  ChatMode mode;
  const char* effort;
};
const ModeFile kModeFiles[] = {
    {"thinking", ChatMode::Thinking, ""},
    {"chat", ChatMode::Chat, ""},
    {"thinking-max", ChatMode::Thinking, "max"},
    {"chat-max", ChatMode::Chat, "max"},
};

struct Golden {
  std::string name;
  ojson messages;
  ModeFile mode;
  std::string expected;
};

std::vector<Golden> goldens() {
  std::vector<Golden> out;
  std::vector<fs::path> inputs;
  for (const auto& e : fs::directory_iterator(data_dir())) {
    const std::string n = e.path().filename().string();
    if (n.size() > 11 && n.ends_with("-input.json")) inputs.push_back(e.path());
  }
  std::sort(inputs.begin(), inputs.end());
  for (const auto& in : inputs) {
    const std::string fname = in.filename().string();
    const std::string name = fname.substr(0, fname.size() - 11);
    const ojson messages = parse(read_file(in));
    for (const auto& mf : kModeFiles) {
      const fs::path p = data_dir() / (name + "-" + mf.suffix + ".txt");
      if (fs::exists(p)) out.push_back({name, messages, mf, read_file(p)});
    }
  }
  return out;
}

std::string render(const Golden& g) {
  ChatOptions o;
  o.mode = g.mode.mode;
  o.reasoning_effort = g.mode.effort;
  return render_chat(g.messages, o);
}

// Index of the first byte where a and b differ, for readable failures.
std::string first_diff(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  auto around = [&](const std::string& s) { return s.substr(i < 40 ? 0 : i - 40, 120); };
  return "first difference at byte " + std::to_string(i) + "\n got: ...." + around(a) +
         "\nwant: ...." + around(b);
}

// The arguments a call should parse back to: its JSON object, or {"arguments": raw} when the raw
// text is not JSON (the encoder wrote it as one string parameter).
ojson expected_arguments(const ojson& args) {
  if (args.is_object()) return args;
  ojson parsed = ojson::parse(args.get<std::string>(), nullptr, false);
  if (parsed.is_discarded()) {
    parsed = ojson::object();
    parsed["arguments"] = args;
  }
  return parsed;
}

bool starts_at(const std::string& s, size_t pos, const std::string& what) {
  return s.compare(pos, what.size(), what) == 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Golden prompts
// ---------------------------------------------------------------------------------------------

TEST(ChatGolden, DataIsThere) {
  // The three shared cases, and their copies are the same bytes as the shared originals.
  for (const char* f : {"case1-input.json", "case1-thinking.txt", "case1-chat.txt", "case2-input.json",
                        "case2-thinking.txt", "case2-chat.txt", "case3-input.json", "case3-chat.txt",
                        "case3-thinking-max.txt"}) {
    ASSERT_TRUE(fs::exists(data_dir() / f)) << f;
    const fs::path shared = fs::path(DSV4_SHARED_DIR) / "chat" / f;
    if (fs::exists(shared)) {
      EXPECT_EQ(read_file(data_dir() / f), read_file(shared)) << f;
    }
  }
  EXPECT_GE(goldens().size(), 16u);
}

TEST(ChatGolden, EveryCaseRendersByteExactly) {
  for (const auto& g : goldens()) {
    SCOPED_TRACE(g.name + " (" + g.mode.suffix + ")");
    const std::string got = render(g);
    EXPECT_TRUE(got == g.expected) << first_diff(got, g.expected);
    // The begin-of-sentence text once, at the start.
    EXPECT_TRUE(got.starts_with(BOS));
    EXPECT_EQ(got.find(BOS, 1), std::string::npos);
  }
}

TEST(ChatGolden, RenderedAssistantTurnsParseBack) {
  const std::vector<std::string> task_tokens = {"<｜action｜>", "<｜query｜>", "<｜authority｜>",
                                                "<｜domain｜>", "<｜title｜>", "<｜read_url｜>"};
  size_t checked = 0;
  for (const auto& g : goldens()) {
    SCOPED_TRACE(g.name + " (" + g.mode.suffix + ")");
    const std::string prompt = render(g);
    // Assistant messages that follow an ordinary turn (not a task).
    std::vector<const ojson*> turns;
    for (size_t i = 0; i < g.messages.size(); ++i) {
      if (g.messages[i]["role"] != "assistant") continue;
      if (i > 0 && g.messages[i - 1].contains("task") && !g.messages[i - 1]["task"].is_null()) continue;
      turns.push_back(&g.messages[i]);
    }
    // The rendered turns: after each "<｜Assistant｜>" + opener, up to and with the EOS.
    size_t next = 0;
    for (size_t at = prompt.find(ASSISTANT); at != std::string::npos;
         at = prompt.find(ASSISTANT, at + 1)) {
      size_t pos = at + ASSISTANT.size();
      const bool think = starts_at(prompt, pos, THINK);
      ASSERT_TRUE(think || starts_at(prompt, pos, ENDTHINK));
      pos += think ? THINK.size() : ENDTHINK.size();
      if (pos == prompt.size()) continue;  // the generation prompt
      bool task = false;
      for (const auto& t : task_tokens) task = task || starts_at(prompt, pos, t);
      if (task) continue;
      const size_t end = prompt.find(EOS, pos);
      ASSERT_NE(end, std::string::npos);
      ASSERT_LT(next, turns.size());
      const ojson& msg = *turns[next++];
      const ParsedCompletion pc =
          parse_completion(prompt.substr(pos, end + EOS.size() - pos), think ? ChatMode::Thinking : ChatMode::Chat);
      const std::string reasoning = msg.value("reasoning_content", std::string());
      EXPECT_EQ(pc.reasoning_content, think ? reasoning : std::string());
      EXPECT_EQ(pc.content, msg.contains("content") && msg["content"].is_string() ? msg["content"].get<std::string>()
                                                                                   : std::string());
      const ojson calls = msg.contains("tool_calls") ? msg["tool_calls"] : ojson::array();
      ASSERT_EQ(pc.tool_calls.size(), calls.size());
      for (size_t k = 0; k < calls.size(); ++k) {
        EXPECT_EQ(pc.tool_calls[k]["type"], "function");
        EXPECT_EQ(pc.tool_calls[k]["function"]["name"], calls[k]["function"]["name"]);
        const ojson want = expected_arguments(calls[k]["function"]["arguments"]);
        const std::string got_args = pc.tool_calls[k]["function"]["arguments"].get<std::string>();
        EXPECT_EQ(ojson::parse(got_args), want);
        EXPECT_EQ(got_args, to_python_json(want));
      }
      ++checked;
    }
    EXPECT_EQ(next, turns.size());
  }
  EXPECT_GE(checked, 18u);
}

// ---------------------------------------------------------------------------------------------
// Roles
// ---------------------------------------------------------------------------------------------

TEST(ChatRoles, SystemAlone) {
  EXPECT_EQ(render_chat(parse(R"([{"role":"system","content":"S"}])")), BOS + "S");
  EXPECT_EQ(render_chat(parse(R"([{"role":"system"}])")), BOS);
  EXPECT_EQ(render_chat(parse(R"([{"role":"system","content":null}])")), BOS);
}

TEST(ChatRoles, ASystemMessageAfterAUserTurnClosesIt) {
  // The official encoder writes no assistant opener after a system message, so [user, system]
  // would end without one: the system message closes the user turn instead (a deliberate
  // difference, chat.h), written as the encoder writes a system message: its text as it is.
  const ojson last = parse(R"([{"role":"user","content":"Q"},{"role":"system","content":"S"}])");
  EXPECT_EQ(render_chat(last, thinking()), BOS + USER + "Q" + "S" + ASSISTANT + THINK);
  EXPECT_EQ(render_chat(last, chat()), BOS + USER + "Q" + "S" + ASSISTANT + ENDTHINK);
  // Before an assistant turn, and several of them; an earlier turn's opener stays </think>.
  const ojson mid = parse(R"([{"role":"user","content":"Q"},{"role":"system","content":"S"},{"role":"system","content":"T"},
      {"role":"assistant","content":"A"},{"role":"user","content":"R"}])");
  EXPECT_EQ(render_chat(mid, thinking()),
            BOS + USER + "Q" + "S" + "T" + ASSISTANT + ENDTHINK + "A" + EOS + USER + "R" + ASSISTANT + THINK);
  // Between user turns, or after an assistant turn, nothing changes.
  const ojson between = parse(R"([{"role":"user","content":"Q"},{"role":"system","content":"S"},{"role":"user","content":"R"}])");
  EXPECT_EQ(render_chat(between, chat()), BOS + USER + "Q" + "S" + USER + "R" + ASSISTANT + ENDTHINK);
  const ojson after = parse(R"([{"role":"user","content":"Q"},{"role":"assistant","content":"A"},{"role":"system","content":"S"}])");
  EXPECT_EQ(render_chat(after, chat()), BOS + USER + "Q" + ASSISTANT + ENDTHINK + "A" + EOS + "S");
}

TEST(ChatRoles, UserGetsTheGenerationPrompt) {
  const ojson m = parse(R"([{"role":"user","content":"Hi"}])");
  EXPECT_EQ(render_chat(m, thinking()), BOS + USER + "Hi" + ASSISTANT + THINK);
  EXPECT_EQ(render_chat(m, chat()), BOS + USER + "Hi" + ASSISTANT + ENDTHINK);
  EXPECT_EQ(render_chat(parse(R"([{"role":"user"}])"), chat()), BOS + USER + ASSISTANT + ENDTHINK);
}

TEST(ChatRoles, ConsecutiveUsersMergeIntoOneTurn) {
  const ojson m = parse(R"([{"role":"user","content":"A"},{"role":"user","content":"B"}])");
  EXPECT_EQ(render_chat(m, chat()), BOS + USER + "A\n\nB" + ASSISTANT + ENDTHINK);
}

TEST(ChatRoles, DeveloperIsAUserTurnWithToolsAndResponseFormat) {
  const ojson m = parse(R"([{"role":"developer","content":"D",
      "response_format":{"type":"json_schema","b":1,"a":[1.5,true,null]}}])");
  EXPECT_EQ(render_chat(m, chat()),
            BOS + USER + "D\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
                         "{\"type\": \"json_schema\", \"b\": 1, \"a\": [1.5, true, null]}" +
                ASSISTANT + ENDTHINK);
  const ojson t = parse(R"([{"role":"developer","content":"D","tools":[{"type":"function",
      "function":{"name":"f","parameters":{}}}]}])");
  const std::string out = render_chat(t, thinking());
  EXPECT_TRUE(out.starts_with(BOS + USER + "D\n\n## Tools\n\n")) << out;
  EXPECT_NE(out.find("### Available Tool Schemas\n\n{\"name\": \"f\", \"parameters\": {}}\n\nYou MUST"),
            std::string::npos);
  EXPECT_TRUE(out.ends_with("tool calls.\n" + ASSISTANT + THINK)) << out;
}

TEST(ChatRoles, LatestReminder) {
  const ojson m = parse(R"([{"role":"system","content":"S"},{"role":"latest_reminder","content":"R"},
      {"role":"user","content":"Q"}])");
  EXPECT_EQ(render_chat(m, chat()), BOS + "S" + REMINDER + "R" + USER + "Q" + ASSISTANT + ENDTHINK);
  // As in the official encoder, a user turn followed by a reminder already gets the assistant
  // opener, and a final reminder gets none.
  const ojson after = parse(R"([{"role":"user","content":"Q"},{"role":"latest_reminder","content":"R"}])");
  EXPECT_EQ(render_chat(after, chat()), BOS + USER + "Q" + ASSISTANT + ENDTHINK + REMINDER + "R");
}

TEST(ChatRoles, AssistantParts) {
  const ojson m = parse(R"([{"role":"user","content":"Q"},
      {"role":"assistant","reasoning_content":"R","content":"A"}])");
  EXPECT_EQ(render_chat(m, thinking()), BOS + USER + "Q" + ASSISTANT + THINK + "R" + ENDTHINK + "A" + EOS);
  EXPECT_EQ(render_chat(m, chat()), BOS + USER + "Q" + ASSISTANT + ENDTHINK + "A" + EOS);
  // No reasoning: an empty think block; content null: empty.
  const ojson bare = parse(R"([{"role":"user","content":"Q"},{"role":"assistant","content":null}])");
  EXPECT_EQ(render_chat(bare, thinking()), BOS + USER + "Q" + ASSISTANT + THINK + ENDTHINK + EOS);
  // wo_eos: a prefill the model continues.
  const ojson pre = parse(R"([{"role":"user","content":"Q"},{"role":"assistant","content":"Sure,","wo_eos":true}])");
  EXPECT_EQ(render_chat(pre, chat()), BOS + USER + "Q" + ASSISTANT + ENDTHINK + "Sure,");
}

TEST(ChatRoles, ToolResultsMergeIntoAUserTurnInCallOrder) {
  const ojson m = parse(R"([
    {"role":"user","content":"Q"},
    {"role":"assistant","content":"","tool_calls":[
      {"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},
      {"id":"b","type":"function","function":{"name":"g","arguments":"{}"}},
      {"type":"function","function":{"id":"c","name":"h","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"c","content":"C"},
    {"role":"tool","tool_call_id":"zzz","content":"Z"},
    {"role":"tool","tool_call_id":"a","content":[{"type":"text","text":"A1"},{"type":"image_url"},{"type":"text","text":"A2"}]},
    {"role":"tool","tool_call_id":"b"}])");
  const std::string out = render_chat(m, chat());
  // Unknown ids sort as the first call (stably); the id may sit on the function object.
  const std::string users = USER + "<tool_result>Z</tool_result>\n\n<tool_result>A1\n\n[Unsupported image_url]\n\nA2"
                                   "</tool_result>\n\n<tool_result></tool_result>\n\n<tool_result>C</tool_result>" +
                            ASSISTANT + ENDTHINK;
  EXPECT_TRUE(out.ends_with(EOS + users)) << out;
  // An empty calls block is no calls.
  const ojson none = parse(R"([{"role":"user","content":"Q"},{"role":"assistant","content":"A","tool_calls":[]}])");
  EXPECT_EQ(render_chat(none, chat()), BOS + USER + "Q" + ASSISTANT + ENDTHINK + "A" + EOS);
}

TEST(ChatRoles, ToolResultJoinsTheUserTurnBeforeIt) {
  const ojson m = parse(R"([{"role":"user","content":"Q"},{"role":"tool","content":"T"}])");
  EXPECT_EQ(render_chat(m, chat()), BOS + USER + "Q\n\n<tool_result>T</tool_result>" + ASSISTANT + ENDTHINK);
}

// ---------------------------------------------------------------------------------------------
// Tools and tool calls
// ---------------------------------------------------------------------------------------------

TEST(ChatTools, SchemasKeepInputKeyOrderAndPythonJson) {
  const ojson m = parse(R"([{"role":"system","content":"","tools":[
    {"type":"function","function":{"name":"z","description":"ünï \"q\" \\ /\n","parameters":{"type":"object",
      "properties":{"x":{"type":"number","default":0.5,"maximum":1e16,"minimum":-1e-5}}}}},
    {"type":"function","function":{"name":"a"}}]}])");
  const std::string out = render_chat(m, chat());
  EXPECT_TRUE(out.starts_with(BOS + "\n\n## Tools\n\n")) << out;
  EXPECT_NE(out.find("\n\n{\"name\": \"z\", \"description\": \"ünï \\\"q\\\" \\\\ /\\n\", \"parameters\": {\"type\": "
                     "\"object\", \"properties\": {\"x\": {\"type\": \"number\", \"default\": 0.5, \"maximum\": "
                     "1e+16, \"minimum\": -1e-05}}}}\n{\"name\": \"a\"}\n\nYou MUST"),
            std::string::npos)
      << out;
}

TEST(ChatTools, PlainJsonOverloadSortsKeys) {
  const nlohmann::json m = nlohmann::json::parse(R"([{"role":"system","content":"","tools":[
    {"type":"function","function":{"name":"f","description":"d"}}]}])");
  EXPECT_NE(render_chat(m, chat()).find("{\"description\": \"d\", \"name\": \"f\"}"), std::string::npos);
}

TEST(ChatTools, ArgumentsAsAnObjectAreTheArguments) {
  // Deliberate: the official encoder would wrap an already-decoded object in one parameter named
  // "arguments"; we take it as the arguments themselves (what a JSON string would decode to).
  const ojson m = parse(R"([{"role":"user","content":"Q"},{"role":"assistant","tool_calls":[
    {"type":"function","function":{"name":"f","arguments":{"s":"x","n":2.0}}}]}])");
  EXPECT_NE(render_chat(m, chat()).find("<｜DSML｜invoke name=\"f\">\n"
                                        "<｜DSML｜parameter name=\"s\" string=\"true\">x</｜DSML｜parameter>\n"
                                        "<｜DSML｜parameter name=\"n\" string=\"false\">2.0</｜DSML｜parameter>\n"
                                        "</｜DSML｜invoke>"),
            std::string::npos);
}

TEST(ChatTools, EmptyArgumentsAndContentBeforeCalls) {
  const ojson m = parse(R"([{"role":"user","content":"Q"},{"role":"assistant","content":"Let me look.",
    "tool_calls":[{"type":"function","function":{"name":"now","arguments":"{}"}}]}])");
  const std::string turn = "Let me look.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"now\">\n\n</｜DSML｜invoke>\n"
                           "</｜DSML｜tool_calls>" + EOS;
  EXPECT_EQ(render_chat(m, chat()), BOS + USER + "Q" + ASSISTANT + ENDTHINK + turn);
  const ParsedCompletion pc = parse_completion(turn, ChatMode::Chat);
  EXPECT_EQ(pc.content, "Let me look.");
  ASSERT_EQ(pc.tool_calls.size(), 1u);
  EXPECT_EQ(pc.tool_calls[0]["function"]["name"], "now");
  EXPECT_EQ(pc.tool_calls[0]["function"]["arguments"], "{}");
}

// ---------------------------------------------------------------------------------------------
// Reasoning: dropping, tools, options
// ---------------------------------------------------------------------------------------------

namespace {
const char* kTwoTurns = R"([{"role":"system","content":"S"},
  {"role":"user","content":"One"},
  {"role":"assistant","reasoning_content":"R1","content":"A1"},
  {"role":"user","content":"Two"},
  {"role":"assistant","reasoning_content":"R2","content":"A2"}])";
}

TEST(ChatReasoning, EarlierReasoningIsDroppedInThinkingMode) {
  EXPECT_EQ(render_chat(parse(kTwoTurns), thinking()),
            BOS + "S" + USER + "One" + ASSISTANT + ENDTHINK + "A1" + EOS + USER + "Two" + ASSISTANT + THINK + "R2" +
                ENDTHINK + "A2" + EOS);
}

TEST(ChatReasoning, DropThinkingFalseKeepsEveryTurn) {
  ChatOptions o;
  o.drop_thinking = false;
  EXPECT_EQ(render_chat(parse(kTwoTurns), o),
            BOS + "S" + USER + "One" + ASSISTANT + THINK + "R1" + ENDTHINK + "A1" + EOS + USER + "Two" + ASSISTANT +
                THINK + "R2" + ENDTHINK + "A2" + EOS);
}

TEST(ChatReasoning, ToolsAnywhereKeepEveryTurn) {
  ojson m = parse(kTwoTurns);
  ChatOptions keep;
  keep.drop_thinking = false;
  // Tools on an assistant message are not rendered but still switch dropping off.
  m[2]["tools"] = parse(R"([{"type":"function","function":{"name":"f"}}])");
  EXPECT_EQ(render_chat(m, thinking()), render_chat(parse(kTwoTurns), keep));
  // Tools on a user message are discarded with the rest of its fields: dropping stays on.
  ojson u = parse(kTwoTurns);
  u[1]["tools"] = parse(R"([{"type":"function","function":{"name":"f"}}])");
  EXPECT_EQ(render_chat(u, thinking()), render_chat(parse(kTwoTurns), thinking()));
  // An empty tools list is no tools.
  ojson e = parse(kTwoTurns);
  e[0]["tools"] = ojson::array();
  EXPECT_EQ(render_chat(e, thinking()), render_chat(parse(kTwoTurns), thinking()));
}

TEST(ChatReasoning, ChatModeNeverShowsReasoning) {
  EXPECT_EQ(render_chat(parse(kTwoTurns), chat()),
            BOS + "S" + USER + "One" + ASSISTANT + ENDTHINK + "A1" + EOS + USER + "Two" + ASSISTANT + ENDTHINK + "A2" +
                EOS);
}

TEST(ChatReasoning, EarlierDeveloperTurnsAreDroppedInThinkingMode) {
  const ojson m = parse(R"([{"role":"developer","content":"D"},{"role":"assistant","content":"A"},
      {"role":"user","content":"U"}])");
  EXPECT_EQ(render_chat(m, thinking()), BOS + "A" + EOS + USER + "U" + ASSISTANT + THINK);
  EXPECT_EQ(render_chat(m, chat()), BOS + USER + "D" + ASSISTANT + ENDTHINK + "A" + EOS + USER + "U" + ASSISTANT + ENDTHINK);
}

TEST(ChatReasoning, ReasoningEffort) {
  const ojson m = parse(R"([{"role":"user","content":"Q"}])");
  ChatOptions o;
  o.reasoning_effort = "max";
  const std::string max = render_chat(m, o);
  EXPECT_TRUE(max.starts_with(BOS + "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n")) << max;
  EXPECT_TRUE(max.ends_with("left unchecked.\n\n" + USER + "Q" + ASSISTANT + THINK)) << max;
  o.reasoning_effort = "high";  // accepted, adds nothing
  EXPECT_EQ(render_chat(m, o), render_chat(m, thinking()));
  o.mode = ChatMode::Chat;
  o.reasoning_effort = "max";  // only in thinking mode
  EXPECT_EQ(render_chat(m, o), render_chat(m, chat()));
  o.reasoning_effort = "low";
  EXPECT_THROW(render_chat(m, o), Error);
  // Before the first message, whatever its role.
  ChatOptions s;
  s.reasoning_effort = "max";
  EXPECT_NE(render_chat(parse(R"([{"role":"system","content":"S"}])"), s).find("unchecked.\n\nS"), std::string::npos);
}

TEST(ChatOptionsTest, GenerationPromptAndBos) {
  const ojson m = parse(R"([{"role":"user","content":"Q","task":"query"}])");
  ChatOptions o;
  o.add_generation_prompt = false;
  o.add_bos = false;
  EXPECT_EQ(render_chat(parse(R"([{"role":"user","content":"Q"}])"), o), USER + "Q");
  EXPECT_EQ(render_chat(m, o), USER + "Q");
}

TEST(ChatOptionsTest, ContextRendersOnlyTheNewMessages) {
  const ojson all = parse(kTwoTurns);
  ojson ctx = ojson::array(), rest = ojson::array();
  for (size_t i = 0; i < all.size(); ++i) (i < 3 ? ctx : rest).push_back(all[i]);
  ChatOptions o;
  o.context = ctx;
  const std::string tail = render_chat(rest, o);
  EXPECT_EQ(tail, USER + "Two" + ASSISTANT + THINK + "R2" + ENDTHINK + "A2" + EOS);
  EXPECT_TRUE(render_chat(all, thinking()).ends_with(tail));
  // Tool results in the new messages follow the calls made in the context.
  o.context = parse(R"([{"role":"user","content":"Q"},{"role":"assistant","tool_calls":[
      {"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},
      {"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]}])");
  o.mode = ChatMode::Chat;
  EXPECT_EQ(render_chat(parse(R"([{"role":"tool","tool_call_id":"b","content":"B"},
                                 {"role":"tool","tool_call_id":"a","content":"A"}])"), o),
            USER + "<tool_result>A</tool_result>\n\n<tool_result>B</tool_result>" + ASSISTANT + ENDTHINK);
}

// ---------------------------------------------------------------------------------------------
// Tasks (quick instructions)
// ---------------------------------------------------------------------------------------------

TEST(ChatTasks, NonActionTasksAppendTheirToken) {
  for (const char* task : {"query", "authority", "domain", "title", "read_url"}) {
    ojson m = parse(R"([{"role":"user","content":"Q"},{"role":"assistant","reasoning_content":"R","content":"T"}])");
    m[0]["task"] = task;
    const std::string tok = std::string("<｜") + task + "｜>";
    // No assistant opener and no thinking, even in thinking mode.
    EXPECT_EQ(render_chat(m, thinking()), BOS + USER + "Q" + tok + "T" + EOS) << task;
    m.erase(1);
    EXPECT_EQ(render_chat(m, chat()), BOS + USER + "Q" + tok) << task;
  }
}

TEST(ChatTasks, ActionOpensTheAssistantTurn) {
  const ojson m = parse(R"([{"role":"user","content":"Q","task":"action"}])");
  EXPECT_EQ(render_chat(m, thinking()), BOS + USER + "Q" + ASSISTANT + THINK + "<｜action｜>");
  EXPECT_EQ(render_chat(m, chat()), BOS + USER + "Q" + ASSISTANT + ENDTHINK + "<｜action｜>");
}

TEST(ChatTasks, ATaskTurnIsNotMergedWithTheNextUser) {
  const ojson m = parse(R"([{"role":"user","content":"Q","task":"title"},{"role":"user","content":"U"}])");
  EXPECT_EQ(render_chat(m, chat()), BOS + USER + "Q" + USER + "U" + ASSISTANT + ENDTHINK);
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

namespace {
// The message of the Error render_chat throws for `messages_json`.
std::string error_of(const std::string& messages_json) {
  try {
    render_chat(parse(messages_json), chat());
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST(ChatErrors, NameTheMessageAndTheField) {
  struct C {
    const char* json;
    const char* want;
  };
  const C cases[] = {
      {R"([{"role":"user","content":"Q"},{"role":"robot","content":"x"}])", "messages[1].role: unknown role 'robot'"},
      {R"([{"content":"x"}])", "messages[0].role"},
      {R"([1])", "messages[0]: must be an object"},
      {R"([{"role":"user","content":["a"]}])", "messages[0].content"},
      {R"([{"role":"user","content":null}])", "messages[0].content"},
      {R"([{"role":"developer","content":""}])", "messages[0].content"},
      {R"([{"role":"latest_reminder"}])", "messages[0].content"},
      {R"([{"role":"tool","content":null}])", "messages[0].content"},
      {R"([{"role":"tool","content":5}])", "messages[0].content"},
      {R"([{"role":"system","tools":[{"type":"function"}]}])", "messages[0].tools[0].function"},
      {R"([{"role":"system","tools":{"a":1}}])", "messages[0].tools"},
      {R"([{"role":"user","content":"Q"},{"role":"assistant","tool_calls":{"a":1}}])", "messages[1].tool_calls"},
      {R"([{"role":"user","content":"Q"},{"role":"assistant","tool_calls":[{"type":"function"}]}])",
       "messages[1].tool_calls[0].function"},
      {R"([{"role":"user","content":"Q"},{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}])",
       "messages[1].tool_calls[0].function.name"},
      {R"([{"role":"user","content":"Q"},{"role":"assistant","tool_calls":[{"function":{"name":"f"}}]}])",
       "messages[1].tool_calls[0].function.arguments"},
      {R"([{"role":"user","content":"Q"},{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}])",
       "messages[1].tool_calls[0].function.arguments"},
      {R"([{"role":"user","content":"Q"},{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":3}}]}])",
       "messages[1].tool_calls[0].function.arguments"},
      {R"([{"role":"user","content":"Q"},{"role":"assistant","reasoning_content":7}])", "messages[1].reasoning_content"},
      {R"([{"role":"user","content":"Q","task":"summarize"}])", "messages[0].task"},
      {R"({"role":"user"})", "must be a JSON list"},
  };
  for (const auto& c : cases) {
    const std::string what = error_of(c.json);
    EXPECT_NE(what.find(c.want), std::string::npos) << c.json << "\n  -> " << what;
  }
  ChatOptions o;
  o.context = parse(R"([{"role":"nobody"}])");
  EXPECT_THROW(render_chat(parse(R"([])"), o), Error);
}

// ---------------------------------------------------------------------------------------------
// parse_completion
// ---------------------------------------------------------------------------------------------

TEST(ChatParse, ThinkingAndChat) {
  ParsedCompletion p = parse_completion("Let me think.</think>The answer." + EOS, ChatMode::Thinking);
  EXPECT_EQ(p.reasoning_content, "Let me think.");
  EXPECT_EQ(p.content, "The answer.");
  EXPECT_TRUE(p.tool_calls.empty());
  p = parse_completion("Just this.", ChatMode::Chat);  // no EOS: generation stopped on it
  EXPECT_EQ(p.content, "Just this.");
  EXPECT_EQ(p.reasoning_content, "");
  p = parse_completion("R</think>", ChatMode::Thinking);
  EXPECT_EQ(p.reasoning_content, "R");
  EXPECT_EQ(p.content, "");
}

TEST(ChatParse, ToolCalls) {
  const std::string text =
      "R</think>Checking.\n\n<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"a\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris \"FR\"\nline2</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"x\": [1, 2.5]}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"b\">\n"
      "</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>" + EOS;
  const ParsedCompletion p = parse_completion(text, ChatMode::Thinking);
  EXPECT_EQ(p.reasoning_content, "R");
  EXPECT_EQ(p.content, "Checking.");
  ASSERT_EQ(p.tool_calls.size(), 2u);
  EXPECT_EQ(p.tool_calls[0].dump(),
            R"({"type":"function","function":{"name":"a","arguments":"{\"city\": \"Paris \\\"FR\\\"\\nline2\", \"days\": 3, \"opts\": {\"x\": [1, 2.5]}}"}})");
  EXPECT_EQ(p.tool_calls[1]["function"]["arguments"], "{}");
  // Without the EOS too.
  EXPECT_EQ(parse_completion(text.substr(0, text.size() - EOS.size()), ChatMode::Thinking).tool_calls, p.tool_calls);
  // Tool calls right away, without reasoning text in chat mode.
  const ParsedCompletion q = parse_completion(
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"b\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", ChatMode::Chat);
  EXPECT_EQ(q.content, "");
  EXPECT_EQ(q.tool_calls.size(), 1u);
}

TEST(ChatParse, RenderThenParseKeepsArbitraryArguments) {
  const ojson m = parse(R"([{"role":"user","content":"Q"},{"role":"assistant","reasoning_content":"R",
    "content":"C","tool_calls":[{"type":"function","function":{"name":"f",
    "arguments":"{\"s\": \"a<b>\\n</c>\", \"n\": -1.25e-07, \"l\": [null, true, {\"k\": \"ü\"}], \"e\": \"\"}"}}]}])");
  const std::string prompt = render_chat(m, thinking());
  const std::string marker = ASSISTANT + THINK;
  const ParsedCompletion p = parse_completion(prompt.substr(prompt.find(marker) + marker.size()), ChatMode::Thinking);
  EXPECT_EQ(p.reasoning_content, "R");
  EXPECT_EQ(p.content, "C");
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0]["function"]["arguments"], m[1]["tool_calls"][0]["function"]["arguments"]);
}

TEST(ChatParse, Errors) {
  const char* bad_thinking[] = {
      "no end of thinking",
      "\n\n<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>",  // calls before </think>
  };
  for (const char* t : bad_thinking) EXPECT_THROW(parse_completion(t, ChatMode::Thinking), Error) << t;
  const std::vector<std::string> bad_chat = {
      "A" + EOS + "more",                               // text after the end
      "A<think>B" + EOS,                                // special token in the content
      "A</think>B",
      "\n\n<｜DSML｜tool_calls><｜DSML｜invoke name=\"a\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",  // no ">\n"
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke nam=\"a\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n<｜DSML｜parameter name=\"x\" string=\"maybe\">1</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n<｜DSML｜parameter name=\"x\" string=\"true\">1</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"x\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>trailing" + EOS,
  };
  for (const auto& t : bad_chat) EXPECT_THROW(parse_completion(t, ChatMode::Chat), Error) << t;
}

// ---------------------------------------------------------------------------------------------
// Python json.dumps
// ---------------------------------------------------------------------------------------------

TEST(ChatJson, MatchesPythonJsonDumps) {
  const std::pair<double, const char*> floats[] = {
      {1.0, "1.0"},       {0.1, "0.1"},         {1e16, "1e+16"},   {1e15, "1000000000000000.0"},
      {1e-5, "1e-05"},    {0.0001, "0.0001"},   {-0.0, "-0.0"},    {1.5e-7, "1.5e-07"},
      {123456789.123, "123456789.123"},         {2.5e20, "2.5e+20"}, {1e22, "1e+22"},
      {12345678901234567.0, "1.2345678901234568e+16"},               {100.0, "100.0"},
      {3.141592653589793, "3.141592653589793"},
  };
  for (const auto& [v, want] : floats) EXPECT_EQ(to_python_json(ojson(v)), want) << want;
  EXPECT_EQ(to_python_json(ojson("a\"b\\c\n\t\x01\x1f\x7f é ☃ 😀/")), "\"a\\\"b\\\\c\\n\\t\\u0001\\u001f\x7f é ☃ 😀/\"");
  EXPECT_EQ(to_python_json(parse(R"({"b":1,"a":[true,null,{},[]],"c":-7})")),
            R"({"b": 1, "a": [true, null, {}, []], "c": -7})");
}
