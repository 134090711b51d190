// End-to-end: golden logits, and the invariants chunked prefill == decode == one-shot forward,
// sharded == single-file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "forwarding_backend.h"
#include "test_util.h"
#include "tools/logits.h"
#include "tools/npy.h"
#include "io/safetensors.h"
#include "kernels/cpu/qmatmul.h"
#include "backends/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/score.h"
#include "model/forward.h"

using namespace dsv4;
using namespace dsv4::testing;

namespace {

int64_t argmax(const float* v, int64_t n) { return std::max_element(v, v + n) - v; }

void run_golden_case(const std::string& name) {
  std::string dir = golden_dir(name);
  if (dir.empty()) GTEST_SKIP() << "golden case " << name << " not present";
  nlohmann::json cs = read_json(dir + "/case.json");
  std::vector<int32_t> tokens = read_tokens(dir + "/tokens.txt");
  NpyF32 want = read_npy_f32(dir + "/expected.npy");
  const int64_t T = static_cast<int64_t>(tokens.size());
  ASSERT_EQ(want.shape.size(), 2u);
  ASSERT_EQ(want.shape[0], T);

  Engine model({.model_dir = dir + "/model"});
  const int64_t V = model.info().vocab;
  ASSERT_EQ(want.shape[1], V);
  std::vector<float> got = score_tokens(model, tokens, cs["prefill"].get<int64_t>(), 0);
  std::vector<double> err = rel_l2_rows(got.data(), want.data.data(), T, V);
  std::vector<double> sorted = err;
  std::sort(sorted.begin(), sorted.end());
  double median = sorted[sorted.size() / 2], max = sorted.back();
  int64_t agree = 0;
  for (int64_t t = 0; t < T; ++t) agree += argmax(got.data() + t * V, V) == argmax(want.data.data() + t * V, V);
  double pct = 100.0 * static_cast<double>(agree) / static_cast<double>(T);
  const double p99 = sorted[static_cast<size_t>(0.99 * static_cast<double>(sorted.size() - 1))];
  std::printf("[golden %s] median rel L2 %.3g, p99 %.3g, max %.3g, argmax %.1f%%\n", name.c_str(), median, p99, max, pct);
  EXPECT_LE(median, cs["pass"]["median_rel_l2"].get<double>());
  if (cs["pass"].contains("p99_rel_l2")) {
    EXPECT_LE(p99, cs["pass"]["p99_rel_l2"].get<double>());
  }
  EXPECT_LE(max, cs["pass"]["max_rel_l2"].get<double>());
  EXPECT_GE(pct, cs["pass"]["argmax_pct"].get<double>());
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b, int64_t T, int64_t V) {
  std::vector<double> e = rel_l2_rows(a.data(), b.data(), T, V);
  return *std::max_element(e.begin(), e.end());
}

}  // namespace

TEST(Golden, TinyNative) { run_golden_case("tiny-native"); }
TEST(Golden, TinyNvfp4Sharded) { run_golden_case("tiny-nvfp4-sharded"); }
TEST(Golden, TinyHfBf16Sharded) { run_golden_case("tiny-hf-bf16-sharded"); }
TEST(Golden, SmallNative) { run_golden_case("small-native"); }  // from ../shared when present
// V4-Flash attention settings (window 128, ratios 4 and 128, index top-k 512, 64 index heads x
// 128) over 3,000 tokens: from ~2,048 on the indexer's top-k drops compressed entries.
TEST(Golden, LongFlashAttn) { run_golden_case("long-flash-attn"); }  // from ../shared when present

// At those settings, past 2,048 tokens: one shot == prefill in chunks == token-by-token decode,
// bitwise, and a rewind there + new tokens == fresh.
TEST(Invariants, LongContextAtRealSettings) {
  const std::string dir = golden_dir("long-flash-attn");
  if (dir.empty()) GTEST_SKIP() << "long-flash-attn not present";
  Engine e({.model_dir = dir + "/model"});
  const std::vector<int32_t> tokens = read_tokens(dir + "/tokens.txt");
  const int64_t T = static_cast<int64_t>(tokens.size()), V = e.info().vocab;
  ASSERT_GT(T, 2048);
  const std::vector<float> all = score_tokens(e, tokens, T, 0);
  EXPECT_EQ(score_tokens(e, tokens, T, 333), all) << "prefill in chunks of 333";
  EXPECT_EQ(score_tokens(e, tokens, 2100, 0), all) << "prefill 2100, then decode";
  EXPECT_EQ(score_tokens(e, tokens, 0, 0), all) << "every token decoded";
  // Rewind 12 tokens at position 2,600 and feed other tokens: == a fresh sequence.
  std::vector<int32_t> other(tokens.begin() + 100, tokens.begin() + 140);
  Sequence s = e.new_sequence(), f = e.new_sequence();
  e.step({{&s, std::vector<int32_t>(tokens.begin(), tokens.begin() + 2600), Rows::None}});
  e.truncate(s, 2588);
  e.step({{&f, std::vector<int32_t>(tokens.begin(), tokens.begin() + 2588), Rows::None}});
  EXPECT_EQ(e.step({{&s, other, Rows::All}})[0].logits, e.step({{&f, other, Rows::All}})[0].logits);
  (void)V;
}

namespace {

// The CPU backend taking routed experts one at a time and running matmuls one by one (what a
// backend with one expert's rows of workspace and no grouped matmuls does).
class OneExpertAtATime final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  int64_t expert_rows_at_once(const Step&) const override { return 1; }
};

// Every position's logits of `tokens` as one prompt (one step), then three sequences decoding
// one token each per step.
std::vector<float> prompt_and_batch(const Model& m, const std::vector<int32_t>& tokens) {
  const int64_t V = m.config().vocab, T = static_cast<int64_t>(tokens.size());
  std::vector<float> out(static_cast<size_t>((T + 3 * 4) * V));
  SequenceState st = m.new_sequence();
  m.step(Stack::Main, {{&st, tokens.data(), T, Rows::All, out.data(), nullptr, nullptr}});
  std::vector<SequenceState> seqs;
  for (int b = 0; b < 3; ++b) seqs.push_back(m.fork(st));
  for (int64_t i = 0; i < 4; ++i) {
    std::vector<SeqInput> in;
    for (int64_t b = 0; b < 3; ++b)
      in.push_back({&seqs[b], tokens.data() + (b * 5 + i) % T, 1, Rows::Last, out.data() + (T + i * 3 + b) * V, nullptr, nullptr});
    m.step(Stack::Main, in);
  }
  return out;
}

}  // namespace

// The MoE sublayer takes routed experts in runs of consecutive ids (Backend::expert_rows_at_once)
// and their matmuls together (Backend::matmuls): the logits must be bit-identical to taking
// one expert and one matmul at a time, for a prompt and for a batch of decoding sequences.
TEST(Invariants, ExpertRunsEqualOneExpertAtATime) {
  for (const char* name : {"tiny-native", "tiny-nvfp4-sharded"}) {
    const std::string dir = golden_dir(name);
    ASSERT_FALSE(dir.empty());
    const std::vector<int32_t> tokens = read_tokens(dir + "/tokens.txt");
    const Model grouped(load_model(dir + "/model"), [](const ModelWeights& w) { return make_cpu_backend(w); });
    const Model single(load_model(dir + "/model"), [](const ModelWeights& w) {
      return std::make_unique<OneExpertAtATime>(make_cpu_backend(w));
    });
    const std::vector<float> a = prompt_and_batch(grouped, tokens), b = prompt_and_batch(single, tokens);
    EXPECT_TRUE(a == b) << name;
  }
}

// Prefill chunk sizes 1, 3, 7 and "all" give the same logits, and so does decoding every token.
TEST(Invariants, ChunkSizesAgree) {
  for (const char* name : {"tiny-native", "tiny-nvfp4-sharded"}) {
    std::string dir = golden_dir(name);
    ASSERT_FALSE(dir.empty());
    Engine model({.model_dir = dir + "/model"});
    std::vector<int32_t> tokens = read_tokens(dir + "/tokens.txt");
    const int64_t T = static_cast<int64_t>(tokens.size()), V = model.info().vocab;
    std::vector<float> all = score_tokens(model, tokens, T, 0);
    for (int64_t chunk : {1, 3, 7}) {
      std::vector<float> got = score_tokens(model, tokens, T, chunk);
      EXPECT_LE(max_rel(got, all, T, V), 1e-5) << name << " chunk " << chunk;
    }
    std::vector<float> decode = score_tokens(model, tokens, 0, 0);
    EXPECT_LE(max_rel(decode, all, T, V), 1e-5) << name << " all-decode";
    std::vector<float> mixed = score_tokens(model, tokens, 23, 5);
    EXPECT_LE(max_rel(mixed, all, T, V), 1e-5) << name << " prefill 23 in chunks of 5, then decode";
  }
}

// A fresh sequence state per prompt: scoring twice gives identical logits (no state leaks
// between sequences, e.g. the ratio-4 compressor's previous block).
TEST(Invariants, SequencesDoNotLeak) {
  std::string dir = golden_dir("tiny-native");
  Engine model({.model_dir = dir + "/model"});
  std::vector<int32_t> tokens = read_tokens(dir + "/tokens.txt");
  std::vector<float> a = score_tokens(model, tokens, 40, 0);
  std::vector<float> b = score_tokens(model, tokens, 40, 0);
  EXPECT_EQ(a, b);
}

// The same tensors split over 3 shards (with an index) give bit-identical logits.
TEST(Invariants, ShardedEqualsSingleFile) {
  std::string src = golden_dir("tiny-native");
  std::string out = temp_dir("shard3");
  {
    auto f = SafeTensorsFile::open(src + "/model/model.safetensors");
    SafeTensorsWriter w;
    for (const auto& [name, t] : f->tensors()) w.add(name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
    w.write(out, 3);
  }
  std::filesystem::copy_file(src + "/model/config.json", out + "/config.json");
  ASSERT_TRUE(std::filesystem::exists(out + "/model.safetensors.index.json"));
  std::vector<int32_t> tokens = read_tokens(src + "/tokens.txt");
  Engine single({.model_dir = src + "/model"});
  Engine sharded({.model_dir = out});
  EXPECT_EQ(TensorStore::open_dir(out).files().size(), 3u);
  EXPECT_EQ(score_tokens(single, tokens, 40, 0), score_tokens(sharded, tokens, 40, 0));
  std::filesystem::remove_all(out);
}

// Weights read into memory give bit-identical logits to weights mapped from the files.
TEST(Invariants, ReadEqualsMmap) {
  std::string dir = golden_dir("tiny-nvfp4-sharded");
  std::vector<int32_t> tokens = read_tokens(dir + "/tokens.txt");
  Engine mapped({.model_dir = dir + "/model", .load = WeightLoad::Mmap});
  Engine read({.model_dir = dir + "/model", .load = WeightLoad::Read});
  EXPECT_EQ(read.info().load, "read");
  EXPECT_EQ(mapped.info().load, "mmap");
  EXPECT_EQ(score_tokens(mapped, tokens, 40, 0), score_tokens(read, tokens, 40, 0));
}

// Every kernel variant: golden logits and chunk invariance with each ISA forced.
TEST(Invariants, EveryIsaPassesGoldenAndChunking) {
  for (Isa isa : {Isa::Scalar, Isa::AVX2, Isa::AVX512}) {
    if (!isa_supported(isa)) {
      std::printf("[isa %s] not supported by this CPU: skipped\n", isa_name(isa));
      continue;
    }
    set_isa_override(isa);
    SCOPED_TRACE(isa_name(isa));
    for (const char* name : {"tiny-native", "tiny-nvfp4-sharded", "tiny-hf-bf16-sharded"}) run_golden_case(name);
    std::string dir = golden_dir("tiny-native");
    Engine model({.model_dir = dir + "/model"});
    std::vector<int32_t> tokens = read_tokens(dir + "/tokens.txt");
    const int64_t T = static_cast<int64_t>(tokens.size()), V = model.info().vocab;
    std::vector<float> all = score_tokens(model, tokens, T, 0);
    for (int64_t chunk : {1, 7}) EXPECT_LE(max_rel(score_tokens(model, tokens, T, chunk), all, T, V), 1e-5) << "chunk " << chunk;
  }
  clear_isa_override();
}

TEST(Invariants, LastLogitsEqualLastRowOfAll) {
  std::string dir = golden_dir("tiny-native");
  Engine model({.model_dir = dir + "/model"});
  std::vector<int32_t> tokens = read_tokens(dir + "/tokens.txt");
  const int64_t T = 30, V = model.info().vocab;
  Sequence a = model.new_sequence(), b = model.new_sequence();
  std::vector<int32_t> head(tokens.begin(), tokens.begin() + T);
  std::vector<float> all = model.step({{&a, head, Rows::All}})[0].logits;
  std::vector<float> last = model.step({{&b, head, Rows::Last}})[0].logits;
  ASSERT_EQ(static_cast<int64_t>(all.size()), T * V);
  EXPECT_EQ(std::vector<float>(all.end() - V, all.end()), last);
}
