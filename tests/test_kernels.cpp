// qmatmul (src/cpu): every stored format x every ISA this CPU has x both kernel paths (fused,
// panel GEMM), against a double-precision reference built from dequant_row, plus a bit-exact
// decode check (one-hot activations reproduce dequant_row's values), bit-exact batch
// invariance (an output does not depend on T, batch position, row range, strides, thread count
// or path) and ISA-vs-ISA agreement.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threads.h"
#include "core/weight.h"
#include "kernels/cpu/qmatmul.h"
#include "test_weights.h"

using namespace dsv4;
using namespace dsv4::testing;

namespace {

std::vector<float> run(const QWeight& w, const Problem& p) {
  std::vector<float> y(static_cast<size_t>(p.T * p.ldy), kSentinel);
  qmatmul(w, p.r0, p.r1, p.x.data(), p.ldx, p.T, y.data(), p.ldy);
  return y;
}

struct Shape {
  int64_t rows, cols;
};

std::vector<Shape> shapes_for(WFormat f) {
  if (f == WFormat::MXFP4 || f == WFormat::NVFP4) return {{130, 288}, {37, 96}, {9, 100}};
  return {{130, 260}, {37, 96}, {9, 5}};
}

// Path selection: default threshold, everything fused, everything through the GEMM path.
constexpr int kPaths[] = {-1, 1 << 20, 0};
const char* path_name(int p) { return p < 0 ? "default" : p == 0 ? "gemm" : "fused"; }

struct Fp8Guard {
  explicit Fp8Guard(Fp8Decode d) { set_fp8_decode_override(d); }
  ~Fp8Guard() { clear_fp8_decode_override(); }
};

struct IsaGuard {
  explicit IsaGuard(Isa isa) { set_isa_override(isa); }
  ~IsaGuard() {
    clear_isa_override();
    set_qmatmul_fused_max_tokens(-1);
  }
};

void run_isa_suite(Isa isa) {
  IsaGuard guard(isa);
  uint32_t seed = 1;
  for (WFormat f : kAllFormats) {
    for (const Shape& s : shapes_for(f)) {
      const OwnedWeight o = make_weight(f, s.rows, s.cols, seed++);
      const std::vector<float> deq = dequant_all(o.w);
      for (int64_t T : {1, 2, 3, 8, 37}) {
        const int64_t r0 = s.rows > 8 ? 5 : 1, r1 = s.rows > 8 ? s.rows - 3 : s.rows;
        const Problem p = make_problem(o.w, r0, r1, T, seed++);
        for (int path : kPaths) {
          if (isa == Isa::Scalar && path != -1) continue;  // one path only
          set_qmatmul_fused_max_tokens(path);
          const std::string what = std::string(isa_name(isa)) + " " + wformat_name(f) + " " +
                                   std::to_string(s.rows) + "x" + std::to_string(s.cols) + " T=" +
                                   std::to_string(T) + " path=" + path_name(path);
          check_against_reference(o.w, deq, p, run(o.w, p), what);
        }
      }
    }
  }
}

// Larger than one K chunk and one row panel per thread, so chunk accumulation and panel edges run.
void run_isa_large(Isa isa) {
  IsaGuard guard(isa);
  uint32_t seed = 100;
  for (WFormat f : kAllFormats) {
    const bool fp4 = f == WFormat::MXFP4 || f == WFormat::NVFP4;
    const OwnedWeight o = make_weight(f, 300, fp4 ? 2336 : 2200, seed++);
    const std::vector<float> deq = dequant_all(o.w);
    for (int64_t T : {1, 5, 40}) {
      const Problem p = make_problem(o.w, 3, 299, T, seed++);
      check_against_reference(o.w, deq, p, run(o.w, p),
                              std::string(isa_name(isa)) + " large " + wformat_name(f) + " T=" + std::to_string(T));
    }
  }
}

// One-hot activations: token t selects column t, so y[t][r] must equal W[r][t] exactly (every
// other product is zero and every scale multiply is exact) on both paths.
void run_isa_exact(Isa isa) {
  IsaGuard guard(isa);
  uint32_t seed = 200;
  for (WFormat f : kAllFormats) {
    const bool fp4 = f == WFormat::MXFP4 || f == WFormat::NVFP4;
    const OwnedWeight o = make_weight(f, 140, fp4 ? 160 : 150, seed++);
    const std::vector<float> deq = dequant_all(o.w);
    const int64_t T = o.w.cols;
    std::vector<float> x(static_cast<size_t>(T * T), 0.0f);
    for (int64_t t = 0; t < T; ++t) x[t * T + t] = 1.0f;
    for (int path : {1 << 20, 0}) {
      set_qmatmul_fused_max_tokens(path);
      std::vector<float> y(static_cast<size_t>(T * o.w.rows));
      qmatmul(o.w, 0, o.w.rows, x.data(), T, T, y.data(), o.w.rows);
      int bad = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < o.w.rows; ++r) {
          const float want = deq[r * o.w.cols + t], got = y[t * o.w.rows + r];
          if (got != want && bad++ < 5) {
            ADD_FAILURE() << isa_name(isa) << " " << wformat_name(f) << " path=" << path_name(path) << " W[" << r
                          << "," << t << "] got " << got << " want " << want;
          }
        }
      EXPECT_EQ(bad, 0);
    }
  }
}

// Batch invariance, bit for bit: for a fixed ISA, every output (row r, token t) must be the same
// float whatever the batch around it: T=1 (each token alone) vs batches of 3, 7, 37, 100 at
// several offsets (so a token sits at different positions in its batch), row sub-ranges, x and y
// strides, thread counts, and the fused vs GEMM path. Prefill chunking relies on this (see
// qmatmul.h).
void run_isa_invariance(Isa isa) {
  IsaGuard guard(isa);
  uint32_t seed = 400;
  for (WFormat f : kAllFormats) {
    const bool fp4 = f == WFormat::MXFP4 || f == WFormat::NVFP4;
    // Long rows (several K chunks, partial last group), FP8 scale blocks crossed by row tiles,
    // many rows (whole 128-row blocks and full token blocks on each of two threads), and a
    // small shape.
    // Rows longer than 4096 columns decode half-height GEMM panels (kPanelBytes).
    const Shape shapes[] = {{150, fp4 ? 2340 : 2339}, {300, fp4 ? 640 : 601}, {37, 100}, {70, fp4 ? 4226 : 4229}};
    for (const Shape& s : shapes) {
      const OwnedWeight o = make_weight(f, s.rows, s.cols, seed++);
      constexpr int64_t NT = 100;
      const int64_t rows = s.rows, cols = s.cols, ldx = cols + 3;
      std::mt19937 g(seed++);
      std::uniform_real_distribution<float> d(-1.0f, 1.0f);
      std::vector<float> x(static_cast<size_t>(NT * ldx), std::numeric_limits<float>::quiet_NaN());
      for (int64_t t = 0; t < NT; ++t)
        for (int64_t c = 0; c < cols; ++c) x[t * ldx + c] = d(g);
      // Reference: each token alone, default path, all rows.
      std::vector<float> ref(static_cast<size_t>(NT * rows));
      set_qmatmul_fused_max_tokens(-1);
      for (int64_t t = 0; t < NT; ++t) qmatmul(o.w, 0, rows, x.data() + t * ldx, ldx, 1, ref.data() + t * rows, rows);
      int bad = 0;
      // Tokens [t0, t0+T) as one batch (x copied with another stride), rows [r0, r1).
      auto check = [&](int path, int64_t t0, int64_t T, int64_t r0, int64_t r1) {
        set_qmatmul_fused_max_tokens(path);
        // Odd batches dense (ldx == cols: small F32 weights then swap operands, see qmatmul),
        // even ones strided.
        const int64_t ldx2 = T % 2 == 1 ? cols : cols + 11, ldy = (r1 - r0) + 2;
        std::vector<float> xb(static_cast<size_t>(T * ldx2), std::numeric_limits<float>::quiet_NaN());
        for (int64_t t = 0; t < T; ++t) std::memcpy(&xb[t * ldx2], &x[(t0 + t) * ldx], sizeof(float) * cols);
        std::vector<float> y(static_cast<size_t>(T * ldy), kSentinel);
        qmatmul(o.w, r0, r1, xb.data(), ldx2, T, y.data(), ldy);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t i = 0; i < r1 - r0; ++i) {
            const float got = y[t * ldy + i], want = ref[(t0 + t) * rows + r0 + i];
            if (std::memcmp(&got, &want, sizeof(float)) != 0 && bad++ < 5) {
              ADD_FAILURE() << isa_name(isa) << " " << wformat_name(f) << " " << rows << "x" << cols
                            << " path=" << path_name(path) << " batch [" << t0 << "," << t0 + T << ") rows [" << r0
                            << "," << r1 << "): token " << t0 + t << " row " << r0 + i << " got " << got
                            << " alone " << want;
            }
          }
      };
      for (int path : kPaths) {
        if (isa == Isa::Scalar && path != -1) continue;  // one path only
        for (int64_t t = 0; t < NT; t += 7) check(path, t, 1, 0, rows);
        for (int64_t T : {3, 7, 37, 100}) {
          check(path, 0, T, 0, rows);
          if (T < NT) {
            check(path, NT - T, T, 0, rows);
            check(path, (NT - T) / 2 + 1, T, 0, rows);
          }
        }
        check(path, 5, 7, 3, rows - 2);
        check(path, 20, 37, rows / 2, rows / 2 + 1);
        check(path, 0, 100, rows / 3, rows);
        check(path, 1, 2, 1, rows - 1);
        check(path, 90, 9, 2, rows / 2 + 3);
        check(path, 11, 17, 0, rows / 3 + 1);
        // Other thread counts split rows (or tokens) elsewhere.
        for (int threads : {1, 3}) {
          set_threads(threads);
          check(path, 0, 100, 0, rows);
          check(path, 4, 13, 1, rows);
          set_threads(0);
        }
      }
      EXPECT_EQ(bad, 0) << isa_name(isa) << " " << wformat_name(f) << " " << rows << "x" << cols;
    }
  }
}

// qmatmul_many must give, bit for bit, what each call gives alone: every format in one job,
// fused and GEMM-path calls mixed, calls that share x (packed once) next to calls with the same
// x but another T, format or row length (which must not share), row ranges and strides, empty
// calls, and other thread counts.
void run_isa_many(Isa isa) {
  IsaGuard guard(isa);
  uint32_t seed = 700;
  constexpr int64_t kCols = 640, kLdx = kCols + 5, kNT = 30;
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(kNT * kLdx));
  for (float& v : x) v = d(g);
  std::vector<OwnedWeight> ws;
  std::vector<Matmul> calls;
  auto add = [&](WFormat f, int64_t rows, int64_t cols, int64_t T, int64_t r0, int64_t r1, const float* xp,
                 int64_t ldx) {
    ws.push_back(make_weight(f, rows, cols, seed++));
    Matmul c;
    c.T = T;
    c.x = xp;
    c.r0 = r0;
    c.r1 = r1;
    c.ldx = ldx;
    calls.push_back(c);
  };
  for (WFormat f : kAllFormats) {
    add(f, 70, kCols, 2, 0, -1, x.data(), kLdx);         // w1 and w3 of an expert: x shared
    add(f, 70, kCols, 2, 0, -1, x.data(), kLdx);
    add(f, 37, kCols, 3, 0, -1, x.data(), kLdx);         // the same x, another T
    add(f, 37, kCols - 128, 3, 0, -1, x.data(), kLdx);  // the same x and T, shorter rows
    add(f, 130, kCols, 1, 5, 127, x.data() + 7 * kLdx, kLdx);
    add(f, 9, kCols, 8, 0, -1, x.data() + kLdx, kLdx);
    add(f, 40, kCols, 30, 2, 39, x.data(), kLdx);  // past the crossover on most ISAs: GEMM path
    add(f, 12, kCols, 0, 0, -1, x.data(), kLdx);   // no tokens
    add(f, 12, kCols, 1, 4, 4, x.data(), kLdx);    // no rows
  }
  // A few F32 rows against many tokens, dense: qmatmul swaps operands.
  add(WFormat::F32, 4, kCols, 26, 0, -1, x.data(), kCols);
  for (size_t i = 0; i < calls.size(); ++i) calls[i].w = &ws[i].w;
  // Each call alone.
  std::vector<std::vector<float>> want(calls.size()), got(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    Matmul& c = calls[i];
    const int64_t r1 = c.r1 < 0 ? c.w->rows : c.r1;
    c.ldy = (r1 - c.r0) + 3;
    want[i].assign(static_cast<size_t>(std::max<int64_t>(c.T, 1) * c.ldy), kSentinel);
    got[i] = want[i];
    qmatmul(*c.w, c.r0, r1, c.x, c.ldx, c.T, want[i].data(), c.ldy);
  }
  for (int threads : {0, 1, 3}) {
    set_threads(threads);
    for (size_t i = 0; i < calls.size(); ++i) {
      std::fill(got[i].begin(), got[i].end(), kSentinel);
      calls[i].y = got[i].data();
    }
    qmatmul_many(calls.data(), static_cast<int64_t>(calls.size()));
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), sizeof(float) * got[i].size()))
          << isa_name(isa) << " call " << i << " (" << wformat_name(calls[i].w->fmt) << " " << calls[i].w->rows << "x"
          << calls[i].w->cols << " T=" << calls[i].T << ") threads=" << threads;
    }
  }
  set_threads(0);
}

// A macro: GTEST_SKIP returns from the function it is written in, which must be the test body.
#define REQUIRE_ISA(isa) \
  if (!isa_supported(isa)) GTEST_SKIP() << "CPU lacks " << isa_name(isa)

}  // namespace

TEST(Kernels, IsaQueries) {
  EXPECT_TRUE(isa_supported(Isa::Scalar));
  EXPECT_TRUE(isa_supported(best_isa()));
  EXPECT_TRUE(isa_supported(active_isa()));
  for (Isa isa : {Isa::Scalar, Isa::AVX2, Isa::AVX512}) {
    if (isa_supported(isa)) {
      set_isa_override(isa);
      EXPECT_EQ(active_isa(), isa);
    } else {
      EXPECT_THROW(set_isa_override(isa), Error);
    }
  }
  clear_isa_override();
  std::printf("best ISA: %s, active: %s\n", isa_name(best_isa()), isa_name(active_isa()));
}

TEST(Kernels, RejectsBadArguments) {
  const OwnedWeight o = make_weight(WFormat::F32, 4, 8, 7);
  std::vector<float> x(8, 1.0f), y(4);
  EXPECT_THROW(qmatmul(o.w, 0, 5, x.data(), 8, 1, y.data(), 4), Error);
  EXPECT_THROW(qmatmul(o.w, 3, 2, x.data(), 8, 1, y.data(), 4), Error);
  QWeight empty;
  EXPECT_THROW(qmatmul(empty, 0, 0, x.data(), 8, 1, y.data(), 4), Error);
  // Nothing to do: no rows or no tokens.
  qmatmul(o.w, 2, 2, x.data(), 8, 1, y.data(), 4);
  qmatmul(o.w, 0, 4, x.data(), 8, 0, y.data(), 4);
}

TEST(Kernels, EdgeCases) {
  for (Isa isa : {Isa::Scalar, Isa::AVX2, Isa::AVX512}) {
    if (!isa_supported(isa)) continue;
    IsaGuard guard(isa);
    for (int path : kPaths) {
      set_qmatmul_fused_max_tokens(path);
      // No columns: every sum is empty.
      OwnedWeight z = make_weight(WFormat::F32, 5, 0, 9);
      z.w.data = reinterpret_cast<const uint8_t*>("");  // non-null, never read
      std::vector<float> x(3, 1.0f), y(3 * 5, kSentinel);
      qmatmul(z.w, 0, 5, x.data(), 1, 3, y.data(), 5);
      for (float v : y) EXPECT_EQ(v, 0.0f) << isa_name(isa);
      // One row, one column; then again after the scratch is released.
      const OwnedWeight o = make_weight(WFormat::FP8Block, 1, 1, 10);
      const float want = dequant_all(o.w)[0] * 2.0f;
      for (int k = 0; k < 2; ++k) {
        const float two = 2.0f;
        float out = 0;
        qmatmul(o.w, 0, 1, &two, 1, 1, &out, 1);
        EXPECT_EQ(out, want) << isa_name(isa) << " path=" << path_name(path);
        qmatmul_release_scratch();
      }
    }
  }
}

TEST(Kernels, Scalar) { run_isa_suite(Isa::Scalar); }
TEST(Kernels, ScalarBatchInvariant) { run_isa_invariance(Isa::Scalar); }
TEST(Kernels, ScalarLarge) { run_isa_large(Isa::Scalar); }
TEST(Kernels, ScalarManyEqualsOneByOne) { run_isa_many(Isa::Scalar); }

TEST(Kernels, AVX2) {
  REQUIRE_ISA(Isa::AVX2);
  run_isa_suite(Isa::AVX2);
}
TEST(Kernels, AVX2Large) {
  REQUIRE_ISA(Isa::AVX2);
  run_isa_large(Isa::AVX2);
}
TEST(Kernels, AVX2ExactDecode) {
  REQUIRE_ISA(Isa::AVX2);
  run_isa_exact(Isa::AVX2);
}
TEST(Kernels, AVX2BatchInvariant) {
  REQUIRE_ISA(Isa::AVX2);
  run_isa_invariance(Isa::AVX2);
}
TEST(Kernels, AVX2ManyEqualsOneByOne) {
  REQUIRE_ISA(Isa::AVX2);
  run_isa_many(Isa::AVX2);
}

TEST(Kernels, AVX512) {
  REQUIRE_ISA(Isa::AVX512);
  run_isa_suite(Isa::AVX512);
}
TEST(Kernels, AVX512Large) {
  REQUIRE_ISA(Isa::AVX512);
  run_isa_large(Isa::AVX512);
}
TEST(Kernels, AVX512ExactDecode) {
  REQUIRE_ISA(Isa::AVX512);
  run_isa_exact(Isa::AVX512);
}
TEST(Kernels, AVX512BatchInvariant) {
  REQUIRE_ISA(Isa::AVX512);
  run_isa_invariance(Isa::AVX512);
}
TEST(Kernels, AVX512ManyEqualsOneByOne) {
  REQUIRE_ISA(Isa::AVX512);
  run_isa_many(Isa::AVX512);
}

// Each token alone (fused, T=1) and a fused batch of 5 must give bit for bit what the whole
// batch gives on the GEMM path.
void expect_fused_equals_gemm(const QWeight& w, const Problem& p, const std::string& what) {
  const int64_t NT = p.T;
  set_qmatmul_fused_max_tokens(-1);
  std::vector<float> alone(static_cast<size_t>(NT * p.ldy), kSentinel);
  for (int64_t t = 0; t < NT; ++t) qmatmul(w, 0, w.rows, p.x.data() + t * p.ldx, p.ldx, 1, alone.data() + t * p.ldy, p.ldy);
  Problem fused5 = p;
  fused5.T = 5;
  const std::vector<float> batch5 = run(w, fused5);
  set_qmatmul_fused_max_tokens(0);
  const std::vector<float> gemm = run(w, p);
  set_qmatmul_fused_max_tokens(-1);
  int bad = 0;
  for (int64_t t = 0; t < NT; ++t)
    for (int64_t r = 0; r < w.rows; ++r) {
      const float want = gemm[t * p.ldy + r], got = alone[t * p.ldy + r];
      const bool ok5 = t >= 5 || std::memcmp(&batch5[t * p.ldy + r], &want, sizeof(float)) == 0;
      if ((std::memcmp(&got, &want, sizeof(float)) != 0 || !ok5) && bad++ < 5)
        ADD_FAILURE() << what << ": token " << t << " row " << r << " fused " << got << " gemm " << want;
    }
  EXPECT_EQ(bad, 0) << what;
}

// MXFP4's GEMV (AVX-512 and AVX2) defers block scales to the accumulators where that is exact
// (qmatmul_kernels.inc, deferral_exact) and runs the canonical way elsewhere: either way every
// output must be bit-identical to the GEMM path's (which never defers), and close to the
// reference. Cases: real-range scales (deferred), a few rows with extreme scales (those tiles
// fall back), subnormal activations and huge ones (deferral would round differently or
// overflow: must fall back); row lengths with and without a partial last group.
void deferred_scales_exact(const std::string& isa);
TEST(Kernels, DeferredScalesExact) {
  for (Isa isa : {Isa::AVX2, Isa::AVX512}) {
    if (!isa_supported(isa)) continue;
    IsaGuard guard(isa);
    deferred_scales_exact(isa_name(isa));
  }
}

void deferred_scales_exact(const std::string& isa) {
  uint32_t seed = 500;
  // measured: the scale-byte range known (as for weights read at load), so that a call whose x
  // it admits defers in every tile without checking any; else each tile checks its own.
  for (const int64_t cols : {4096, 2340, 64}) {
    for (const bool measured : {false, true}) {
      for (const bool extreme_rows : {false, true}) {
        OwnedWeight o = make_weight(WFormat::MXFP4, 70, cols, seed++, /*moderate=*/true);
        if (extreme_rows) {
          const int64_t sc = o.w.scale_cols;
          o.scale[17 * sc + std::min<int64_t>(3, sc - 1)] = 0;     // 2^-127 in row 17's tile
          o.scale[50 * sc + std::min<int64_t>(40, sc - 1)] = 240;  // 2^113 in row 50's tile
        }
        if (measured) {
          measure_scale_range(o.w);
          const int64_t nb = (cols + 31) / 32;
          uint8_t lo = 255, hi = 0;
          for (int64_t r = 0; r < o.w.rows; ++r)
            for (int64_t b = 0; b < nb; ++b) {
              lo = std::min(lo, o.scale[r * o.w.scale_cols + b]);
              hi = std::max(hi, o.scale[r * o.w.scale_cols + b]);
            }
          EXPECT_EQ(o.w.scale_lo, lo);
          EXPECT_EQ(o.w.scale_hi, hi);
          if (extreme_rows) {
            EXPECT_EQ(o.w.scale_lo, 0);
          }
        }
        const std::vector<float> deq = dequant_all(o.w);
        for (const float xscale : {1.0f, 1e-39f, 1e36f}) {
          Problem p = make_problem(o.w, 0, o.w.rows, 30, seed++);
          for (float& v : p.x)
            if (!std::isnan(v)) v *= xscale;
          const std::string what = isa + " " + std::to_string(cols) + " cols, measured " + std::to_string(measured) +
                                   ", extreme rows " + std::to_string(extreme_rows) + ", x scale " + std::to_string(xscale);
          expect_fused_equals_gemm(o.w, p, what);
          if (xscale == 1.0f) check_against_reference(o.w, deq, p, run(o.w, p), what);
        }
      }
    }
  }
}

// The FP8 bits decoders (AVX2, AVX-512) build e4m3 * 2^-120 and the fused path scales x by
// 2^(b-7), which is exact only for scale bytes b <= 134 and x * 2^(b-7) finite; the AVX-512 F16
// route builds e4m3 * 2^-8 and scales x by 2^(b-119) (qmatmul_kernels.inc, fp8_fast_ok): other
// calls run the wide variant on the GEMM path. Every output must be
// bit-identical to the GEMM path's, and close to the reference: real-range scales (the fast
// decode everywhere), one block at 2^13 or at 2^-124, activations near the float limits (huge
// ones overflow x * 2^(b-7); subnormal ones must keep their low bits).
TEST(Kernels, Fp8RangeExact) {
  struct Case {
    Isa isa;
    Fp8Decode route;
  };
  for (const Case c : {Case{Isa::AVX2, Fp8Decode::Bits}, Case{Isa::AVX2, Fp8Decode::F16},
                       Case{Isa::AVX512, Fp8Decode::Bits}, Case{Isa::AVX512, Fp8Decode::F16}}) {
    if (!isa_supported(c.isa)) continue;
    IsaGuard guard(c.isa);
    Fp8Guard fp8(c.route);
    uint32_t seed = 600;
    for (const int extreme : {0, 140, 3}) {
      OwnedWeight o = make_weight(WFormat::FP8Block, 300, 2339, seed++);
      if (extreme) o.scale[1 * o.w.scale_cols + 7] = static_cast<uint8_t>(extreme);  // rows 128..255
      const std::vector<float> deq = dequant_all(o.w);
      for (const float xscale : {1.0f, 1e-39f, 1e30f, 1e36f}) {
        Problem p = make_problem(o.w, 0, o.w.rows, 30, seed++);
        for (float& v : p.x)
          if (!std::isnan(v)) v *= xscale;
        const std::string what = std::string(isa_name(c.isa)) + " " + fp8_decode_name(c.route) +
                                 ": extreme scale byte " + std::to_string(extreme) + ", x scale " +
                                 std::to_string(xscale);
        expect_fused_equals_gemm(o.w, p, what);
        if (xscale == 1.0f) check_against_reference(o.w, deq, p, run(o.w, p), what);
      }
    }
  }
}

// The FP8 decode routes of each ISA (bits: e4m3 * 2^-120 by integer ops; f16: through
// vcvtph2ps, Auto's choice on Intel for subnormal-rich weights) must give the same bits on every
// path, T and row range, E4M3 subnormal codes included (make_weight draws every finite byte), and
// each must reproduce dequant_row's values exactly (one-hot activations).
void fp8_routes_agree(Isa isa) {
  IsaGuard guard(isa);
  uint32_t seed = 700;
  for (const Shape& s : {Shape{300, 2339}, Shape{130, 260}, Shape{9, 5}}) {
    const OwnedWeight o = make_weight(WFormat::FP8Block, s.rows, s.cols, seed++);
    for (int64_t T : {1, 2, 3, 5, 8, 30}) {
      const int64_t r0 = s.rows > 8 ? 3 : 0, r1 = s.rows > 8 ? s.rows - 1 : s.rows;
      const Problem p = make_problem(o.w, r0, r1, T, seed++);
      for (int path : kPaths) {
        set_qmatmul_fused_max_tokens(path);
        std::vector<float> ys[2];
        for (Fp8Decode route : {Fp8Decode::Bits, Fp8Decode::F16}) {
          Fp8Guard fp8(route);
          ys[route == Fp8Decode::F16 ? 1 : 0] = run(o.w, p);
        }
        int bad = 0;
        for (size_t k = 0; k < ys[0].size(); ++k)
          if (std::memcmp(&ys[0][k], &ys[1][k], sizeof(float)) != 0 && bad++ < 5)
            ADD_FAILURE() << s.rows << "x" << s.cols << " T=" << T << " path=" << path_name(path) << " [" << k
                          << "]: bits " << ys[0][k] << " f16 " << ys[1][k];
        EXPECT_EQ(bad, 0);
      }
    }
  }
  for (Fp8Decode route : {Fp8Decode::Bits, Fp8Decode::F16}) {
    Fp8Guard fp8(route);
    run_isa_exact(isa);
  }
}

TEST(Kernels, AVX512Fp8RoutesAgree) {
  REQUIRE_ISA(Isa::AVX512);
  fp8_routes_agree(Isa::AVX512);
}

TEST(Kernels, AVX2Fp8RoutesAgree) {
  REQUIRE_ISA(Isa::AVX2);
  fp8_routes_agree(Isa::AVX2);
}

// Auto picks F16 only on Intel and only for weights with many E4M3 subnormals (make_weight draws
// every finite byte: one in 16 is subnormal); an override or DSV4_FP8_DECODE wins.
TEST(Kernels, Fp8DecodeAutoChoice) {
  clear_fp8_decode_override();
  if (active_fp8_decode() != Fp8Decode::Auto) GTEST_SKIP() << "DSV4_FP8_DECODE is set";
  OwnedWeight o = make_weight(WFormat::FP8Block, 300, 2339, 800);
  const bool intel = __builtin_cpu_is("intel");
  EXPECT_EQ(fp8_decode_for(o.w, 0, 300), intel ? Fp8Decode::F16 : Fp8Decode::Bits);
  EXPECT_EQ(fp8_decode_for(o.w, 299, 300), intel ? Fp8Decode::F16 : Fp8Decode::Bits);
  for (uint8_t& b : o.data)
    if ((b & 0x78) == 0 && (b & 0x07) != 0) b |= 0x08;
  EXPECT_EQ(fp8_decode_for(o.w, 0, 300), Fp8Decode::Bits);
  o.data[5 * o.w.cols + 3] = 0x01;  // one subnormal in the sample (rows 0, 37, 74, ...: no)
  o.data[0 * o.w.cols + 3] = 0x81;  // row 0 is sampled: one, still below one in 2048
  EXPECT_EQ(fp8_decode_for(o.w, 0, 300), Fp8Decode::Bits);
  o.data[0 * o.w.cols + 4] = 0x02;  // two in 4096 sampled bytes
  EXPECT_EQ(fp8_decode_for(o.w, 0, 300), intel ? Fp8Decode::F16 : Fp8Decode::Bits);
  for (Fp8Decode d : {Fp8Decode::Bits, Fp8Decode::F16}) {
    Fp8Guard fp8(d);
    EXPECT_EQ(fp8_decode_for(o.w, 0, 300), d);
  }
}

// Every available ISA gives the same numbers (to rounding) on the same problem.
TEST(Kernels, IsasAgree) {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::Scalar, Isa::AVX2, Isa::AVX512})
    if (isa_supported(isa)) isas.push_back(isa);
  uint32_t seed = 300;
  for (WFormat f : kAllFormats) {
    const bool fp4 = f == WFormat::MXFP4 || f == WFormat::NVFP4;
    const OwnedWeight o = make_weight(f, 130, fp4 ? 288 : 260, seed++);
    const std::vector<float> deq = dequant_all(o.w);
    for (int64_t T : {1, 2, 3, 8, 37}) {
      const Problem p = make_problem(o.w, 2, 129, T, seed++);
      std::vector<std::vector<float>> ys;
      for (Isa isa : isas) {
        IsaGuard guard(isa);
        ys.push_back(run(o.w, p));
      }
      int bad = 0;
      for (size_t k = 1; k < ys.size(); ++k)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t i = 0; i < p.r1 - p.r0; ++i) {
            const float* wr = deq.data() + (p.r0 + i) * o.w.cols;
            double sa = 0;
            for (int64_t c = 0; c < o.w.cols; ++c) sa += std::fabs(static_cast<double>(wr[c]) * p.x[t * p.ldx + c]);
            const float a = ys[0][t * p.ldy + i], b = ys[k][t * p.ldy + i];
            if (!(std::fabs(a - b) <= 2e-5 * sa + 1e-30) && bad++ < 5) {
              ADD_FAILURE() << wformat_name(f) << " T=" << T << " " << isa_name(isas[0]) << " vs " << isa_name(isas[k])
                            << ": " << a << " vs " << b;
            }
          }
      EXPECT_EQ(bad, 0) << wformat_name(f) << " T=" << T;
    }
  }
}
