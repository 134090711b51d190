// Sampling on the device (gpu::sample_rows, kernels/cuda/sampling.cu) picks the token the CPU's
// sample_logits (core/sampling.h; what engine/sampler.cpp's Sampler::sample does after the
// penalties) picks for the same logits and the same uniform number, over many parameter sets and
// draws. Skipped without a CUDA device (label gpu); on the emulator the device exp is glibc's, so
// the ids must be equal; on a GPU a last-bit difference of exp could move a pick that sits on a
// boundary (docs/cuda.md), so the test reports mismatches rather than expecting none there.
#include <random>

#include "core/sampling.h"
#include "test_cuda_util.h"

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

// sample_rows trusts its caller (the parameters are device data): the caller checks each row's
// candidates against this limit (topk_rows' 4096) before choosing the device.
TEST_F(CudaSample, MaxCandidatesIsTopkLimit) {
  EXPECT_EQ(gpu::sample_max_candidates(1024), 1024);
  EXPECT_EQ(gpu::sample_max_candidates(129280), 4096);
  EXPECT_EQ(sample_candidates(SampleRow{0.0, 0, 1.0f}, 129280), 129280);
  EXPECT_EQ(sample_candidates(SampleRow{0.0, 50, 1.0f}, 129280), 50);
}
