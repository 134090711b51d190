#pragma once
// Shared helpers of the GPU tests (tests/test_cuda_*.cpp, ctest label "gpu"): a fixture that
// skips every test when no CUDA device is usable, device<->host copies, random inputs and
// random stored weights of every format. Plain C++: the CUDA side is behind src/cuda/cuda_ops.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/weight.h"
#include "cuda/cuda_ops.h"

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

// A stored weight with the bytes it views.
struct OwnedWeight {
  std::vector<uint8_t> data, scale;
  QWeight w;
};

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// E4M3 byte that is not a NaN code (0x7F / 0xFF): the GPU decodes those as +-480 like the CPU
// qmatmul, while dequant_row gives NaN.
inline uint8_t finite_e4m3(uint32_t v) {
  const auto b = static_cast<uint8_t>(v);
  return (b & 0x7F) == 0x7F ? static_cast<uint8_t>(b ^ 0x01) : b;
}

// Random payload and scales covering each format's range: F16 subnormals, every E4M3 code but
// NaN, MXFP4 scales 2^-127 (a float subnormal) and 2^-126, NVFP4 scales over all of E4M3.
inline OwnedWeight make_weight(WFormat fmt, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 g(seed);
  auto u = [&](uint32_t n) { return static_cast<uint32_t>(g() % n); };
  OwnedWeight o;
  QWeight& w = o.w;
  w.fmt = fmt;
  w.rows = rows;
  w.cols = cols;
  w.name = std::string("gpu-test.") + wformat_name(fmt);
  const auto n = static_cast<size_t>(rows * cols);
  switch (fmt) {
    case WFormat::F32: {
      o.data.resize(n * 4);
      std::uniform_real_distribution<float> d(-1.0f, 1.0f);
      for (size_t i = 0; i < n; ++i) {
        const float f = d(g);
        std::memcpy(&o.data[i * 4], &f, 4);
      }
      break;
    }
    case WFormat::BF16:
    case WFormat::F16: {
      o.data.resize(n * 2);
      std::uniform_real_distribution<float> d(-2.0f, 2.0f);
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        if (fmt == WFormat::BF16) {
          const float f = d(g);
          uint32_t b;
          std::memcpy(&b, &f, 4);
          h = static_cast<uint16_t>(b >> 16);
        } else {
          h = static_cast<uint16_t>((u(2) << 15) | (u(21) << 10) | u(1024));  // exponents 0..20
        }
        std::memcpy(&o.data[i * 2], &h, 2);
      }
      break;
    }
    case WFormat::FP8Block: {
      o.data.resize(n);
      for (auto& b : o.data) b = finite_e4m3(g());
      w.scale_cols = cdiv(cols, 128);
      o.scale.resize(static_cast<size_t>(cdiv(rows, 128) * w.scale_cols));
      for (auto& b : o.scale) b = static_cast<uint8_t>(112 + u(25));  // 2^-15 .. 2^9
      break;
    }
    case WFormat::MXFP4:
    case WFormat::NVFP4: {
      o.data.resize(static_cast<size_t>(rows * (cols / 2)));
      for (auto& b : o.data) b = static_cast<uint8_t>(g());
      const int64_t block = fmt == WFormat::MXFP4 ? 32 : 16;
      w.scale_cols = cdiv(cols, block);
      o.scale.resize(static_cast<size_t>(rows * w.scale_cols));
      if (fmt == WFormat::MXFP4) {
        for (auto& b : o.scale) {
          const uint32_t k = u(20);
          b = k == 0 ? 0 : k == 1 ? 1 : static_cast<uint8_t>(118 + u(16));
        }
      } else {
        for (auto& b : o.scale) b = finite_e4m3(g());
        w.scale2 = 0.0371f;
      }
      break;
    }
  }
  w.data = o.data.data();
  w.scale = o.scale.empty() ? nullptr : o.scale.data();
  return o;
}

constexpr WFormat kAllFormats[] = {WFormat::F32, WFormat::BF16, WFormat::F16, WFormat::FP8Block, WFormat::MXFP4,
                                   WFormat::NVFP4};

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
