#pragma once
// Shared helpers of the GPU tests (tests/test_cuda_*.cpp, ctest label "gpu"): a fixture that
// skips every test when no CUDA device is usable, device<->host copies, random inputs (random
// stored weights of every format: test_weights.h). Plain C++: the CUDA side is behind src/cuda/cuda_ops.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/weight.h"
#include "kernels/cuda/cuda_ops.h"
#include "test_weights.h"

namespace dsv4::testing {

// Every GPU test derives from this: without a device (no driver, no GPU, CUDA_VISIBLE_DEVICES
// empty) the test is reported as skipped, never as passed.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu::device_available()) GTEST_SKIP() << gpu::device_summary();
  }
  void TearDown() override {
    // Surface asynchronous faults in the test that caused them.
    if (gpu::device_available()) gpu::synchronize();
  }
};

template <class T>
gpu::DeviceBuffer dev(const std::vector<T>& v) {
  return gpu::to_device(v);
}

inline std::vector<float> host_f(const gpu::DeviceBuffer& b, size_t n) {
  gpu::synchronize();
  return gpu::to_host<float>(b, n);
}

inline std::vector<int32_t> host_i(const gpu::DeviceBuffer& b, size_t n) {
  gpu::synchronize();
  return gpu::to_host<int32_t>(b, n);
}

inline std::vector<uint8_t> host_u8(const gpu::DeviceBuffer& b, size_t n) {
  gpu::synchronize();
  return gpu::to_host<uint8_t>(b, n);
}

// A device buffer of n floats filled with NaN (0xFF bytes), so unwritten outputs stand out.
inline gpu::DeviceBuffer dev_nan(size_t n) {
  gpu::DeviceBuffer b(n * sizeof(float));
  b.fill_bytes(0xFF);
  return b;
}

inline std::vector<float> randv(std::mt19937& g, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Counts |got - want| > atol + rtol * |want| (NaN counts as bad) and reports the first few.
inline int count_bad(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                     const std::string& what, int report = 5) {
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(diff <= atol + rtol * std::fabs(static_cast<double>(want[i])))) {
      if (bad++ < report) ADD_FAILURE() << what << ": [" << i << "] got " << got[i] << " want " << want[i];
    }
  }
  return bad;
}

}  // namespace dsv4::testing
