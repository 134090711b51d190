// CPU reference ops (src/model/{ops,mhc,compressor,attention,moe}) against plain math written
// here, in double precision and naive loops, straight from shared/spec/MODEL.md. Nothing below
// calls the library to compute an expected value; the only shared pieces are the inputs (and the
// RoPE table's float32 frequencies, which are themselves checked against the formula first).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <cstring>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/formats.h"
#include "core/weight.h"
#include "io/config.h"
#include "kv/state.h"
#include "backends/cpu/attention.h"
#include "backends/cpu/compressor.h"
#include "backends/cpu/mhc.h"
#include "backends/cpu/moe.h"
#include "backends/cpu/ops.h"
#include "model/weights.h"

using namespace dsv4;

namespace {

constexpr double kPi = 3.14159265358979323846;

std::vector<float> randv(std::mt19937& g, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// Every |got - want| <= atol + rtol * |want|.
::testing::AssertionResult close_all(const float* got, const std::vector<double>& want, double rtol, double atol) {
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i])))
      return ::testing::AssertionFailure() << "index " << i << ": got " << got[i] << ", want " << want[i]
                                           << " (err " << err << ")";
  }
  return ::testing::AssertionSuccess();
}

// Every |got - want| <= rtol * scale[i] (scale: sum of |terms| of a sum).
::testing::AssertionResult close_scaled(const float* got, const std::vector<double>& want,
                                        const std::vector<double>& scale, double rtol) {
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= rtol * scale[i] + 1e-30))
      return ::testing::AssertionFailure() << "index " << i << ": got " << got[i] << ", want " << want[i]
                                           << " (err " << err << ", scale " << scale[i] << ")";
  }
  return ::testing::AssertionSuccess();
}

// ---- weights built byte by byte -------------------------------------------------------------

// A test weight: its stored bytes, the QWeight view on them and the exact values they encode.
struct TestWeight {
  std::vector<uint8_t> bytes;
  std::vector<double> value;  // [rows * cols]
  QWeight q;
};

TestWeight make_weight(WFormat fmt, int64_t rows, int64_t cols, std::mt19937& g, float amp = 1.0f) {
  TestWeight w;
  const std::vector<float> v = randv(g, static_cast<size_t>(rows * cols), -amp, amp);
  w.value.resize(v.size());
  if (fmt == WFormat::F32) {
    w.bytes.resize(v.size() * 4);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint32_t b = std::bit_cast<uint32_t>(v[i]);
      for (int k = 0; k < 4; ++k) w.bytes[4 * i + k] = static_cast<uint8_t>(b >> (8 * k));  // little endian
      w.value[i] = v[i];
    }
  } else if (fmt == WFormat::BF16) {
    // bf16 = the high 16 bits of a float32; the value is that float with the low bits cleared.
    w.bytes.resize(v.size() * 2);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint32_t hi = std::bit_cast<uint32_t>(v[i]) >> 16;
      w.bytes[2 * i] = static_cast<uint8_t>(hi & 0xFF);
      w.bytes[2 * i + 1] = static_cast<uint8_t>(hi >> 8);
      w.value[i] = std::bit_cast<float>(hi << 16);
    }
  } else {
    ADD_FAILURE() << "make_weight: unsupported format";
  }
  w.q.fmt = fmt;
  w.q.rows = rows;
  w.q.cols = cols;
  w.q.data = w.bytes.data();
  w.q.name = "test";
  return w;
}

// ---- naive reference math (double) ---------------------------------------------------------

double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double ref_silu(double x) { return x * ref_sigmoid(x); }
double ref_softplus(double x) { return std::log1p(std::exp(x)); }

std::vector<double> ref_rmsnorm(const std::vector<double>& x, const std::vector<double>* w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = (w ? (*w)[i] : 1.0) * x[i] * inv;
  return y;
}

// MODEL.md: f_i = base^(-2i/r); YaRN with low/high from cd(n), ramp, clamp.
std::vector<double> ref_freq(int64_t r, double base, bool yarn, double factor, double original, double beta_fast,
                             double beta_slow, double* low_out = nullptr, double* high_out = nullptr) {
  std::vector<double> f(static_cast<size_t>(r / 2));
  for (int64_t i = 0; i < r / 2; ++i) f[i] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(r));
  if (!yarn) return f;
  auto cd = [&](double n) { return static_cast<double>(r) * std::log(original / (2.0 * kPi * n)) / (2.0 * std::log(base)); };
  double low = std::clamp(std::floor(cd(beta_fast)), 0.0, static_cast<double>(r - 1));
  double high = std::clamp(std::ceil(cd(beta_slow)), 0.0, static_cast<double>(r - 1));
  if (low == high) high += 0.001;
  if (low_out) *low_out = low;
  if (high_out) *high_out = high;
  for (int64_t i = 0; i < r / 2; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    f[i] = f[i] / factor * ramp + f[i] * (1.0 - ramp);
  }
  return f;
}

// RoPE of the last r dims of v, interleaved pairs, with the reference's float32 angle pos * f_i.
void ref_rope(std::vector<double>& v, const std::vector<float>& freq, int64_t pos, bool inverse = false) {
  const size_t r = freq.size() * 2, base = v.size() - r;
  for (size_t i = 0; i < freq.size(); ++i) {
    const double ang = static_cast<double>(static_cast<float>(pos) * freq[i]) * (inverse ? -1.0 : 1.0);
    const double a = v[base + 2 * i], b = v[base + 2 * i + 1];
    v[base + 2 * i] = a * std::cos(ang) - b * std::sin(ang);
    v[base + 2 * i + 1] = a * std::sin(ang) + b * std::cos(ang);
  }
}

// Sylvester Hadamard matrix entry: H[i][j] = (-1)^popcount(i & j).
double sylvester(int64_t i, int64_t j) { return (std::popcount(static_cast<uint64_t>(i & j)) & 1) ? -1.0 : 1.0; }

std::vector<double> ref_hadamard(const std::vector<double>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<double> y(x.size(), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) y[i] += sylvester(i, j) * x[j];
  for (double& v : y) v /= std::sqrt(static_cast<double>(n));
  return y;
}

// 2^ceil(log2(y)), exact.
double ref_pow2_ceil(double y) {
  int e = 0;
  const double m = std::frexp(y, &e);  // y = m * 2^e, m in [0.5, 1)
  return m == 0.5 ? std::ldexp(1.0, e - 1) : std::ldexp(1.0, e);
}

// Nearest-even rounding onto the e4m3 grid (|v| <= 448 after clamping) or the e2m1 grid (<= 6).
double ref_round_e4m3(double v) {
  const double a = std::min(std::fabs(v), 448.0);
  if (a == 0) return 0.0;
  int e = 0;
  std::frexp(a, &e);  // floor(log2 a) = e - 1
  const int ex = std::max(e - 1, -6);
  const double step = std::ldexp(1.0, ex - 3);
  return std::copysign(std::nearbyint(a / step) * step, v);
}
double ref_round_e2m1(double v) {
  const double a = std::min(std::fabs(v), 6.0);
  if (a == 0) return 0.0;
  int e = 0;
  std::frexp(a, &e);
  const int ex = std::max(e - 1, 0);
  const double step = std::ldexp(1.0, ex - 1);
  return std::copysign(std::nearbyint(a / step) * step, v);
}

// Checks `got` (the library's fp8sim/fp4sim'd values) against the quantisation of the naive
// pre-quantisation values `pre` over [off, off + n) in blocks. Where a naive value sits within
// `slack` of a rounding midpoint the neighbouring grid value is also accepted (float32 vs
// double); `loose` counts those.
::testing::AssertionResult check_quantized(const float* got, const std::vector<double>& pre, size_t off, size_t n,
                                           size_t block, bool fp8, double slack, int* loose) {
  const double qmax = fp8 ? 448.0 : 6.0, floor_amax = fp8 ? 1e-4 : 6.0 * std::ldexp(1.0, -126);
  for (size_t b = off; b < off + n; b += block) {
    double amax = floor_amax;
    for (size_t i = b; i < b + block; ++i) amax = std::max(amax, std::fabs(pre[i]));
    const double scale = ref_pow2_ceil(amax / qmax);
    auto q = [&](double v) {
      const double s = std::clamp(v / scale, -qmax, qmax);
      return (fp8 ? ref_round_e4m3(s) : ref_round_e2m1(s)) * scale;
    };
    for (size_t i = b; i < b + block; ++i) {
      const double want = q(pre[i]), g = got[i];
      if (g == want) continue;
      const double d = slack * amax;
      if (g == q(pre[i] - d) || g == q(pre[i] + d)) {
        ++*loose;
        continue;
      }
      return ::testing::AssertionFailure() << "quantised index " << i << ": got " << g << ", want " << want
                                           << " (pre " << pre[i] << ", block scale " << scale << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// Indices of the k largest (ties to the lower index), descending.
std::vector<int32_t> ref_topk(const std::vector<double>& v, int64_t k) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
  idx.resize(static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(v.size()))));
  return idx;
}

}  // namespace

// ---- matmul / dot -----------------------------------------------------------------------------

TEST(Ops, DotLengths) {
  std::mt19937 g(1);
  for (int64_t n : {0, 1, 5, 15, 16, 17, 31, 33, 47, 100, 257}) {
    const auto a = randv(g, static_cast<size_t>(n)), b = randv(g, static_cast<size_t>(n));
    double want = 0, scale = 0;
    for (int64_t i = 0; i < n; ++i) want += static_cast<double>(a[i]) * b[i], scale += std::fabs(static_cast<double>(a[i]) * b[i]);
    const float got = dot(a.data(), b.data(), n);
    EXPECT_NEAR(got, want, 1e-6 * scale + 1e-30) << "n = " << n;
  }
  // Exactly representable: the sum is exact whatever the order.
  std::vector<float> a(37), b(37);
  for (int i = 0; i < 37; ++i) a[i] = static_cast<float>(i), b[i] = static_cast<float>(i % 3 - 1);
  double want = 0;
  for (int i = 0; i < 37; ++i) want += a[i] * b[i];
  EXPECT_EQ(dot(a.data(), b.data(), 37), static_cast<float>(want));
}

namespace {

// y[t][r] = sum_c W[r][c] x[t][c] for rows [r0, r1) (naive, double) and sum |terms|.
void ref_matmul(const TestWeight& w, int64_t r0, int64_t r1, const std::vector<float>& x, int64_t ldx, int64_t T,
                std::vector<double>& y, std::vector<double>& scale) {
  const int64_t cols = w.q.cols;
  y.assign(static_cast<size_t>(T * (r1 - r0)), 0.0);
  scale.assign(y.size(), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const double p = w.value[r * cols + c] * static_cast<double>(x[t * ldx + c]);
        y[t * (r1 - r0) + (r - r0)] += p;
        scale[t * (r1 - r0) + (r - r0)] += std::fabs(p);
      }
}

void check_matmul(WFormat fmt) {
  std::mt19937 g(fmt == WFormat::F32 ? 11 : 12);
  const int64_t rows = 37, cols = 70;
  const TestWeight w = make_weight(fmt, rows, cols, g);
  for (int64_t T : {1, 2, 5}) {
    const auto x = randv(g, static_cast<size_t>(T * cols));
    std::vector<float> y(static_cast<size_t>(T * rows), std::nanf(""));
    matmul(w.q, x.data(), T, y.data());
    std::vector<double> want, scale;
    ref_matmul(w, 0, rows, x, cols, T, want, scale);
    EXPECT_TRUE(close_scaled(y.data(), want, scale, 1e-5)) << wformat_name(fmt) << " T = " << T;
  }
  // Row range [5, 20) with strided input (ldx > cols) and output (ldy > rows in range).
  const int64_t r0 = 5, r1 = 20, T = 3, ldx = cols + 3, ldy = (r1 - r0) + 4;
  const auto x = randv(g, static_cast<size_t>(T * ldx));
  const float sentinel = 12345.0f;
  std::vector<float> y(static_cast<size_t>(T * ldy), sentinel);
  matmul(w.q, r0, r1, x.data(), ldx, T, y.data(), ldy);
  std::vector<double> want, scale;
  ref_matmul(w, r0, r1, x, ldx, T, want, scale);
  std::vector<float> packed;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < r1 - r0; ++i) packed.push_back(y[t * ldy + i]);
    for (int64_t i = r1 - r0; i < ldy; ++i) EXPECT_EQ(y[t * ldy + i], sentinel) << "padding written, t " << t << " i " << i;
  }
  EXPECT_TRUE(close_scaled(packed.data(), want, scale, 1e-5)) << wformat_name(fmt) << " row range";
}

}  // namespace

TEST(Ops, MatmulF32) { check_matmul(WFormat::F32); }
TEST(Ops, MatmulBF16) { check_matmul(WFormat::BF16); }

// ---- rmsnorm ------------------------------------------------------------------------------------

TEST(Ops, RmsNorm) {
  std::mt19937 g(2);
  const int64_t n = 37;
  for (double eps : {1e-6, 0.1}) {
    for (float amp : {1.0f, 1e-3f}) {  // at 1e-3 the eps term is visible
      const auto x = randv(g, n, -amp, amp);
      const auto wf = randv(g, n, 0.5f, 1.5f);
      std::vector<double> xd(x.begin(), x.end()), wd(wf.begin(), wf.end());
      std::vector<float> y(n);
      rmsnorm(x.data(), wf.data(), n, eps, y.data());
      EXPECT_TRUE(close_all(y.data(), ref_rmsnorm(xd, &wd, eps), 1e-6, 1e-7)) << "weighted eps " << eps << " amp " << amp;
      rmsnorm(x.data(), nullptr, n, eps, y.data());
      EXPECT_TRUE(close_all(y.data(), ref_rmsnorm(xd, nullptr, eps), 1e-6, 1e-7)) << "unweighted eps " << eps;
      std::vector<float> inplace = x;
      rmsnorm(inplace.data(), wf.data(), n, eps, inplace.data());
      EXPECT_TRUE(close_all(inplace.data(), ref_rmsnorm(xd, &wd, eps), 1e-6, 1e-7)) << "in place";
    }
  }
}

// ---- RoPE ---------------------------------------------------------------------------------------

TEST(Ops, RopeFrequenciesPlain) {
  for (double base : {10000.0, 160000.0}) {
    const RopeTable t = make_rope(64, base, false, 16, 65536, 32, 1);
    ASSERT_EQ(t.rope_dim, 64);
    ASSERT_EQ(t.freq.size(), 32u);
    const auto want = ref_freq(64, base, false, 1, 1, 1, 1);
    EXPECT_TRUE(close_all(t.freq.data(), want, 1e-6, 0)) << "base " << base;
    EXPECT_EQ(t.freq[0], 1.0f);
  }
}

TEST(Ops, RopeFrequenciesYarnRealValues) {
  // DeepSeek-V4 compressed layers: r = 64, base 160000, factor 16, original 65536, beta 32 / 1.
  double low = 0, high = 0;
  const auto want = ref_freq(64, 160000.0, true, 16.0, 65536.0, 32.0, 1.0, &low, &high);
  EXPECT_EQ(low, 15.0);
  EXPECT_EQ(high, 25.0);
  const RopeTable t = make_rope(64, 160000.0, true, 16.0, 65536, 32.0, 1.0);
  ASSERT_EQ(t.freq.size(), 32u);
  EXPECT_TRUE(close_all(t.freq.data(), want, 1e-6, 0));
  // Below low: unchanged; from high on: divided by the factor; in between: interpolated.
  for (int i = 0; i < 32; ++i) {
    const double f = std::pow(160000.0, -2.0 * i / 64.0);
    if (i <= 15) { EXPECT_NEAR(t.freq[i], f, 1e-6 * f) << i; }
    if (i >= 25) { EXPECT_NEAR(t.freq[i], f / 16.0, 1e-6 * f / 16.0) << i; }
    if (i == 20) { EXPECT_NEAR(t.freq[i], f / 16.0 * 0.5 + f * 0.5, 1e-6 * f) << i; }
  }
}

TEST(Ops, RopeFrequenciesYarnLowEqualsHigh) {
  // original 5: cd(1) in (-1, 0] and cd(32) < 0, so low = high = 0 and high becomes 0.001:
  // f_0 keeps its value, every other frequency is divided by the factor.
  double low = 0, high = 0;
  const auto want = ref_freq(64, 160000.0, true, 4.0, 5.0, 32.0, 1.0, &low, &high);
  EXPECT_EQ(low, 0.0);
  EXPECT_DOUBLE_EQ(high, 0.001);
  const RopeTable t = make_rope(64, 160000.0, true, 4.0, 5, 32.0, 1.0);
  EXPECT_TRUE(close_all(t.freq.data(), want, 1e-6, 0));
  EXPECT_EQ(t.freq[0], 1.0f);
  EXPECT_NEAR(t.freq[1], std::pow(160000.0, -2.0 / 64.0) / 4.0, 1e-7);
}

TEST(Ops, RopeApply) {
  std::mt19937 g(3);
  const RopeTable t = make_rope(64, 160000.0, true, 16.0, 65536, 32.0, 1.0);
  const int64_t n = 100;  // 36 untouched dims, then 32 rotated pairs
  for (int64_t pos : {0, 1, 7, 1000, 65535, 1000003}) {
    const auto v = randv(g, n);
    std::vector<float> got = v;
    t.apply(got.data(), n, pos);
    std::vector<double> want(v.begin(), v.end());
    ref_rope(want, t.freq, pos);
    EXPECT_TRUE(close_all(got.data(), want, 0, 1e-6)) << "pos " << pos;
    for (int64_t i = 0; i < n - 64; ++i) ASSERT_EQ(got[i], v[i]) << "non-rope dim " << i << " changed at pos " << pos;
    if (pos == 0) {
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], v[i]) << "position 0 is not the identity at " << i;
    }
    // Norm of each pair preserved; inverse undoes.
    for (int64_t i = n - 64; i < n; i += 2)
      EXPECT_NEAR(std::hypot(got[i], got[i + 1]), std::hypot(v[i], v[i + 1]), 1e-6);
    std::vector<float> back = got;
    t.apply(back.data(), n, pos, true);
    EXPECT_TRUE(close_all(back.data(), std::vector<double>(v.begin(), v.end()), 0, 2e-6)) << "inverse, pos " << pos;
    std::vector<double> inv(got.begin(), got.end());
    ref_rope(inv, t.freq, pos, true);
    EXPECT_TRUE(close_all(back.data(), inv, 0, 1e-6)) << "inverse vs naive, pos " << pos;
  }
  // A tiny table: v = (a, b, c, d) with r = 2 rotates (c, d) only, by pos * 1.
  const RopeTable t2 = make_rope(2, 10000.0, false, 1, 1, 32, 1);
  float v[4] = {1.0f, 2.0f, 1.0f, 0.0f};
  t2.apply(v, 4, 1);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 2.0f);
  EXPECT_NEAR(v[2], std::cos(1.0), 1e-7);
  EXPECT_NEAR(v[3], std::sin(1.0), 1e-7);
}

// ---- Hadamard -----------------------------------------------------------------------------------

TEST(Ops, HadamardSylvester) {
  std::mt19937 g(4);
  for (int64_t n : {1, 2, 8, 128}) {
    const auto x = randv(g, static_cast<size_t>(n));
    std::vector<float> got = x;
    hadamard(got.data(), n);
    const std::vector<double> xd(x.begin(), x.end());
    const auto want = ref_hadamard(xd);
    double sumabs = 0;
    for (double v : xd) sumabs += std::fabs(v);
    EXPECT_TRUE(close_all(got.data(), want, 0, 1e-6 * sumabs / std::sqrt(static_cast<double>(n)) + 1e-7)) << "n = " << n;
    double n0 = 0, n1 = 0;
    for (int64_t i = 0; i < n; ++i) n0 += xd[i] * xd[i], n1 += static_cast<double>(got[i]) * got[i];
    EXPECT_NEAR(n1, n0, 1e-5 * n0) << "norm, n = " << n;
  }
  // Basis vectors give the matrix columns: e_j -> H[:, j] / sqrt(n).
  const int64_t n = 8;
  for (int64_t j = 0; j < n; ++j) {
    std::vector<float> e(n, 0.0f);
    e[j] = 1.0f;
    hadamard(e.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(e[i], sylvester(i, j) / std::sqrt(8.0), 1e-7) << i << "," << j;
  }
}

// ---- activations, topk --------------------------------------------------------------------------

TEST(Ops, Activations) {
  for (double x = -30; x <= 30; x += 0.37) {
    const float f = static_cast<float>(x);
    EXPECT_NEAR(silu(f), ref_silu(f), 1e-6 * std::fabs(ref_silu(f)) + 1e-30) << x;
    EXPECT_NEAR(sigmoid(f), ref_sigmoid(f), 1e-6 * ref_sigmoid(f)) << x;
    EXPECT_NEAR(softplus(f), ref_softplus(f), 1e-6 * ref_softplus(f)) << x;
  }
}

TEST(Ops, TopK) {
  const std::vector<float> v = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  EXPECT_EQ(topk(v.data(), 6, 4), (std::vector<int32_t>{1, 2, 4, 3}));
  EXPECT_EQ(topk(v.data(), 6, 1), (std::vector<int32_t>{1}));
  EXPECT_EQ(topk(v.data(), 6, 10), (std::vector<int32_t>{1, 2, 4, 3, 0, 5}));  // k > n: all, sorted
  EXPECT_TRUE(topk(v.data(), 6, 0).empty());
  const std::vector<float> zeros(9, 0.0f);
  EXPECT_EQ(topk(zeros.data(), 9, 3), (std::vector<int32_t>{0, 1, 2}));
  // core/rank_key.h's order: -0 ties +0 (lower index first), NaN of either sign after -inf.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> odd = {nan, 1.0f, -nan, -inf, 0.0f, -0.0f, nan, 2.0f};
  EXPECT_EQ(topk(odd.data(), 8, 8), (std::vector<int32_t>{7, 1, 4, 5, 3, 0, 2, 6}));
  EXPECT_EQ(topk(odd.data(), 8, 3), (std::vector<int32_t>{7, 1, 4}));
  EXPECT_EQ(topk(odd.data(), 7, 6), (std::vector<int32_t>{1, 4, 5, 3, 0, 2}));
  std::mt19937 g(5);
  std::uniform_int_distribution<int> d(-5, 5);  // many ties
  for (int rep = 0; rep < 20; ++rep) {
    std::vector<float> r(50);
    for (float& x : r) x = static_cast<float>(d(g));
    EXPECT_EQ(topk(r.data(), 50, 17), ref_topk(std::vector<double>(r.begin(), r.end()), 17));
  }
}

// ---- mHC ----------------------------------------------------------------------------------------

namespace {

struct HcRef {
  std::vector<double> x, post, comb;
};

// MODEL.md "Block_l" hc_pre for one token X [hc, D].
HcRef ref_hc_pre(int64_t hc, int64_t D, int64_t iters, double eps, double hc_eps, const HcMixW& mix, const float* X) {
  const int64_t n = hc * D, M = (2 + hc) * hc;
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(X[i]) * X[i];
  const double rs = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  std::vector<double> m(static_cast<size_t>(M), 0.0);
  for (int64_t k = 0; k < M; ++k) {
    for (int64_t i = 0; i < n; ++i) m[k] += static_cast<double>(mix.fn[k * n + i]) * X[i];
    m[k] *= rs;
  }
  HcRef r;
  std::vector<double> pre(static_cast<size_t>(hc));
  for (int64_t i = 0; i < hc; ++i) pre[i] = ref_sigmoid(m[i] * mix.scale[0] + mix.base[i]) + hc_eps;
  for (int64_t j = 0; j < hc; ++j) r.post.push_back(2.0 * ref_sigmoid(m[hc + j] * mix.scale[1] + mix.base[hc + j]));
  std::vector<double> C(static_cast<size_t>(hc * hc));
  for (int64_t k = 0; k < hc * hc; ++k) C[k] = m[2 * hc + k] * mix.scale[2] + mix.base[2 * hc + k];
  auto rows = [&] {
    for (int64_t i = 0; i < hc; ++i) {
      double s = 0;
      for (int64_t j = 0; j < hc; ++j) s += C[i * hc + j];
      for (int64_t j = 0; j < hc; ++j) C[i * hc + j] /= s + hc_eps;
    }
  };
  auto cols = [&] {
    for (int64_t j = 0; j < hc; ++j) {
      double s = 0;
      for (int64_t i = 0; i < hc; ++i) s += C[i * hc + j];
      for (int64_t i = 0; i < hc; ++i) C[i * hc + j] /= s + hc_eps;
    }
  };
  for (int64_t i = 0; i < hc; ++i) {  // row softmax + eps
    double s = 0;
    for (int64_t j = 0; j < hc; ++j) s += std::exp(C[i * hc + j]);
    for (int64_t j = 0; j < hc; ++j) C[i * hc + j] = std::exp(C[i * hc + j]) / s + hc_eps;
  }
  cols();
  for (int64_t it = 0; it < iters - 1; ++it) {
    rows();
    cols();
  }
  r.comb = C;
  for (int64_t d = 0; d < D; ++d) {
    double s = 0;
    for (int64_t i = 0; i < hc; ++i) s += pre[i] * X[i * D + d];
    r.x.push_back(s);
  }
  return r;
}

ModelConfig hc_config(int64_t iters) {
  ModelConfig c;
  c.hc = 4;
  c.dim = 8;
  c.sinkhorn_iters = iters;
  c.eps = 1e-6;
  c.hc_eps = 1e-6;
  return c;
}

HcMixW random_mix(std::mt19937& g, const ModelConfig& c) {
  HcMixW mix;
  mix.fn = randv(g, static_cast<size_t>(c.hc_mix() * c.hc * c.dim), -0.5f, 0.5f);
  mix.base = randv(g, static_cast<size_t>(c.hc_mix()), -1.0f, 1.0f);
  mix.scale = {0.7f, 0.9f, 1.3f};
  return mix;
}

}  // namespace

TEST(Mhc, HcPre) {
  // Real eps values (Sinkhorn checks), then distinct large ones so that the rms eps and hc_eps
  // are each seen in their own places.
  struct Eps {
    double eps, hc_eps;
  };
  for (const Eps e : {Eps{1e-6, 1e-6}, Eps{0.3, 1e-2}}) {
    for (int64_t iters : {20, 1}) {
      SCOPED_TRACE("iters " + std::to_string(iters) + " eps " + std::to_string(e.eps) + " hc_eps " + std::to_string(e.hc_eps));
      std::mt19937 g(static_cast<uint32_t>(6 + iters));
      ModelConfig c = hc_config(iters);
      c.eps = e.eps;
      c.hc_eps = e.hc_eps;
      ASSERT_EQ(c.hc_mix(), 24);
      const HcMixW mix = random_mix(g, c);
      const int64_t T = 3, hc = c.hc, D = c.dim;
      const auto X = randv(g, static_cast<size_t>(T * hc * D), -2.0f, 2.0f);
      std::vector<float> x(static_cast<size_t>(T * D)), post(static_cast<size_t>(T * hc)),
          comb(static_cast<size_t>(T * hc * hc));
      hc_pre(c, mix, X.data(), T, x.data(), post.data(), comb.data());
      for (int64_t t = 0; t < T; ++t) {
        const HcRef r = ref_hc_pre(hc, D, iters, c.eps, c.hc_eps, mix, X.data() + t * hc * D);
        EXPECT_TRUE(close_all(x.data() + t * D, r.x, 1e-5, 1e-6)) << "x, t " << t;
        EXPECT_TRUE(close_all(post.data() + t * hc, r.post, 1e-5, 1e-7)) << "post, t " << t;
        EXPECT_TRUE(close_all(comb.data() + t * hc * hc, r.comb, 1e-5, 1e-7)) << "comb, t " << t;
        const float* C = comb.data() + t * hc * hc;
        for (int64_t j = 0; j < hc; ++j) {
          double col = 0, row = 0;
          for (int64_t i = 0; i < hc; ++i) col += C[i * hc + j], row += C[j * hc + i];
          if (c.hc_eps < 1e-5) {
            // The last step normalises columns (sums s / (s + hc_eps)); 20 iterations make the
            // rows follow.
            EXPECT_NEAR(col, 1.0, 1e-5) << "column " << j;
            if (iters == 20) { EXPECT_NEAR(row, 1.0, 1e-3) << "row " << j << " after 20 Sinkhorn iterations"; }
          }
          for (int64_t i = 0; i < hc; ++i) EXPECT_GT(C[i * hc + j], 0.0f);
        }
        for (int64_t j = 0; j < hc; ++j) {
          EXPECT_GT(post[t * hc + j], 0.0f);
          EXPECT_LT(post[t * hc + j], 2.0f);
        }
      }
    }
  }
}

TEST(Mhc, HcPreMixesWithPre) {
  // fn = 0 makes m = 0: pre_i = sigmoid(base_i) + hc_eps, so x = sum_i pre_i X_i is easy to write.
  const ModelConfig c = hc_config(20);
  HcMixW mix;
  mix.fn.assign(static_cast<size_t>(c.hc_mix() * c.hc * c.dim), 0.0f);
  mix.base = {0.0f, 1.0f, -1.0f, 2.0f};
  mix.base.resize(static_cast<size_t>(c.hc_mix()), 0.0f);
  mix.scale = {1.0f, 1.0f, 1.0f};
  std::mt19937 g(8);
  const auto X = randv(g, static_cast<size_t>(c.hc * c.dim));
  std::vector<float> x(static_cast<size_t>(c.dim)), post(4), comb(16);
  hc_pre(c, mix, X.data(), 1, x.data(), post.data(), comb.data());
  for (int64_t d = 0; d < c.dim; ++d) {
    double want = 0;
    for (int64_t i = 0; i < c.hc; ++i) want += (ref_sigmoid(mix.base[i]) + 1e-6) * X[i * c.dim + d];
    EXPECT_NEAR(x[d], want, 1e-6) << d;
  }
  for (int64_t j = 0; j < c.hc; ++j) EXPECT_NEAR(post[j], 1.0, 1e-7);  // 2 * sigmoid(0)
  for (float v : comb) EXPECT_NEAR(v, 0.25, 1e-6);                     // uniform C stays uniform
}

TEST(Mhc, HcPost) {
  std::mt19937 g(9);
  const ModelConfig c = hc_config(20);
  const int64_t T = 2, hc = c.hc, D = c.dim;
  const auto X = randv(g, static_cast<size_t>(T * hc * D), -2.0f, 2.0f);
  const auto f = randv(g, static_cast<size_t>(T * D));
  const auto post = randv(g, static_cast<size_t>(T * hc), 0.0f, 2.0f);
  const auto comb = randv(g, static_cast<size_t>(T * hc * hc), 0.0f, 1.0f);
  std::vector<float> out = X;
  hc_post(c, f.data(), post.data(), comb.data(), out.data(), T);
  std::vector<double> want;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < hc; ++j)
      for (int64_t d = 0; d < D; ++d) {
        double s = static_cast<double>(post[t * hc + j]) * f[t * D + d];
        for (int64_t i = 0; i < hc; ++i) s += static_cast<double>(comb[t * hc * hc + i * hc + j]) * X[t * hc * D + i * D + d];
        want.push_back(s);
      }
  EXPECT_TRUE(close_all(out.data(), want, 1e-5, 1e-6));
}

// ---- compressor ---------------------------------------------------------------------------------

namespace {

constexpr int64_t kCompD = 16;    // hidden size
constexpr int64_t kCompOut = 128; // head dim (and index head dim)
constexpr int64_t kCompRope = 64;

struct CompCase {
  TestWeight wkv, wgate;
  CompressorW w;
  ModelConfig cfg;
};

CompCase make_comp_case(int64_t ratio, WFormat fmt, std::mt19937& g) {
  CompCase k;
  const int64_t coff = ratio == 4 ? 2 : 1;
  k.wkv = make_weight(fmt, coff * kCompOut, kCompD, g, 0.5f);
  k.wgate = make_weight(fmt, coff * kCompOut, kCompD, g, 0.5f);
  k.w.ratio = ratio;
  k.w.coff = coff;
  k.w.out_dim = kCompOut;
  k.w.wkv = k.wkv.q;
  k.w.wgate = k.wgate.q;
  k.w.ape = randv(g, static_cast<size_t>(ratio * coff * kCompOut), -1.0f, 1.0f);
  k.w.norm = randv(g, static_cast<size_t>(kCompOut), 0.5f, 1.5f);
  ModelConfig& c = k.cfg;
  c.n_layers = 1;
  c.compress_ratios = {ratio, 0};
  c.dim = kCompD;
  c.head_dim = kCompOut;
  c.rope_dim = kCompRope;
  c.index_dim = kCompOut;
  c.window = 4;
  c.eps = 1e-6;
  return k;
}

// Naive compressor over a whole sequence x [N, D]: every complete block's entry after RMSNorm,
// RoPE at b*c and (indexer) Hadamard, before the fp8/fp4 simulation.
std::vector<std::vector<double>> ref_compress(const CompCase& k, const std::vector<float>& x, int64_t N,
                                              const std::vector<float>& freq, bool indexer) {
  const int64_t c = k.w.ratio, d = k.w.out_dim, width = k.w.coff * d;
  std::vector<double> a(static_cast<size_t>(N * width), 0.0), s(static_cast<size_t>(N * width), 0.0);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t o = 0; o < width; ++o) {
      for (int64_t i = 0; i < kCompD; ++i) {
        a[t * width + o] += k.wkv.value[o * kCompD + i] * x[t * kCompD + i];
        s[t * width + o] += k.wgate.value[o * kCompD + i] * x[t * kCompD + i];
      }
      s[t * width + o] += k.w.ape[(t % c) * width + o];  // the gate scores only
    }
  std::vector<std::vector<double>> out;
  const std::vector<double> norm(k.w.norm.begin(), k.w.norm.end());
  for (int64_t b = 0; (b + 1) * c <= N; ++b) {
    std::vector<double> e(static_cast<size_t>(d));
    for (int64_t ch = 0; ch < d; ++ch) {
      std::vector<std::pair<double, double>> sv;  // (score, value)
      if (c == 4) {
        if (b > 0)
          for (int64_t t = (b - 1) * c; t < b * c; ++t) sv.emplace_back(s[t * width + ch], a[t * width + ch]);
        for (int64_t t = b * c; t < (b + 1) * c; ++t) sv.emplace_back(s[t * width + d + ch], a[t * width + d + ch]);
      } else {
        for (int64_t t = b * c; t < (b + 1) * c; ++t) sv.emplace_back(s[t * width + ch], a[t * width + ch]);
      }
      double den = 0, num = 0;
      for (auto [sc, va] : sv) den += std::exp(sc), num += std::exp(sc) * va;
      e[ch] = num / den;
    }
    e = ref_rmsnorm(e, &norm, 1e-6);
    ref_rope(e, freq, b * c);
    if (indexer) e = ref_hadamard(e);
    out.push_back(e);
  }
  return out;
}

// Runs the library compressor over x [N, D] in chunks of the given sizes (cycled).
std::vector<float> run_compress(const CompCase& k, const RopeTable& rope, const std::vector<float>& x, int64_t N,
                                const std::vector<int64_t>& chunks, bool indexer) {
  SequenceState st = make_sequence_state(k.cfg, false);
  CompressorState& s = indexer ? st.layers[0].index_comp : st.layers[0].comp;
  EXPECT_EQ(s.width, k.w.coff * k.w.out_dim);
  std::vector<float> entries;
  int64_t p = 0;
  for (size_t ci = 0; p < N; ++ci) {
    const int64_t T = std::min(chunks[ci % chunks.size()], N - p);
    const size_t before = entries.size();
    const int64_t added = compress(k.cfg, k.w, s, rope, x.data() + p * kCompD, T, p, indexer ? Comp::Index : Comp::Kv, entries);
    // Blocks closing inside [p, p + T).
    const int64_t closing = (p + T) / k.w.ratio - p / k.w.ratio;
    EXPECT_EQ(added, closing) << "chunk at " << p << " of " << T;
    EXPECT_EQ(entries.size() - before, static_cast<size_t>(added * k.w.out_dim));
    p += T;
  }
  return entries;
}

void check_compress(int64_t ratio, WFormat fmt, int64_t N, bool indexer, uint32_t seed) {
  SCOPED_TRACE("ratio " + std::to_string(ratio) + " " + wformat_name(fmt) + (indexer ? " indexer" : " main"));
  std::mt19937 g(seed);
  const CompCase k = make_comp_case(ratio, fmt, g);
  const RopeTable rope = make_rope(kCompRope, 160000.0, true, 16.0, 65536, 32.0, 1.0);
  const auto x = randv(g, static_cast<size_t>(N * kCompD));
  const auto want = ref_compress(k, x, N, rope.freq, indexer);
  const int64_t d = kCompOut;

  const std::vector<float> whole = run_compress(k, rope, x, N, {N}, indexer);
  ASSERT_EQ(whole.size(), want.size() * static_cast<size_t>(d));
  int loose = 0;
  for (size_t b = 0; b < want.size(); ++b) {
    const float* got = whole.data() + b * d;
    if (indexer) {
      EXPECT_TRUE(check_quantized(got, want[b], 0, d, 32, false, 1e-5, &loose)) << "entry " << b;
    } else {
      EXPECT_TRUE(check_quantized(got, want[b], 0, d - kCompRope, 64, true, 1e-5, &loose)) << "entry " << b;
      const std::vector<double> rope_part(want[b].begin() + (d - kCompRope), want[b].end());
      EXPECT_TRUE(close_all(got + (d - kCompRope), rope_part, 1e-5, 1e-5)) << "rope part of entry " << b;
    }
  }
  EXPECT_LE(loose, static_cast<int>(want.size()) * 2) << "too many values on rounding midpoints";

  // Any chunking gives the same entries, bit for bit.
  for (const std::vector<int64_t>& chunks : {std::vector<int64_t>{1}, {3}, {5}, {1, 3, 5, 2, 7}, {ratio - 1, ratio + 1}}) {
    const std::vector<float> part = run_compress(k, rope, x, N, chunks, indexer);
    ASSERT_EQ(part.size(), whole.size());
    for (size_t i = 0; i < part.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(part[i]), std::bit_cast<uint32_t>(whole[i]))
          << "chunks starting " << chunks[0] << ": value " << i << " " << part[i] << " vs " << whole[i];
  }
}

}  // namespace

TEST(Compressor, Ratio4OverlapBF16) { check_compress(4, WFormat::BF16, 29, false, 21); }
TEST(Compressor, Ratio4OverlapF32) { check_compress(4, WFormat::F32, 18, false, 22); }
TEST(Compressor, Ratio3NoOverlap) { check_compress(3, WFormat::BF16, 29, false, 23); }
TEST(Compressor, Ratio16NoOverlap) { check_compress(16, WFormat::F32, 40, false, 24); }
TEST(Compressor, IndexerHadamardFp4) { check_compress(4, WFormat::BF16, 29, true, 25); }

TEST(Compressor, FirstRatio4EntryHasNoPreviousBlock) {
  // Entry 0 of a ratio-4 compressor pools block 0 only, through channels [d, 2d): with a huge
  // gate bias on channels [0, d) (which would dominate if an empty previous block took part)
  // the entry still equals the pooling of block 0 alone.
  std::mt19937 g(26);
  CompCase k = make_comp_case(4, WFormat::F32, g);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t ch = 0; ch < kCompOut; ++ch) k.w.ape[r * 2 * kCompOut + ch] = 50.0f;
  const RopeTable rope = make_rope(kCompRope, 160000.0, true, 16.0, 65536, 32.0, 1.0);
  const auto x = randv(g, static_cast<size_t>(4 * kCompD));
  const auto want = ref_compress(k, x, 4, rope.freq, false);
  ASSERT_EQ(want.size(), 1u);
  const std::vector<float> got = run_compress(k, rope, x, 4, {4}, false);
  ASSERT_EQ(got.size(), static_cast<size_t>(kCompOut));
  int loose = 0;
  EXPECT_TRUE(check_quantized(got.data(), want[0], 0, kCompOut - kCompRope, 64, true, 1e-5, &loose));
  const std::vector<double> rope_part(want[0].begin() + (kCompOut - kCompRope), want[0].end());
  EXPECT_TRUE(close_all(got.data() + (kCompOut - kCompRope), rope_part, 1e-5, 1e-5));
}

TEST(Compressor, EntriesRopedAtBlockStart) {
  // Undoing RoPE at b*c on an entry's rope part gives the same vector for every block when the
  // pooled values are identical: the rotation angle is exactly the block start's.
  std::mt19937 g(27);
  CompCase k = make_comp_case(16, WFormat::F32, g);
  std::fill(k.w.ape.begin(), k.w.ape.end(), 0.0f);
  const RopeTable rope = make_rope(kCompRope, 160000.0, true, 16.0, 65536, 32.0, 1.0);
  const auto row = randv(g, static_cast<size_t>(kCompD));
  std::vector<float> x;
  for (int t = 0; t < 48; ++t) x.insert(x.end(), row.begin(), row.end());  // every position the same
  const std::vector<float> got = run_compress(k, rope, x, 48, {48}, false);
  ASSERT_EQ(got.size(), static_cast<size_t>(3 * kCompOut));
  std::vector<float> e0(got.begin(), got.begin() + kCompOut);
  for (int64_t b = 1; b < 3; ++b) {
    std::vector<float> e(got.begin() + b * kCompOut, got.begin() + (b + 1) * kCompOut);
    rope.apply(e.data(), kCompOut, b * 16, true);
    std::vector<double> want(e0.begin(), e0.end());
    EXPECT_TRUE(close_all(e.data(), want, 1e-5, 1e-5)) << "block " << b;
  }
}

// ---- attention ----------------------------------------------------------------------------------

namespace {

std::vector<double> ref_attend(const float* q, const std::vector<std::vector<float>>& keys, int64_t d, double sink,
                               double scale, bool with_sink = true) {
  std::vector<double> s;
  for (const auto& k : keys) {
    double v = 0;
    for (int64_t i = 0; i < d; ++i) v += static_cast<double>(q[i]) * k[i];
    s.push_back(v * scale);
  }
  double den = with_sink ? std::exp(sink) : 0.0;
  for (double v : s) den += std::exp(v);
  std::vector<double> out(static_cast<size_t>(d), 0.0);
  for (size_t j = 0; j < keys.size(); ++j)
    for (int64_t i = 0; i < d; ++i) out[i] += std::exp(s[j]) / den * keys[j][i];
  return out;
}

}  // namespace

// One head through attend_heads, keys given as separate vectors.
static void attend_with_sink(const float* q, const std::vector<const float*>& keys, int64_t d, float sink, float scale, float* out) {
  std::vector<float> K;
  for (const float* k : keys) K.insert(K.end(), k, k + d);
  attend_heads(q, 1, K.data(), static_cast<int64_t>(keys.size()), d, &sink, scale, out);
}

TEST(Attention, SinkSoftmax) {
  std::mt19937 g(31);
  const int64_t d = 24, n = 7;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const auto q = randv(g, d, -2.0f, 2.0f);
  std::vector<std::vector<float>> keys;
  std::vector<const float*> ptrs;
  for (int64_t j = 0; j < n; ++j) keys.push_back(randv(g, d, -2.0f, 2.0f));
  for (const auto& k : keys) ptrs.push_back(k.data());
  std::vector<float> out(d, std::nanf(""));
  for (float sink : {0.3f, -2.0f, 3.0f}) {
    attend_with_sink(q.data(), ptrs, d, sink, scale, out.data());
    EXPECT_TRUE(close_all(out.data(), ref_attend(q.data(), keys, d, sink, scale), 1e-5, 1e-6)) << "sink " << sink;
  }
  // Very negative sink: plain softmax.
  attend_with_sink(q.data(), ptrs, d, -1e4f, scale, out.data());
  EXPECT_TRUE(close_all(out.data(), ref_attend(q.data(), keys, d, 0, scale, false), 1e-5, 1e-6));
  // The sink is in the denominator only: the weights sum to less than 1. With keys all equal to
  // one vector k, out = k * sum_j p_j = k * n e^s / (n e^s + e^sink).
  std::vector<std::vector<float>> same(3, keys[0]);
  std::vector<const float*> sp = {same[0].data(), same[1].data(), same[2].data()};
  attend_with_sink(q.data(), sp, d, 1.5f, scale, out.data());
  double s0 = 0;
  for (int64_t i = 0; i < d; ++i) s0 += static_cast<double>(q[i]) * keys[0][i];
  const double es = std::exp(s0 * scale), frac = 3 * es / (3 * es + std::exp(1.5));
  for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(out[i], keys[0][i] * frac, 1e-5) << i;
}

TEST(Attention, ManyHeadsEachWithItsSink) {
  std::mt19937 g(32);
  const int64_t d = 80, n = 45, H = 11;  // sizes off every SIMD tile
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<std::vector<float>> keys;
  std::vector<float> K;
  for (int64_t j = 0; j < n; ++j) {
    keys.push_back(randv(g, d, -2.0f, 2.0f));
    K.insert(K.end(), keys.back().begin(), keys.back().end());
  }
  std::vector<float> Q, sinks;
  for (int64_t h = 0; h < H; ++h) {
    auto q = randv(g, d, -2.0f, 2.0f);
    Q.insert(Q.end(), q.begin(), q.end());
    sinks.push_back(static_cast<float>(h) * 0.5f - 2.0f);
  }
  std::vector<float> out(static_cast<size_t>(H * d));
  attend_heads(Q.data(), H, K.data(), n, d, sinks.data(), scale, out.data());
  for (int64_t h = 0; h < H; ++h)
    EXPECT_TRUE(close_all(out.data() + h * d, ref_attend(Q.data() + h * d, keys, d, sinks[h], scale), 1e-5, 1e-6)) << "head " << h;
  // attend_scores on the calling thread (the prefill runs queries in parallel) = on the pool;
  // the keys through row pointers to where they lie (the keys vectors, not K).
  std::vector<const float*> kr;
  for (const auto& k : keys) kr.push_back(k.data());
  std::vector<float> p(static_cast<size_t>(H * n)), p2, pooled(out.size()), local(out.size());
  query_key_scores(Q.data(), H, kr.data(), n, d, p.data());  // p[h * n + j] = q_h . K_j
  p2 = p;
  attend_scores(p.data(), H, kr.data(), n, d, sinks.data(), scale, pooled.data(), RunOn::Pool);
  attend_scores(p2.data(), H, kr.data(), n, d, sinks.data(), scale, local.data(), RunOn::Caller);
  EXPECT_EQ(std::memcmp(pooled.data(), local.data(), sizeof(float) * pooled.size()), 0);
  EXPECT_EQ(std::memcmp(pooled.data(), out.data(), sizeof(float) * pooled.size()), 0);  // = attend_heads
  // A query's scores from a larger product (the heads among other rows, the keys among others,
  // as a prefill block scores the union of its keys): the same floats.
  std::vector<float> Q2 = randv(g, static_cast<size_t>(3 * d), -2.0f, 2.0f), K2 = randv(g, static_cast<size_t>(40 * d), -2.0f, 2.0f);
  Q2.insert(Q2.end(), Q.begin(), Q.end());
  K2.insert(K2.end(), K.begin(), K.end());
  const int64_t nq2 = 3 + H, n2 = 40 + n;
  std::vector<float> big(static_cast<size_t>(nq2 * n2)), mine(static_cast<size_t>(H * n));
  std::vector<const float*> k2r;
  for (int64_t j = 0; j < n2; ++j) k2r.push_back(K2.data() + j * d);
  query_key_scores(Q2.data(), nq2, k2r.data(), n2, d, big.data());
  query_key_scores(Q.data(), H, kr.data(), n, d, mine.data());
  for (int64_t h = 0; h < H; ++h)
    EXPECT_EQ(std::memcmp(big.data() + (3 + h) * n2 + 40, mine.data() + h * n, sizeof(float) * n), 0) << "head " << h;
}

TEST(Attention, ZeroKeysGiveZero) {
  const int64_t d = 16;
  std::vector<float> q(d, 1.0f), out(d, std::nanf(""));
  attend_with_sink(q.data(), {}, d, 0.5f, 0.25f, out.data());  // no visible keys
  for (float v : out) EXPECT_EQ(v, 0.0f);
  std::vector<float> zero(d, 0.0f);
  std::fill(out.begin(), out.end(), std::nanf(""));
  attend_with_sink(q.data(), {zero.data(), zero.data()}, d, 0.5f, 0.25f, out.data());  // zero vectors
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

// Keys as the cache holds them (Fp4Codec bytes, one page); `vals` are fp4sim'd so the bytes
// decode back to them exactly.
struct Fp4Rows {
  std::vector<uint8_t> bytes;
  const uint8_t* page = nullptr;
  Fp4Keys keys;
  Fp4Rows(const std::vector<float>& vals, int64_t dim) {
    const Fp4Codec codec{dim};
    const int64_t n = static_cast<int64_t>(vals.size()) / dim;
    bytes.resize(static_cast<size_t>(n) * codec.bytes());
    for (int64_t b = 0; b < n; ++b) codec.encode(vals.data() + b * dim, bytes.data() + b * codec.bytes());
    page = bytes.data();
    keys = Fp4Keys{&page, std::max<int64_t>(n, 1), static_cast<int64_t>(codec.bytes())};
  }
};

std::vector<int32_t> select1(const std::vector<float>& q, const std::vector<float>& w, const Fp4Rows& k, int64_t n,
                             int64_t heads, int64_t dim, int64_t topk_k) {
  std::vector<int32_t> sel(static_cast<size_t>(topk_k), -1);
  int32_t cnt = -1;
  indexer_select(q.data(), w.data(), 1, &n, k.keys, heads, dim, topk_k, sel.data(), &cnt);
  sel.resize(static_cast<size_t>(std::max(cnt, 0)));
  return sel;
}

TEST(Attention, IndexerTopK) {
  std::mt19937 g(32);
  const int64_t heads = 4, dim = 32, n = 20;
  const auto q = randv(g, static_cast<size_t>(heads * dim));
  const auto w = randv(g, static_cast<size_t>(heads), -1.0f, 1.0f);
  auto keys = randv(g, static_cast<size_t>(n * dim));
  fp4sim(keys.data(), keys.size(), 32);
  const Fp4Rows k(keys, dim);
  std::vector<double> score(n, 0.0);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      double dp = 0;
      for (int64_t i = 0; i < dim; ++i) dp += static_cast<double>(q[h * dim + i]) * keys[b * dim + i];
      score[b] += w[h] * std::max(0.0, dp);
    }
  for (int64_t kk : {1, 5, 19, 20, 30}) EXPECT_EQ(select1(q, w, k, n, heads, dim, kk), ref_topk(score, kk)) << "k = " << kk;
  // n < k: every entry.
  EXPECT_EQ(select1(q, w, k, 3, heads, dim, 8).size(), 3u);
  EXPECT_TRUE(select1(q, w, k, 0, heads, dim, 8).empty());
  // Several queries in one scan, each up to its own visible count: as each alone.
  const int64_t nq = 3, kk = 6;
  const int64_t vis[nq] = {20, 7, 0};
  std::vector<float> qs, ws;
  for (int64_t t = 0; t < nq; ++t) {
    const auto qt = randv(g, static_cast<size_t>(heads * dim)), wt = randv(g, static_cast<size_t>(heads));
    qs.insert(qs.end(), qt.begin(), qt.end());
    ws.insert(ws.end(), wt.begin(), wt.end());
  }
  std::vector<int32_t> sel(static_cast<size_t>(nq * kk), -1), cnt(static_cast<size_t>(nq), -1);
  indexer_select(qs.data(), ws.data(), nq, vis, k.keys, heads, dim, kk, sel.data(), cnt.data());
  for (int64_t t = 0; t < nq; ++t) {
    const std::vector<float> qt(qs.begin() + t * heads * dim, qs.begin() + (t + 1) * heads * dim);
    const std::vector<float> wt(ws.begin() + t * heads, ws.begin() + (t + 1) * heads);
    const std::vector<int32_t> alone = select1(qt, wt, k, vis[t], heads, dim, kk);
    ASSERT_EQ(cnt[t], static_cast<int32_t>(alone.size())) << "query " << t;
    EXPECT_EQ(std::vector<int32_t>(sel.begin() + t * kk, sel.begin() + t * kk + cnt[t]), alone) << "query " << t;
  }
}

TEST(Attention, IndexerTiesGoToLowerIndex) {
  // heads 2, dim 32; q = (1,0,...) for both heads, w = (1, 0.5). Zero keys score exactly 0, as do
  // keys every head's dot with is negative (relu).
  const int64_t heads = 2, dim = 32, n = 8;
  std::vector<float> q(static_cast<size_t>(heads * dim), 0.0f);
  q[0] = q[dim] = 1.0f;
  const std::vector<float> w = {1.0f, 0.5f};
  std::vector<float> keys(static_cast<size_t>(n * dim), 0.0f);
  keys[2 * dim] = 2.0f;   // entry 2: score 3
  keys[6 * dim] = 1.0f;   // entry 6: score 1.5
  keys[4 * dim] = -4.0f;  // entry 4: relu -> 0
  const Fp4Rows k(keys, dim);
  // Entries 0, 1, 3, 4, 5, 7 all score 0.
  EXPECT_EQ(select1(q, w, k, n, heads, dim, 5), (std::vector<int32_t>{2, 6, 0, 1, 3}));
  EXPECT_EQ(select1(q, w, k, n, heads, dim, 6), (std::vector<int32_t>{2, 6, 0, 1, 3, 4}));
  // Negative head weights: score = sum_h w_h relu(.), can be negative and rank below zeros.
  const std::vector<float> wn = {-1.0f, 0.5f};
  EXPECT_EQ(select1(q, wn, k, n, heads, dim, 7), (std::vector<int32_t>{0, 1, 3, 4, 5, 7, 6}));
}

// ---- MoE ----------------------------------------------------------------------------------------

TEST(Moe, RouteHashIds) {
  const int64_t E = 8, k = 3;
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.1f, -3.0f, 1.5f, 0.0f, 4.0f};
  const std::vector<float> bias = {9, 9, 9, 9, 9, 9, 9, 9};  // ignored on the hash path
  const int32_t hash[3] = {4, 1, 6};
  int32_t ids[3];
  float wts[3];
  route_token(logits.data(), E, k, bias.data(), hash, 2.5, ids, wts);
  double sum = 0;
  for (int j = 0; j < 3; ++j) sum += std::sqrt(ref_softplus(logits[hash[j]]));
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(ids[j], hash[j]);
    EXPECT_NEAR(wts[j], std::sqrt(ref_softplus(logits[hash[j]])) / sum * 2.5, 1e-6) << j;
  }
  route_token(logits.data(), E, k, nullptr, hash, 1.0, ids, wts);
  EXPECT_NEAR(wts[0] + wts[1] + wts[2], 1.0, 1e-6);
}

TEST(Moe, RouteTopKBiasSelectsOnly) {
  const int64_t E = 8, k = 2;
  const std::vector<float> logits = {3.0f, 2.5f, 0.0f, -1.0f, 0.2f, -2.0f, 0.1f, 1.0f};
  std::vector<double> a(E);
  for (int64_t e = 0; e < E; ++e) a[e] = std::sqrt(ref_softplus(logits[e]));
  int32_t ids[2];
  float wts[2];
  auto check = [&](const std::vector<float>* bias, double scale, std::vector<int32_t> want_ids) {
    route_token(logits.data(), E, k, bias ? bias->data() : nullptr, nullptr, scale, ids, wts);
    std::map<int32_t, float> got;
    for (int j = 0; j < k; ++j) got[ids[j]] = wts[j];
    ASSERT_EQ(got.size(), want_ids.size());
    double sum = 0;
    for (int32_t e : want_ids) sum += a[e];
    for (int32_t e : want_ids) {
      ASSERT_TRUE(got.count(e)) << "expert " << e << " not selected";
      EXPECT_NEAR(got[e], a[e] / sum * scale, 1e-6) << "expert " << e;  // from a, not a + bias
    }
  };
  check(nullptr, 1.0, {0, 1});
  const std::vector<float> zero(E, 0.0f);
  check(&zero, 2.5, {0, 1});
  // The bias moves the selection to experts 5 and 3 (lowest logits but large bias).
  std::vector<float> bias(E, 0.0f);
  bias[5] = 10.0f;
  bias[3] = 8.0f;
  check(&bias, 2.5, {5, 3});
  EXPECT_EQ(ids[0], 5);  // descending a + bias
  EXPECT_EQ(ids[1], 3);
  // Bias only on one: {5, 0}.
  bias[3] = 0.0f;
  check(&bias, 1.5, {5, 0});
}

TEST(Moe, SwigluClamped) {
  const std::vector<float> g0 = {-15.0f, -3.0f, 0.5f, 9.0f, 12.0f, 50.0f, -50.0f, 2.0f};
  const std::vector<float> u = {20.0f, -20.0f, 0.7f, -11.0f, 3.0f, -30.0f, 5.0f, 10.5f};
  const float w = 0.8f;
  for (float lim : {10.0f, 0.0f}) {
    std::vector<float> h = g0;
    swiglu_clamped(h.data(), u.data(), static_cast<int64_t>(h.size()), lim, w);
    for (size_t j = 0; j < h.size(); ++j) {
      double gv = g0[j], uv = u[j];
      if (lim > 0) {
        uv = std::clamp(uv, -10.0, 10.0);  // up projection: both sides
        gv = std::min(gv, 10.0);           // gate: only from above
      }
      const double want = ref_silu(gv) * uv * w;
      EXPECT_NEAR(h[j], want, 1e-5 * std::fabs(want) + 1e-30) << "lim " << lim << " j " << j;
    }
  }
  // g = -15 is not raised to -10: silu(-15) * 10 * 0.8 is ~ -3.7e-5, not silu(-10) * 8 ~ -3.6e-3.
  std::vector<float> h = {-15.0f};
  const float uu = 20.0f;
  swiglu_clamped(h.data(), &uu, 1, 10.0f, 0.8f);
  EXPECT_NEAR(h[0], ref_silu(-15.0) * 10.0 * 0.8, 1e-9);
}
