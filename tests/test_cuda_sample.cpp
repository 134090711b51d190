// Sampling on the device (gpu::sample_rows, kernels/cuda/sampling.cu) picks the token the CPU's
// sample_logits (core/sampling.h; what engine/sampler.cpp's Sampler::sample does after the
// penalties) picks for the same logits and the same uniform number, over many parameter sets and
// draws. Skipped without a CUDA device (label gpu); on the emulator the device exp is glibc's, so
// the ids must be equal; on a GPU a last-bit difference of exp could move a pick that sits on a
// boundary (docs/cuda.md), so the test reports mismatches rather than expecting none there.
#include <algorithm>
#include <random>

#include "backends/cuda/cuda_backend.h"
#include "core/sampling.h"
#include "model/forward.h"
#include "test_cuda_model.h"
#include "test_cuda_util.h"
#include "test_util.h"
#if defined(DSV4_CUDA_EMU)
#include "kernels/cuda_emu/control.h"
#endif

using namespace dsv4;
using namespace dsv4::testing;

namespace {

class CudaSample : public GpuTest {};

// Logits with ties (a coarse grid) and a spread of scales, so top-k cuts, ties to the lower id and
// top-p / min-p cut-offs all happen.
std::vector<float> random_logits(int64_t rows, int64_t V, std::mt19937& g) {
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(rows * V));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < V; ++i) {
      float v = d(g);
      if (r % 2 == 1) v = std::round(v * 4.0f) / 4.0f;  // many ties
      x[static_cast<size_t>(r * V + i)] = v;
    }
  return x;
}

}  // namespace

TEST_F(CudaSample, DeviceIdsEqualCpuSampler) {
  std::mt19937 g(2024);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  const std::vector<SampleRow> params = {
      {0.0, 0, 0.0f, 1.0f, 0.0f},    // greedy
      {0.0, 0, 1.0f, 1.0f, 0.0f},    // plain temperature over every candidate
      {0.0, 0, 0.7f, 0.9f, 0.0f},    // top-p
      {0.0, 40, 0.8f, 1.0f, 0.0f},   // top-k
      {0.0, 40, 1.3f, 0.95f, 0.05f}, // all three
      {0.0, 1, 1.0f, 1.0f, 0.0f},    // top-k 1
      {0.0, 0, 0.05f, 0.5f, 0.0f},   // nearly greedy
      {0.0, 0, 2.0f, 1.0f, 0.2f},    // min-p
      {0.0, 5000, 1.0f, 0.3f, 0.0f}, // top-k past the vocabulary: every candidate
  };
  int64_t checked = 0, mismatches = 0;
  for (const int64_t V : {int64_t{1024}, int64_t{3001}}) {
    const int64_t rows = 6;
    for (const SampleRow& base : params) {
      for (int rep = 0; rep < 3; ++rep) {
        const std::vector<float> x = random_logits(rows, V, g);
        std::vector<SampleRow> rp(static_cast<size_t>(rows), base);
        for (SampleRow& r : rp) r.u = uni(g);
        rp[0].u = 0.0;           // the first candidate's edge
        rp[1].u = 0.9999999999;  // the last kept candidate
        const int64_t K = gpu::sample_max_candidates(V);
        gpu::DeviceBuffer dx = dev(x), dp = dev(rp), idx(static_cast<size_t>(rows * K) * sizeof(int32_t)),
                          cnt(static_cast<size_t>(rows) * sizeof(int32_t)), prob(static_cast<size_t>(rows * K) * sizeof(double)),
                          out(static_cast<size_t>(rows) * sizeof(int32_t));
        gpu::sample_rows(dx.as<float>(), rows, V, V, dp.as<SampleRow>(), idx.as<int32_t>(), cnt.as<int32_t>(), prob.as<double>(),
                         out.as<int32_t>());
        const std::vector<int32_t> got = gpu::to_host<int32_t>(out, static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) {
          const int32_t want = sample_logits(x.data() + r * V, V, rp[static_cast<size_t>(r)]);
          ++checked;
          if (got[static_cast<size_t>(r)] != want) ++mismatches;
#if defined(DSV4_CUDA_EMU)
          EXPECT_EQ(got[static_cast<size_t>(r)], want) << "V " << V << ", temperature " << base.temperature << ", top-k "
                                                       << base.top_k << ", top-p " << base.top_p << ", min-p " << base.min_p
                                                       << ", row " << r << ", u " << rp[static_cast<size_t>(r)].u;
#endif
        }
      }
    }
  }
  std::printf("[cuda sample] %lld picks, %lld differ from the CPU\n", static_cast<long long>(checked),
              static_cast<long long>(mismatches));
#if !defined(DSV4_CUDA_EMU)
  EXPECT_LE(mismatches * 100, checked) << "more than 1% of picks differ: not a last-bit exp difference";
#endif
}

// The sampled step tail (StepPlan::Tail::Sample; SeqInput::sample): decode steps of the tiny model
// whose rows carry SampleRows (uploaded with the token ids) pick, on a graph backend (captured on
// the first step of each bucket and tail, replayed after), the ids an eager backend's sampled
// steps pick, which are sample_logits (the CPU sampler's pick) of an eager backend's logits for
// the same rows. Rows mix greedy and sampled parameters; batches of 3 (padded to 4) and 1; steps
// of greedy ids and of logits in between, so a sample graph is replayed after other tails ran.
TEST_F(CudaSample, SampledStepsEqualEagerAndCpuSampler) {
  const Model graphs = cuda_model({.context = 64, .graphs = true}), eager = cuda_model({.context = 64, .graphs = false});
  const int64_t V = graphs.config().vocab;
  ASSERT_LE(V, gpu::sample_max_candidates(V));  // every parameter set below fits the kernel
  constexpr int kSeqs = 3;
  std::mt19937 g(77);
  std::uniform_int_distribution<int32_t> tok(2, static_cast<int32_t>(V - 1));
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  // a: graph steps that sample, b: eager steps that sample, c: eager steps that return logits.
  std::vector<SequenceState> a, b, c;
  std::vector<float> scratch(static_cast<size_t>(V));
  for (int i = 0; i < kSeqs; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(4 + i));
    for (int32_t& t : prompt) t = tok(g);
    a.push_back(graphs.new_sequence()), b.push_back(eager.new_sequence()), c.push_back(eager.new_sequence());
    const int64_t n = static_cast<int64_t>(prompt.size());
    graphs.step(Stack::Main, {{&a.back(), prompt.data(), n, Rows::None, nullptr, nullptr, nullptr}});
    eager.step(Stack::Main, {{&b.back(), prompt.data(), n, Rows::None, nullptr, nullptr, nullptr}});
    eager.step(Stack::Main, {{&c.back(), prompt.data(), n, Rows::Last, scratch.data(), nullptr, nullptr}});
  }
  // Per sequence: greedy, temperature + top-k, temperature + top-p + min-p.
  const SampleRow kinds[kSeqs] = {{0.0, 0, 0.0f, 1.0f, 0.0f}, {0.0, 50, 0.8f, 1.0f, 0.0f}, {0.0, 0, 1.5f, 0.9f, 0.01f}};
  // Each step: its sequences and its tail (0 sampled, 1 greedy ids, 2 logits).
  struct Plan {
    std::vector<int> seqs;
    int tail;
  };
  const std::vector<Plan> schedule = {{{0, 1, 2}, 0}, {{0, 1, 2}, 0}, {{0, 1, 2}, 1}, {{0, 1, 2}, 0}, {{1}, 0}, {{2}, 0},
                                      {{0, 1, 2}, 2}, {{2, 0, 1}, 0}, {{1}, 1},       {{1}, 0},       {{0, 1, 2}, 0}};
#if defined(DSV4_CUDA_EMU)
  emu::reset_stats();
#endif
  int64_t sampled = 0, not_argmax = 0;
  for (size_t step = 0; step < schedule.size(); ++step) {
    const Plan& p = schedule[step];
    const size_t n = p.seqs.size();
    std::vector<int32_t> x(n), got(n, -1), eager_ids(n, -1);
    std::vector<SampleRow> rows(n);
    std::vector<float> got_logits(n * static_cast<size_t>(V)), want(n * static_cast<size_t>(V));
    std::vector<SeqInput> ga, eb, ec;
    for (size_t k = 0; k < n; ++k) {
      const int i = p.seqs[k];
      x[k] = tok(g);
      rows[k] = kinds[i];
      rows[k].u = step % 4 == 1 && k == 0 ? 0.0 : step % 4 == 3 && k == 0 ? 0.9999999999 : uni(g);  // the edges too
      const SampleRow* smp = p.tail == 0 ? &rows[k] : nullptr;
      float* lo = p.tail == 2 ? got_logits.data() + k * V : nullptr;
      ga.push_back({&a[i], &x[k], 1, Rows::Last, lo, nullptr, nullptr, p.tail == 2 ? nullptr : &got[k], smp});
      eb.push_back({&b[i], &x[k], 1, Rows::Last, nullptr, nullptr, nullptr, &eager_ids[k], smp});
      ec.push_back({&c[i], &x[k], 1, Rows::Last, want.data() + k * V, nullptr, nullptr});
    }
    graphs.step(Stack::Main, ga);
    eager.step(Stack::Main, eb);
    eager.step(Stack::Main, ec);
    for (size_t k = 0; k < n; ++k) {
      const float* l = want.data() + k * V;
      const int32_t argmax = static_cast<int32_t>(std::max_element(l, l + V) - l);
      const int32_t cpu = p.tail == 0 ? sample_logits(l, V, rows[k]) : argmax;
      SCOPED_TRACE("step " + std::to_string(step) + ", sequence " + std::to_string(p.seqs[k]) + ", tail " + std::to_string(p.tail));
      if (p.tail == 2) {
        EXPECT_EQ(std::vector<float>(got_logits.begin() + k * V, got_logits.begin() + (k + 1) * V), std::vector<float>(l, l + V));
        continue;
      }
      EXPECT_EQ(eager_ids[k], cpu);
      EXPECT_EQ(got[k], cpu);
      if (p.tail == 0 && rows[k].temperature > 0) ++sampled, not_argmax += cpu != argmax;
    }
  }
  // The sampled rows are not greedy picks in disguise (else an argmax tail would pass).
  EXPECT_GT(not_argmax * 3, sampled) << not_argmax << " of " << sampled << " sampled picks are not the argmax";
#if defined(DSV4_CUDA_EMU)
  // One launch per graph step; a capture per (bucket, tail) seen: (4, sampled), (4, ids),
  // (1, sampled), (4, logits), (1, ids).
  const emu::Stats st = emu::stats();
  EXPECT_EQ(st.graph_launches, schedule.size());
  EXPECT_EQ(st.graph_captures, 5u);
#endif
}

// sample_rows trusts its caller (the parameters are device data): the caller checks each row's
// candidates against this limit (topk_rows' 4096) before choosing the device.
TEST_F(CudaSample, MaxCandidatesIsTopkLimit) {
  EXPECT_EQ(gpu::sample_max_candidates(1024), 1024);
  EXPECT_EQ(gpu::sample_max_candidates(129280), 4096);
  EXPECT_EQ(sample_candidates(SampleRow{0.0, 0, 1.0f}, 129280), 129280);
  EXPECT_EQ(sample_candidates(SampleRow{0.0, 50, 1.0f}, 129280), 50);
}
