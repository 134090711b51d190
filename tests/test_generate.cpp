// Generation on the tiny golden model with the real tokenizer: greedy == argmax of score,
// max tokens, stop tokens and strings, seeded determinism, UTF-8-safe streaming, context limit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "engine/generate.h"
#include "test_util.h"
#include "engine/score.h"

using namespace dsv4;
using namespace dsv4::testing;

namespace {

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

class Generate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string t = tokenizer_dir();
    if (!std::filesystem::exists(t + "/tokenizer.json")) return;
    tok_ = new Tokenizer(Tokenizer::load(t));
    model_ = new Engine({.model_dir = golden_dir("tiny-native") + "/model", .tokenizer = t + "/tokenizer.json"});
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete model_;
    tok_ = nullptr;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << "no tokenizer.json in " << tokenizer_dir() << " (scripts/test.sh fetches it)";
  }
  GenerateResult gen(const std::vector<int32_t>& prompt, const GenerateOptions& o, std::vector<std::string>* pieces = nullptr) {
    Session s = new_session(*model_, o);
    return generate(*model_, s, prompt, o, [&](std::string_view t) {
      if (pieces) pieces->emplace_back(t);
    });
  }
  static inline Tokenizer* tok_ = nullptr;
  static inline Engine* model_ = nullptr;
  const std::vector<int32_t> prompt_ = {0, 17, 254, 3, 99, 512, 7, 81};
};

}  // namespace

TEST_F(Generate, GreedyEqualsArgmaxOfScore) {
  GenerateOptions o;
  o.max_new_tokens = 24;
  o.stop_tokens = {};
  GenerateResult r = gen(prompt_, o);
  ASSERT_FALSE(r.tokens.empty());
  std::vector<int32_t> all = prompt_;
  all.insert(all.end(), r.tokens.begin(), r.tokens.end());
  std::vector<float> logits = score_tokens(*model_, all, static_cast<int64_t>(prompt_.size()), 0);
  const int64_t V = model_->info().vocab;
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    const float* row = logits.data() + (prompt_.size() - 1 + i) * V;
    EXPECT_EQ(std::max_element(row, row + V) - row, r.tokens[i]) << "step " << i;
  }
}

TEST_F(Generate, MaxTokensAndStopToken) {
  GenerateOptions o;
  o.max_new_tokens = 10;
  GenerateResult r = gen(prompt_, o);
  if (r.stop_reason == "eos") GTEST_SKIP() << "model emitted EOS early";
  EXPECT_EQ(r.stop_reason, "max_tokens");
  EXPECT_EQ(r.tokens.size(), 10u);
  o.stop_tokens = {r.tokens[4]};
  GenerateResult s = gen(prompt_, o);
  auto first = std::find(r.tokens.begin(), r.tokens.end(), r.tokens[4]) - r.tokens.begin();
  EXPECT_EQ(s.stop_reason, "stop_token");
  EXPECT_EQ(static_cast<int64_t>(s.tokens.size()), first);
  o.max_new_tokens = 0;
  EXPECT_TRUE(gen(prompt_, o).tokens.empty());
}

TEST_F(Generate, StopStringCutsTextAndStreamHoldsItBack) {
  GenerateOptions o;
  o.max_new_tokens = 16;
  GenerateResult r = gen(prompt_, o);
  ASSERT_GE(r.text.size(), 4u);
  // A stop string taken from the middle of the greedy text.
  size_t mid = r.text.size() / 2;
  while (mid > 0 && (static_cast<unsigned char>(r.text[mid]) & 0xC0) == 0x80) --mid;
  std::string stop = r.text.substr(mid, std::min<size_t>(3, r.text.size() - mid));
  size_t first = r.text.find(stop);
  o.stop_strings = {stop};
  std::vector<std::string> pieces;
  GenerateResult s = gen(prompt_, o, &pieces);
  EXPECT_EQ(s.stop_reason, "stop_string");
  EXPECT_EQ(s.text, r.text.substr(0, first));
  std::string streamed;
  for (const auto& p : pieces) streamed += p;
  EXPECT_EQ(streamed, s.text);
}

// Temperature 0 with a penalty is not plain greedy: every token is the penalised argmax (what the
// Sampler picks from the step's logits and the history), not the argmax of the logits. Each
// penalty on its own (the frequency penalty alone used to take the ids-only path and be skipped).
TEST_F(Generate, GreedyWithPenaltiesAppliesThem) {
  const int64_t V = model_->info().vocab;
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE("penalty " + std::to_string(which));
    GenerateOptions o;
    o.max_new_tokens = 16;
    o.stop_tokens = {};
    if (which == 0) o.sampling.frequency_penalty = 4.0f;
    if (which == 1) o.sampling.presence_penalty = 4.0f;
    if (which == 2) o.sampling.repetition_penalty = 3.0f;
    GenerateResult r = gen(prompt_, o);
    ASSERT_GT(r.tokens.size(), 1u);
    std::vector<int32_t> all = prompt_;
    all.insert(all.end(), r.tokens.begin(), r.tokens.end());
    std::vector<float> logits = score_tokens(*model_, all, static_cast<int64_t>(prompt_.size()), 0);
    Sampler ref(o.sampling);
    std::vector<int32_t> history = prompt_;
    int64_t moved = 0;  // tokens the penalty moved off the argmax
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      const float* row = logits.data() + (prompt_.size() - 1 + i) * V;
      EXPECT_EQ(r.tokens[i], ref.sample(row, V, history)) << "token " << i;
      moved += r.tokens[i] != std::max_element(row, row + V) - row;
      history.push_back(r.tokens[i]);
    }
    EXPECT_GT(moved, 0) << "the penalty changed no token: the check above could not fail";
  }
}

TEST_F(Generate, SeededSamplingIsDeterministic) {
  GenerateOptions o;
  o.max_new_tokens = 20;
  o.sampling.temperature = 1.0f;
  o.sampling.top_p = 0.95f;
  o.sampling.seed = 42;
  GenerateResult a = gen(prompt_, o), b = gen(prompt_, o);
  EXPECT_EQ(a.tokens, b.tokens);
  o.sampling.seed = 43;
  GenerateResult c = gen(prompt_, o);
  EXPECT_NE(a.tokens, c.tokens);
}

TEST_F(Generate, StreamingNeverSplitsACharacter) {
  // Sampling at a high temperature over a 1024-token vocabulary produces many byte-level pieces
  // of multi-byte characters; every streamed piece must still be valid UTF-8.
  GenerateOptions o;
  o.max_new_tokens = 64;
  o.sampling.temperature = 3.0f;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    o.sampling.seed = seed;
    std::vector<std::string> pieces;
    GenerateResult r = gen(prompt_, o, &pieces);
    std::string all;
    for (const auto& p : pieces) {
      EXPECT_TRUE(valid_utf8(p)) << "piece splits a character";
      all += p;
    }
    EXPECT_EQ(all, r.text);
  }
}

TEST_F(Generate, ContextLimitAndBadPrompt) {
  GenerateOptions o;
  o.context_limit = 8;
  EXPECT_THROW(gen(prompt_, o), Error);  // 8 prompt tokens leave no room
  o.context_limit = 12;
  o.max_new_tokens = 100;
  GenerateResult r = gen(prompt_, o);
  EXPECT_EQ(r.stop_reason == "eos" || r.stop_reason == "context_limit", true);
  EXPECT_LE(prompt_.size() + r.tokens.size(), 12u);
  EXPECT_THROW(gen({5, 5000}, GenerateOptions{}), Error);  // id outside the tiny vocabulary
}

TEST_F(Generate, SessionReusesThePrefix) {
  GenerateOptions o;
  o.max_new_tokens = 4;
  Session s = new_session(*model_, o);
  GenerateResult a = generate(*model_, s, prompt_, o, nullptr);
  std::vector<int32_t> longer = s.seq.tokens();
  longer.push_back(5);
  longer.push_back(6);
  GenerateResult b = generate(*model_, s, longer, o, nullptr);
  EXPECT_EQ(b.prompt_tokens, 2);
  EXPECT_EQ(b.reused_tokens, static_cast<int64_t>(longer.size()) - 2);
  Session fresh = new_session(*model_, o);
  GenerateResult c = generate(*model_, fresh, longer, o, nullptr);
  EXPECT_EQ(b.tokens, c.tokens);
}

// A follow-up prompt that diverges from the live sequence right after the previous prompt (as
// thinking mode does when it drops the reasoning) reuses the snapshot taken at the prompt's
// end, and prefills only the rest: same output as a fresh session.
TEST_F(Generate, SessionReusesThePromptSnapshot) {
  GenerateOptions o;
  o.max_new_tokens = 30;
  Session s = new_session(*model_, o);
  GenerateResult a = generate(*model_, s, prompt_, o, nullptr);
  ASSERT_GT(s.seq.pos(), static_cast<int64_t>(prompt_.size()) + kCheapRewind) << "needs a long first answer";
  std::vector<int32_t> next = prompt_;
  next.insert(next.end(), {9, 10, 11});
  GenerateResult b = generate(*model_, s, next, o, nullptr);
  EXPECT_EQ(b.reused_tokens, static_cast<int64_t>(prompt_.size()));
  EXPECT_EQ(b.prompt_tokens, 3);
  Session fresh = new_session(*model_, o);
  GenerateResult c = generate(*model_, fresh, next, o, nullptr);
  EXPECT_EQ(b.tokens, c.tokens);
}

// On a model whose MTP block often agrees with it (mtp_agreeing_model_dir), drafts are accepted
// and rejected in one run: the output is still exactly plain greedy's, every draft length.
TEST_F(Generate, AcceptedDraftsEqualPlainGreedy) {
  const std::string dir = mtp_agreeing_model_dir();
  ASSERT_FALSE(dir.empty());
  Engine m({.model_dir = dir, .tokenizer = tokenizer_dir() + "/tokenizer.json"});
  auto run = [&](const GenerateOptions& o) {
    Session s = new_session(m, o);
    return generate(m, s, prompt_, o, nullptr);
  };
  GenerateOptions plain;
  plain.max_new_tokens = 40;
  const GenerateResult want = run(plain);
  ASSERT_EQ(want.tokens.size(), 40u);
  for (int64_t n : {1, 2, 3, 5, 16}) {
    GenerateOptions o = plain;
    o.draft = n;
    const GenerateResult got = run(o);
    EXPECT_EQ(got.tokens, want.tokens) << "draft " << n;
    EXPECT_GT(got.accepted, 0) << "draft " << n;
    EXPECT_LT(got.accepted, got.drafted) << "draft " << n;
    EXPECT_EQ(got.accepted + got.steps + 1, static_cast<int64_t>(got.tokens.size())) << "draft " << n;
    std::printf("[draft %lld] %lld steps, %lld of %lld drafts accepted\n", static_cast<long long>(n),
                static_cast<long long>(got.steps), static_cast<long long>(got.accepted), static_cast<long long>(got.drafted));
  }
  // Sampling: a draft is kept while the sampler, run on each verified row in turn, picks it, so
  // the seeded output is the same as without drafts (the same picks from the same logits).
  for (uint64_t seed : {1u, 2u, 3u}) {
    GenerateOptions o = plain;
    o.sampling.temperature = 0.5f;
    o.sampling.seed = seed;
    const GenerateResult want_s = run(o);
    o.draft = 3;
    const GenerateResult got_s = run(o);
    EXPECT_EQ(got_s.tokens, want_s.tokens) << "seed " << seed;
    EXPECT_GT(got_s.accepted, 0) << "seed " << seed;
  }
  // A JSON answer: each verified row is masked after the picks before it (the constraint is
  // pushed as they are taken), so drafting changes nothing but the steps.
  for (float temperature : {0.0f, 0.7f}) {
    GenerateOptions o = plain;
    o.json = JsonGrammar::any_object();
    o.sampling.temperature = temperature;
    o.sampling.seed = 11;
    const GenerateResult want_j = run(o);
    ASSERT_FALSE(want_j.tokens.empty());
    const std::string text = m.tokenizer().decode(want_j.tokens);
    ASSERT_NE(text.find_first_not_of(" \t\r\n"), std::string::npos) << text;
    EXPECT_EQ(text[text.find_first_not_of(" \t\r\n")], '{') << text;
    o.draft = 3;
    const GenerateResult got_j = run(o);
    EXPECT_EQ(got_j.tokens, want_j.tokens) << "temperature " << temperature;
    EXPECT_GT(got_j.drafted, 0);
  }
}

// Greedy speculative decoding with MTP drafts gives exactly the plain greedy output, for every
// draft length, including across a multi-turn session (prefix reuse + drafting).
TEST_F(Generate, DraftEqualsPlainGreedy) {
  GenerateOptions plain;
  plain.max_new_tokens = 40;
  GenerateResult want = gen(prompt_, plain);
  ASSERT_GT(want.tokens.size(), 20u);
  for (int64_t n : {1, 2, 3, 5, 16}) {
    GenerateOptions o = plain;
    o.draft = n;
    GenerateResult got = gen(prompt_, o);
    EXPECT_EQ(got.tokens, want.tokens) << "draft " << n;
    EXPECT_EQ(got.stop_reason, want.stop_reason) << "draft " << n;
    EXPECT_EQ(got.accepted + got.steps + 1, static_cast<int64_t>(got.tokens.size()) + (got.stop_reason == "max_tokens" ? 0 : 1))
        << "each step yields its accepted drafts plus one token";
    EXPECT_LE(got.accepted, got.drafted);
  }
  // With penalties the sampler's choice depends on the history: still identical.
  plain.sampling.repetition_penalty = 1.3f;
  GenerateResult want_p = gen(prompt_, plain);
  GenerateOptions o = plain;
  o.draft = 4;
  EXPECT_EQ(gen(prompt_, o).tokens, want_p.tokens);
  // Follow-up turns in one session.
  Session a = new_session(*model_, o), b = new_session(*model_, plain);
  std::vector<int32_t> p = prompt_;
  for (int turn = 0; turn < 3; ++turn) {
    GenerateResult ra = generate(*model_, a, p, o, nullptr), rb = generate(*model_, b, p, plain, nullptr);
    EXPECT_EQ(ra.tokens, rb.tokens) << "turn " << turn;
    p = b.seq.tokens();
    p.insert(p.end(), {static_cast<int32_t>(40 + turn), 41});
  }
}
