#pragma once
// Random stored weights of every format and random activations with poisoned stride padding:
// shared by the CPU kernel tests (test_kernels.cpp) and the GPU ones (test_cuda_*.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/weight.h"

namespace dsv4::testing {

inline constexpr WFormat kAllFormats[] = {WFormat::F32,      WFormat::BF16,  WFormat::F16,
                                          WFormat::FP8Block, WFormat::MXFP4, WFormat::NVFP4};

// A weight and the bytes it views.
struct OwnedWeight {
  std::vector<uint8_t> data, scale;
  QWeight w;
};

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline uint8_t finite_e4m3(uint32_t v) {
  const auto b = static_cast<uint8_t>(v);
  return (b & 0x7F) == 0x7F ? static_cast<uint8_t>(b ^ 0x01) : b;
}

// moderate: MXFP4 scales only in 2^-8 .. 2^7 (real checkpoints' range; the AVX-512 GEMV then
// defers them, see qmatmul_kernels.inc) instead of also the extremes 2^-127 and 2^-126.
inline OwnedWeight make_weight(WFormat fmt, int64_t rows, int64_t cols, uint32_t seed, bool moderate = false) {
  std::mt19937 g(seed);
  auto u = [&](uint32_t n) { return static_cast<uint32_t>(g() % n); };
  OwnedWeight o;
  QWeight& w = o.w;
  w.fmt = fmt;
  w.rows = rows;
  w.cols = cols;
  w.name = std::string("test.") + wformat_name(fmt);
  const auto n = static_cast<size_t>(rows * cols);
  switch (fmt) {
    case WFormat::F32: {
      std::uniform_real_distribution<float> d(-1.0f, 1.0f);
      o.data.resize(n * 4);
      for (size_t i = 0; i < n; ++i) {
        const float f = d(g);
        std::memcpy(&o.data[i * 4], &f, 4);
      }
      break;
    }
    case WFormat::BF16: {
      std::uniform_real_distribution<float> d(-2.0f, 2.0f);
      o.data.resize(n * 2);
      for (size_t i = 0; i < n; ++i) {
        const float f = d(g);
        uint32_t b;
        std::memcpy(&b, &f, 4);
        const auto h = static_cast<uint16_t>(b >> 16);
        std::memcpy(&o.data[i * 2], &h, 2);
      }
      break;
    }
    case WFormat::F16: {
      o.data.resize(n * 2);
      for (size_t i = 0; i < n; ++i) {
        // Exponents 0..20: subnormals included, magnitudes up to 64, never inf/NaN.
        const auto h = static_cast<uint16_t>((u(2) << 15) | (u(21) << 10) | u(1024));
        std::memcpy(&o.data[i * 2], &h, 2);
      }
      break;
    }
    case WFormat::FP8Block: {
      o.data.resize(n);
      for (auto& b : o.data) b = finite_e4m3(g());
      w.scale_cols = cdiv(cols, 128);
      o.scale.resize(static_cast<size_t>(cdiv(rows, 128) * w.scale_cols));
      // 2^-15 .. 2^7 (AVX-512's fast FP8 decode takes up to 2^7: test_kernels' Fp8RangeExact
      // covers what lies beyond).
      for (auto& b : o.scale) b = static_cast<uint8_t>(112 + u(23));
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
        // Mostly 2^-9 .. 2^6, with the extremes 2^-127 (byte 0, a subnormal) and 2^-126.
        for (auto& b : o.scale) {
          const uint32_t k = u(20);
          b = k == 0 && !moderate ? 0 : k == 1 && !moderate ? 1 : static_cast<uint8_t>(118 + u(16));
        }
      } else {
        for (auto& b : o.scale) b = finite_e4m3(g());  // the whole E4M3 range, subnormals and sign
        w.scale2 = 0.0371f;
      }
      break;
    }
  }
  w.data = o.data.data();
  w.scale = o.scale.empty() ? nullptr : o.scale.data();
  return o;
}

struct Problem {
  int64_t r0, r1, T, ldx, ldy;
  std::vector<float> x;
};

inline Problem make_problem(const QWeight& w, int64_t r0, int64_t r1, int64_t T, uint32_t seed) {
  Problem p{r0, r1, T, w.cols + 7, (r1 - r0) + 5, {}};
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  // The stride padding is NaN: reading it would poison the result.
  p.x.assign(static_cast<size_t>(T * p.ldx), std::numeric_limits<float>::quiet_NaN());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < w.cols; ++c) p.x[t * p.ldx + c] = d(g);
  return p;
}

// What outputs are filled with before a call: a value the kernels never write by accident.
inline constexpr float kSentinel = 12345.0f;

// Checks y (a qmatmul of p against w, whose dequantised rows are deq) against a double-precision
// dot per output (tolerance 1e-5 * sum |w x|) and that the ldy padding still holds kSentinel.
// Reports up to 5 failures; returns how many outputs were wrong.
inline int check_against_reference(const QWeight& w, const std::vector<float>& deq, const Problem& p,
                                   const std::vector<float>& y, const std::string& what) {
  const int64_t n = p.r1 - p.r0;
  int bad = 0;
  for (int64_t t = 0; t < p.T; ++t) {
    const float* xt = p.x.data() + t * p.ldx;
    for (int64_t i = 0; i < n; ++i) {
      const float* wr = deq.data() + (p.r0 + i) * w.cols;
      double s = 0, sa = 0;
      for (int64_t c = 0; c < w.cols; ++c) {
        const double v = static_cast<double>(wr[c]) * xt[c];
        s += v;
        sa += std::fabs(v);
      }
      const float got = y[t * p.ldy + i];
      const double tol = 1e-5 * sa + 1e-30;
      if (!(std::fabs(got - s) <= tol) && bad++ < 5)
        ADD_FAILURE() << what << ": t=" << t << " row=" << p.r0 + i << " got " << got << " want " << s << " tol " << tol;
    }
    for (int64_t i = n; i < p.ldy; ++i)
      if (y[t * p.ldy + i] != kSentinel && bad++ < 5) ADD_FAILURE() << what << ": wrote ldy padding at t=" << t;
  }
  return bad;
}

}  // namespace dsv4::testing
