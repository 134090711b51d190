// The CUDA backend end to end (model/cuda_backend.cpp): the golden cases at the CPU's
// thresholds, agreement with the CPU backend, and the invariants of tests/test_golden.cpp on the
// GPU (chunked prefill == decode == one-shot, fresh sequences, last-row logits), plus the
// backend's own limits (workspace pieces, context). Skipped without a CUDA device (label gpu).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "tools/npy.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "model/forward.h"
#include "test_cuda_model.h"
#include "test_cuda_util.h"
#include "test_util.h"
#include "tools/logits.h"

using namespace dsv4;
using namespace dsv4::testing;

namespace {

class CudaForward : public GpuTest {};

// context: positions a sequence may hold; max_chunk: the workspace (longer chunks go in pieces).
Model cuda_model_of(const std::string& dir, int64_t context, int64_t max_chunk = 512) {
  return cuda_model({.context = context, .max_chunk = max_chunk}, dir);
}

// score_tokens (engine/score.h) on a Model: the first `prefill` tokens in chunks of `chunk`
// (0 = one), the rest one at a time; all logits.
std::vector<float> score_tokens(const Model& m, const std::vector<int32_t>& tokens, int64_t prefill, int64_t chunk) {
  const int64_t T = static_cast<int64_t>(tokens.size()), V = m.config().vocab;
  std::vector<float> out(static_cast<size_t>(T * V));
  SequenceState st = m.new_sequence();
  const int64_t step = chunk == 0 ? std::max<int64_t>(prefill, 1) : chunk;
  for (int64_t p = 0; p < T;) {
    const int64_t n = p < prefill ? std::min(step, prefill - p) : 1;
    m.step(Stack::Main, {{&st, tokens.data() + p, n, Rows::All, out.data() + p * V, nullptr, nullptr}});
    p += n;
  }
  return out;
}

// One chunk at the sequence's next positions.
void feed(const Model& m, SequenceState& st, const int32_t* tokens, int64_t n, float* logits, Rows rows = Rows::All) {
  m.step(Stack::Main, {{&st, tokens, n, rows, logits, nullptr, nullptr}});
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b, int64_t T, int64_t V) {
  std::vector<double> e = rel_l2_rows(a.data(), b.data(), T, V);
  return *std::max_element(e.begin(), e.end());
}

int64_t argmax(const float* v, int64_t n) { return std::max_element(v, v + n) - v; }

// The case's golden thresholds (float64 reference) on the GPU logits, fed as test_golden.cpp
// feeds the CPU; and the GPU against the CPU backend: both are within the case's max of the
// reference, so within twice that of each other (the printed figure is the one to watch: the
// two differ only by summation order, expected ~1e-6 before amplification by FP8/FP4 rounding
// and top-k ties).
void run_golden_case(const std::string& name) {
  const std::string dir = golden_dir(name);
  if (dir.empty()) GTEST_SKIP() << "golden case " << name << " not present";
  const nlohmann::json cs = read_json(dir + "/case.json");
  const std::vector<int32_t> tokens = read_tokens(dir + "/tokens.txt");
  const NpyF32 want = read_npy_f32(dir + "/expected.npy");
  const int64_t T = static_cast<int64_t>(tokens.size()), prefill = cs["prefill"].get<int64_t>();

  Model gpu_model = cuda_model_of(dir + "/model", T);
  ASSERT_STREQ(gpu_model.device(), "cuda");
  const int64_t V = gpu_model.config().vocab;
  ASSERT_EQ(want.shape, (std::vector<int64_t>{T, V}));
  const std::vector<float> got = score_tokens(gpu_model, tokens, prefill, 0);
  for (float v : got) ASSERT_TRUE(std::isfinite(v)) << name << ": non-finite logit";

  std::vector<double> err = rel_l2_rows(got.data(), want.data.data(), T, V);
  std::sort(err.begin(), err.end());
  const double median = err[err.size() / 2], max = err.back();
  int64_t agree = 0;
  for (int64_t t = 0; t < T; ++t) agree += argmax(got.data() + t * V, V) == argmax(want.data.data() + t * V, V);
  const double pct = 100.0 * static_cast<double>(agree) / static_cast<double>(T);

  Model cpu_m = cpu_model(dir + "/model");
  const std::vector<float> cpu = score_tokens(cpu_m, tokens, prefill, 0);
  const double vs_cpu = max_rel(got, cpu, T, V);
  std::printf("[cuda golden %s] median rel L2 %.3g, max %.3g, argmax %.1f%%; vs CPU backend max %.3g\n", name.c_str(), median,
              max, pct, vs_cpu);
  EXPECT_LE(median, cs["pass"]["median_rel_l2"].get<double>());
  EXPECT_LE(max, cs["pass"]["max_rel_l2"].get<double>());
  EXPECT_GE(pct, cs["pass"]["argmax_pct"].get<double>());
  EXPECT_LE(vs_cpu, 2 * cs["pass"]["max_rel_l2"].get<double>());
}

}  // namespace

TEST_F(CudaForward, GoldenTinyNative) { run_golden_case("tiny-native"); }
TEST_F(CudaForward, GoldenTinyNvfp4Sharded) { run_golden_case("tiny-nvfp4-sharded"); }
TEST_F(CudaForward, GoldenTinyHfBf16Sharded) { run_golden_case("tiny-hf-bf16-sharded"); }
TEST_F(CudaForward, GoldenSmallNative) { run_golden_case("small-native"); }  // from ../shared when present

// Prefill chunk sizes 3, 7 and "all", all-decode (which is also chunk size 1: the same steps) and
// prefill-in-chunks-then-decode give the same logits on the GPU (the CPU's bound,
// tests/test_golden.cpp).
TEST_F(CudaForward, ChunkSizesAgree) {
  for (const char* name : {"tiny-native", "tiny-nvfp4-sharded"}) {
    const std::string dir = golden_dir(name);
    ASSERT_FALSE(dir.empty());
    const std::vector<int32_t> tokens = read_tokens(dir + "/tokens.txt");
    const int64_t T = static_cast<int64_t>(tokens.size());
    Model model = cuda_model_of(dir + "/model", T);
    const int64_t V = model.config().vocab;
    const std::vector<float> all = score_tokens(model, tokens, T, 0);
    for (int64_t chunk : {3, 7}) {
      const std::vector<float> got = score_tokens(model, tokens, T, chunk);
      EXPECT_LE(max_rel(got, all, T, V), 1e-5) << name << " chunk " << chunk;
    }
    EXPECT_LE(max_rel(score_tokens(model, tokens, 0, 0), all, T, V), 1e-5) << name << " all-decode";
    EXPECT_LE(max_rel(score_tokens(model, tokens, 23, 5), all, T, V), 1e-5) << name << " prefill 23 in chunks of 5, then decode";
  }
}

// A workspace smaller than the chunk: Model::step feeds it in pieces, same logits.
TEST_F(CudaForward, WorkspacePiecesEqualOneShot) {
  const std::string dir = golden_dir("tiny-native");
  const std::vector<int32_t> tokens = read_tokens(dir + "/tokens.txt");
  const int64_t T = static_cast<int64_t>(tokens.size());
  Model big = cuda_model_of(dir + "/model", T), small = cuda_model_of(dir + "/model", T, 8);
  const int64_t V = big.config().vocab;
  EXPECT_LE(max_rel(score_tokens(small, tokens, T, 0), score_tokens(big, tokens, T, 0), T, V), 1e-5);
  // Rows::Last of a split chunk is the last row of All.
  SequenceState a = small.new_sequence(), b = small.new_sequence();
  std::vector<float> all(static_cast<size_t>(30 * V)), last(static_cast<size_t>(V));
  feed(small, a, tokens.data(), 30, all.data());
  feed(small, b, tokens.data(), 30, last.data(), Rows::Last);
  EXPECT_EQ(std::vector<float>(all.end() - V, all.end()), last);
}

// Fresh device state per sequence: scoring twice gives identical logits.
TEST_F(CudaForward, SequencesDoNotLeak) {
  const std::string dir = golden_dir("tiny-native");
  const std::vector<int32_t> tokens = read_tokens(dir + "/tokens.txt");
  Model model = cuda_model_of(dir + "/model", static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(score_tokens(model, tokens, 40, 0), score_tokens(model, tokens, 40, 0));
}

// Past the context the caches were sized for: a clear error, not a write out of bounds; and a
// CPU sequence is refused.
TEST_F(CudaForward, ContextLimitAndForeignState) {
  const std::string dir = golden_dir("tiny-native");
  const std::vector<int32_t> tokens = read_tokens(dir + "/tokens.txt");
  Model model = cuda_model_of(dir + "/model", 16);
  SequenceState st = model.new_sequence();
  std::vector<float> logits(static_cast<size_t>(model.config().vocab));
  feed(model, st, tokens.data(), 16, logits.data(), Rows::Last);
  EXPECT_THROW(feed(model, st, tokens.data() + 16, 1, logits.data()), Error);
  Model cpu = cpu_model(dir + "/model");
  SequenceState cpu_st = cpu.new_sequence();
  EXPECT_THROW(feed(model, cpu_st, tokens.data(), 1, logits.data()), Error);
}
