// The MoE dispatch's row ops (src/cuda/rows.cu) against what the CPU expert loop does
// (model/cpu_backend.cpp run_moe): gather a token list's rows, add an expert's outputs back into
// them, scale. Plain copies and single float ops: bit-exact. Skipped without a CUDA device.
#include <algorithm>
#include <numeric>

#include "test_cuda_util.h"

using namespace dsv4;
using namespace dsv4::testing;

namespace {

class CudaRows : public GpuTest {};

// A sorted list of n distinct rows out of T (an expert's tokens).
std::vector<int32_t> some_rows(std::mt19937& g, int64_t T, int64_t n) {
  std::vector<int32_t> all(static_cast<size_t>(T));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), g);
  all.resize(static_cast<size_t>(n));
  std::sort(all.begin(), all.end());
  return all;
}

}  // namespace

TEST_F(CudaRows, GatherMatchesCopy) {
  std::mt19937 g(11);
  for (auto [T, n, cols, ld] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 1, 7, 7}, {9, 4, 33, 40}, {300, 123, 7168, 7168}}) {
    const std::vector<float> x = randv(g, static_cast<size_t>(T * ld));
    const std::vector<int32_t> idx = some_rows(g, T, n);
    std::vector<float> want(static_cast<size_t>(n * cols));
    for (int64_t r = 0; r < n; ++r) std::copy(x.begin() + idx[r] * ld, x.begin() + idx[r] * ld + cols, want.begin() + r * cols);
    gpu::DeviceBuffer dx = dev(x), didx = dev(idx), dy = dev_nan(want.size());
    gpu::gather_rows(dx.as<float>(), ld, didx.as<int32_t>(), n, cols, dy.as<float>(), cols);
    EXPECT_EQ(host_f(dy, want.size()), want) << "T=" << T << " n=" << n;
  }
}

TEST_F(CudaRows, ScatterAddMatchesCpuAccumulation) {
  std::mt19937 g(12);
  for (auto [T, n, cols] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 5}, {17, 6, 129}, {300, 200, 7168}}) {
    std::vector<float> out = randv(g, static_cast<size_t>(T * cols));
    const std::vector<float> y = randv(g, static_cast<size_t>(n * cols));
    const std::vector<int32_t> idx = some_rows(g, T, n);
    gpu::DeviceBuffer dout = dev(out), dy = dev(y), didx = dev(idx);
    gpu::scatter_add_rows(dy.as<float>(), cols, didx.as<int32_t>(), n, cols, dout.as<float>(), cols);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < cols; ++c) out[idx[r] * cols + c] += y[r * cols + c];
    const std::vector<float> got = host_f(dout, out.size());
    for (size_t i = 0; i < out.size(); ++i) ASSERT_TRUE(same_bits(got[i], out[i])) << "T=" << T << " [" << i << "]";
  }
}

TEST_F(CudaRows, ScaleIsOneMultiply) {
  std::mt19937 g(13);
  std::vector<float> x = randv(g, 1000, -100.0f, 100.0f);
  const float s = 0.0220970869f;
  gpu::DeviceBuffer dx = dev(x);
  gpu::scale(dx.as<float>(), static_cast<int64_t>(x.size()), s);
  for (float& v : x) v *= s;
  const std::vector<float> got = host_f(dx, x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same_bits(got[i], x[i])) << i;
}
