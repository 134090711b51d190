// The text commands of the CLI: tokenize, detokenize, chat-template, generate (with the real
// tokenizer, fetched by scripts/test.sh; skipped when absent).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "test_util.h"

using namespace dsv4::testing;
namespace fs = std::filesystem;

namespace {

struct Out {
  int status = -1;
  std::string out, err;
};

Out run(const std::string& args) {
  std::string dir = temp_dir("clitext-run");
  std::string cmd = std::string(DSV4_BIN) + " " + args + " >" + dir + "/o 2>" + dir + "/e";
  int st = std::system(cmd.c_str());
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(dir + "/o"), slurp(dir + "/e")};
}

#define REQUIRE_TOKENIZER()                                                          \
  if (!fs::exists(tokenizer_dir() + "/tokenizer.json")) GTEST_SKIP() << "no tokenizer.json in " << tokenizer_dir()

}  // namespace

TEST(CliText, TokenizeDetokenizeRoundTrip) {
  REQUIRE_TOKENIZER();
  Out t = run("tokenize --tokenizer " + tokenizer_dir() + " --text 'Hello, 世界! 123456' --json");
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_EQ(t.out, "[19923, 14, 223, 3427, 3, 223, 6895, 18009]\n");
  Out d = run("detokenize --tokenizer " + tokenizer_dir() + " --ids 19923,14,223,3427,3,223,6895,18009");
  ASSERT_EQ(d.status, 0) << d.err;
  EXPECT_EQ(d.out, "Hello, 世界! 123456\n");
  EXPECT_EQ(run("detokenize --tokenizer " + tokenizer_dir() + " --ids 129280").status, 1);
  EXPECT_EQ(run("tokenize --tokenizer " + tokenizer_dir()).status, 2);  // neither --text nor --file
  EXPECT_EQ(run("tokenize --tokenizer /nonexistent --text hi").status, 1);
}

TEST(CliText, ChatTemplateMatchesOfficialCases) {
  const std::string d = std::string(DSV4_TEST_DATA) + "/chat/";
  for (const char* c : {"case1", "case2", "case3"}) {
    for (const char* mode : {"thinking", "chat"}) {
      std::string want_path = d + c + "-" + mode + ".txt";
      if (!fs::exists(want_path)) continue;
      Out r = run(std::string("chat-template --messages ") + d + c + "-input.json --mode " + mode);
      ASSERT_EQ(r.status, 0) << r.err;
      std::ifstream f(want_path, std::ios::binary);
      EXPECT_EQ(r.out, std::string(std::istreambuf_iterator<char>(f), {})) << c << " " << mode;
    }
  }
  Out m = run("chat-template --messages " + d + "case3-input.json --reasoning-effort max");
  std::ifstream f(d + "case3-thinking-max.txt", std::ios::binary);
  EXPECT_EQ(m.out, std::string(std::istreambuf_iterator<char>(f), {}));
  EXPECT_EQ(run("chat-template --messages /nonexistent.json").status, 1);
}

TEST(CliText, GenerateOnDemoModelStreamsAndReportsTiming) {
  REQUIRE_TOKENIZER();
  std::string model = temp_dir("clitext-demo") + "/m";
  Out mk = run("make-tiny --out " + model + " --preset demo --seed 2 --tokenizer " + tokenizer_dir());
  ASSERT_EQ(mk.status, 0) << mk.err;
  ASSERT_TRUE(fs::exists(model + "/tokenizer.json"));
  const std::string gen = "generate --model " + model + " --prompt 'Hello there' --mode chat -n 8 --temperature 0.7 --seed 1";
  Out r = run(gen);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  EXPECT_NE(r.err.find("prompt tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("decode"), std::string::npos) << r.err;
  EXPECT_EQ(run(gen).out, r.out);  // same seed, same text
  // Thinking mode streams the reasoning as it comes, to stderr, marked (dimmed on a terminal),
  // unless --hide-reasoning; the random model rarely closes its reasoning, so stdout may be empty.
  Out think = run("generate --model " + model + " --prompt 'Hello there' -n 8");
  EXPECT_EQ(think.status, 0) << think.err;
  EXPECT_NE(think.err.find("[reasoning]"), std::string::npos) << think.err;
  Out hidden = run("generate --model " + model + " --prompt 'Hello there' -n 8 --hide-reasoning");
  EXPECT_EQ(hidden.status, 0) << hidden.err;
  EXPECT_EQ(hidden.err.find("[reasoning]"), std::string::npos) << hidden.err;
  EXPECT_EQ(run("generate --model " + model + " --prompt hi --mode poetry").status, 2);
  EXPECT_EQ(run("generate --model " + model + " --prompt hi --top-p 0").status, 1);
  // A tokenizer larger than the model's vocabulary is refused up front.
  Out bad = run("generate --model " + golden_dir("tiny-native") + "/model --tokenizer " + tokenizer_dir() + " --prompt hi");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("vocab_size"), std::string::npos) << bad.err;
  // Interactive chat over stdin: two turns, a reset, exit.
  std::ofstream(model + "/in.txt") << "hi\n/reset\nagain\nand more\n/exit\n";
  Out chat = run("chat --model " + model + " --mode chat -n 4 < " + model + "/in.txt");
  EXPECT_EQ(chat.status, 0) << chat.err;
  EXPECT_NE(chat.err.find("(conversation cleared)"), std::string::npos) << chat.err;
  size_t turns = 0;
  for (size_t at = chat.err.find("prompt tokens"); at != std::string::npos; at = chat.err.find("prompt tokens", at + 1)) ++turns;
  EXPECT_EQ(turns, 3u) << chat.err;
  // The turn after a turn reuses the conversation's state: it prefills only what is new.
  EXPECT_NE(chat.err.find("reused)"), std::string::npos) << chat.err;
  fs::remove_all(fs::path(model).parent_path());
}

// --json-object / --json-schema: the answer is a JSON object (of the schema). The schema fixes
// every token but whitespace (at most 32 bytes in a row), so even the random demo model ends it.
TEST(CliText, GenerateJsonAnswers) {
  REQUIRE_TOKENIZER();
  std::string model = temp_dir("clitext-json") + "/m";
  ASSERT_EQ(run("make-tiny --out " + model + " --preset demo --seed 2 --tokenizer " + tokenizer_dir()).status, 0);
  std::ofstream(model + "/unit.json") << R"({"type":"object","properties":{"unit":{"enum":["C","F"]}},"required":["unit"],
                                             "additionalProperties":false})";
  Out r = run("generate --model " + model + " --prompt 'Units?' --mode chat -n 300 --json-schema " + model + "/unit.json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json v = nlohmann::json::parse(r.out);
  ASSERT_TRUE(v.is_object()) << r.out;
  EXPECT_TRUE(v["unit"] == "C" || v["unit"] == "F") << r.out;
  // Sampled and cut by -n: stdout is an object's start.
  Out o = run("generate --model " + model + " --prompt 'JSON?' --mode chat -n 40 --temperature 1 --seed 3 --json-object");
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_EQ(o.out.find_first_not_of(" \t\r\n"), o.out.find('{')) << o.out;
  EXPECT_NE(o.out.find('{'), std::string::npos) << o.out;
  // With drafts (checked through the mask) the same answer.
  Out d = run("generate --model " + model + " --prompt 'JSON?' --mode chat -n 40 --temperature 1 --seed 3 --json-object --draft 2");
  ASSERT_EQ(d.status, 0) << d.err;
  EXPECT_EQ(d.out, o.out);
  // Errors name the file and the keyword.
  std::ofstream(model + "/bad.json") << R"({"type":"object","properties":{"n":{"type":"integer","multipleOf":2}}})";
  Out bad = run("generate --model " + model + " --prompt x --json-schema " + model + "/bad.json");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("bad.json: schema.properties.n.multipleOf"), std::string::npos) << bad.err;
  EXPECT_EQ(run("generate --model " + model + " --prompt x --json-object --json-schema " + model + "/unit.json").status, 2);
  EXPECT_EQ(run("generate --model " + model + " --prompt x --json-schema " + model + "/missing.json").status, 1);
}
