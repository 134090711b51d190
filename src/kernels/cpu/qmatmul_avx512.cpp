// AVX-512 qmatmul kernels. Only functions carrying the target attribute use AVX-512, so this
// file is compiled with the project's baseline flags and the binary still runs on CPUs without
// it (qmatmul.cpp dispatches here only when the CPU reports avx512f/bw/vl/dq).
// GCC 12's intrinsic headers build _mm*_undefined_*() from self-initialised locals, which
// trips -Wuninitialized once inlined (GCC PR 105593); silence it for the header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/threads.h"
#include "kernels/cpu/byte_range.h"
#include "kernels/cpu/qmatmul_impl.h"
#include "kernels/cpu/transpose.h"

namespace dsv4::qmm {
namespace {

#define DSV4_T512 "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi,bmi2"
#define TGT __attribute__((target(DSV4_T512)))
#define TGTI __attribute__((target(DSV4_T512), always_inline)) inline

struct V {
  using reg = __m512;
  static constexpr int W = 16;
  TGTI static reg zero() { return _mm512_setzero_ps(); }
  TGTI static reg set1(float v) { return _mm512_set1_ps(v); }
  TGTI static reg load(const float* p) { return _mm512_loadu_ps(p); }
  TGTI static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  TGTI static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  TGTI static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  TGTI static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  TGTI static reg bcast(const float* p) { return _mm512_set1_ps(*p); }
  TGTI static void store_first(float* p, reg v, int n) { _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1u), v); }
  TGTI static void transpose(reg (&r)[16]) { transpose16(r); }  // r[i] lane j -> r[j] lane i
  // Pins v in a register: the compiler can no longer re-read it from memory at each use.
  TGTI static void keep(reg& v) { asm("" : "+v"(v)); }
  // The fused tiles with tokens >= rows (qmatmul_kernels.inc) pin each loaded x vector: left
  // alone, g++ 12 folds the load into every row's FMA (the FP8 3 x 8 tile read each x vector
  // three times: 192 loads per group instead of 64). Pinned, `qmatmul_bench --only gemv
  // --format FP8Block` T = 8 ran +13% (L2, one thread, 6 alternating pairs 1.129-1.138) and
  // T = 16 +15% on an Intel Xeon (docs/perf.md session 20).
  static constexpr bool kPinX = true;
  static constexpr int64_t kPrefetchMax = 1024;  // largest fused-path prefetch distance (kernels.inc)
  // The canonical reduction tree (part of the summation order: every path calls this, or
  // hsum_many below, which adds the same operands in the same tree):
  // lanes l + l+8, then l + l+4, l + l+2, l + l+1.
  TGTI static float hsum(reg v) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // out[k] = hsum(v[k]) for k < N (N <= 16; inputs past N count as zero), the same tree, 16
  // vectors at once: each level adds two vectors' halves, gathered by one shuffle per half
  // (level 1: 256-bit halves of v[2p] and v[2p+1] side by side; level 2: 128-bit quarters; levels
  // 3 and 4: pairs and single lanes inside each 128-bit lane), so the lanes of one register hold
  // 16 partial sums at every level. The same additions of the same operands: the same bits. 31
  // shuffles and 15 adds for 16 sums, against 64 and 64 one by one (the epilogue of a fused tile;
  // FP8 with 1024 columns at T = 8: 6 x 4 tiles of 8 groups, where the sums took ~6% of the
  // samples).
  template <int N>
  TGTI static void hsum_many(const reg* v, float* out) {
    static_assert(N >= 1 && N <= 16, "hsum_many: 1 to 16 vectors");
    reg s[8], u[4], w[2];
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) {  // lanes 0-7: v[2p] l + l+8; lanes 8-15: v[2p+1]'s
      const reg a = 2 * p < N ? v[2 * p] : zero(), b = 2 * p + 1 < N ? v[2 * p + 1] : zero();
      s[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q)  // 128-bit lane c: v[4q + c] l + l+4
      u[q] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * q], s[2 * q + 1], 0x88),
                           _mm512_shuffle_f32x4(s[2 * q], s[2 * q + 1], 0xDD));
#pragma GCC unroll 2
    for (int r = 0; r < 2; ++r)  // lane c: v[8r + c] l + l+2 in lanes 0-1, v[8r + 4 + c]'s in 2-3
      w[r] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * r], u[2 * r + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_ps(u[2 * r], u[2 * r + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    // lane 4c + m: v[c + 4m] l + l+1; then into order.
    const reg z = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const reg sums = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
    if constexpr (N == 16) _mm512_storeu_ps(out, sums);
    else _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << N) - 1u), sums);
  }
};

struct DecBase {
  const uint8_t* data;
  const uint8_t* scales;
  int64_t row_bytes;
  int64_t scale_cols;
  int64_t nb;  // scale blocks per row actually used
  int scale_lo, scale_hi;  // QWeight's scale-byte range (MXFP4)
  float post = 1.0f;
  DecBase(const QWeight& w, int64_t rb, int64_t block)
      : data(w.data), scales(w.scale), row_bytes(rb), scale_cols(w.scale_cols),
        nb(block > 0 ? (w.cols + block - 1) / block : 0), scale_lo(w.scale_lo), scale_hi(w.scale_hi) {}
  const uint8_t* row(int64_t r) const { return data + r * row_bytes; }
};

// Mask of the first n (0..16) lanes.
TGTI __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1u);
}

struct DecF32 : DecBase {
  static constexpr int G = 64, NSUB = 1, NV = 4, GB = 256, kSPG = 0;
  static constexpr bool kScaled = false, kPost = false, kRowScales = false;
  struct St {
    const uint8_t* p;
  };
  explicit DecF32(const QWeight& w) : DecBase(w, w.cols * 4, 0) {}
  static constexpr int pos(int c) { return c; }
  void prep(int64_t, int64_t, int64_t, float*) const {}
  TGTI static void load(const uint8_t* gp, int, St& st) { st.p = gp; }
  TGTI static __m512 vec(const St& st, int k) { return _mm512_loadu_ps(st.p + 64 * k); }
  TGTI static __m512 scale(const float*, int64_t) { return _mm512_setzero_ps(); }
};

// 32 bf16 per 64 bytes: even columns from the low halves of each dword, odd from the high.
struct DecBF16 : DecBase {
  static constexpr int G = 32, NSUB = 1, NV = 2, GB = 64, kSPG = 0;
  static constexpr bool kScaled = false, kPost = false, kRowScales = false;
  struct St {
    __m512i v;
  };
  explicit DecBF16(const QWeight& w) : DecBase(w, w.cols * 2, 0) {}
  // Tiles of fewer than 8 rows prefetch up to 2 KiB ahead (V::kPrefetchMax: 1 KiB): the head's
  // shape from DRAM, two threads, alternating pairs on AMD Zen 4 (docs/perf.md session 26): T = 6
  // +19%, T = 8 +12%, T = 16 +5% (3 x 8 tiles). The same for MXFP4 and FP8 ran level or worse
  // (T = 8 0.94, 0.98; session 25: T = 2-4 level).
  static constexpr int64_t kPrefetchMax = 2048;
  static constexpr int pos(int c) { return (c & 1) * 16 + (c >> 1); }
  void prep(int64_t, int64_t, int64_t, float*) const {}
  TGTI static void load(const uint8_t* gp, int, St& st) { st.v = _mm512_loadu_si512(gp); }
  TGTI static __m512 vec(const St& st, int k) {
    return k == 0 ? _mm512_castsi512_ps(_mm512_slli_epi32(st.v, 16))
                  : _mm512_castsi512_ps(_mm512_and_si512(st.v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  // The same vector from memory, for the tiles of 24 accumulators (kVecMem in
  // qmatmul_kernels.inc): there the 3 x 8 tile's accumulators, 3 weight vectors, x and the mask
  // leave no register for each row's raw group, and g++ kept two accumulators on the stack. Each
  // vector re-reads its 64 bytes from L1 instead (the load folds into the shift or the and; the
  // empty asm keeps g++ from merging the two loads back into one register).
  TGTI static __m512 vec_mem(const uint8_t* gp, int, int k) {
    if (k != 0) asm("" : "+r"(gp));
    St st;
    load(gp, 0, st);
    return vec(st, k);
  }
  TGTI static __m512 scale(const float*, int64_t) { return _mm512_setzero_ps(); }
};

struct DecF16 : DecBase {
  static constexpr int G = 32, NSUB = 1, NV = 2, GB = 64, kSPG = 0;
  static constexpr bool kScaled = false, kPost = false, kRowScales = false;
  struct St {
    const uint8_t* p;
  };
  explicit DecF16(const QWeight& w) : DecBase(w, w.cols * 2, 0) {}
  static constexpr int pos(int c) { return c; }
  void prep(int64_t, int64_t, int64_t, float*) const {}
  TGTI static void load(const uint8_t* gp, int, St& st) { st.p = gp; }
  TGTI static __m512 vec(const St& st, int k) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(st.p + 32 * k)));
  }
  TGTI static __m512 scale(const float*, int64_t) { return _mm512_setzero_ps(); }
};

// Of packed tokens: lsb, the smallest exponent of a nonzero x's last significant bit (normal x:
// field - 150, subnormal: -149); emax, every |x| below 2^emax; sum_exp, above log2 of the largest
// token sum of |x| (float sum, +1 for its rounding). emax and sum_exp are 1000 when not finite.
TGT XStats x_range_stats(const float* px, int64_t T, int64_t ldx, int64_t n) {
  XStats xs;
  __m512i fmin = _mm512_set1_epi32(1000), fmax = _mm512_setzero_si512();
  for (int64_t t = 0; t < T; ++t) {
    const float* p = px + t * ldx;
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < n; c += 16) {
      const __m512 v = _mm512_abs_ps(_mm512_loadu_ps(p + c));
      sum = _mm512_add_ps(sum, v);
      const __mmask16 nz = _mm512_cmpneq_ps_mask(v, _mm512_setzero_ps());
      const __m512i field = _mm512_srli_epi32(_mm512_castps_si512(v), 23);
      fmin = _mm512_mask_min_epi32(fmin, nz, fmin, _mm512_max_epi32(field, _mm512_set1_epi32(1)));
      fmax = _mm512_max_epi32(fmax, field);
    }
    const float total = _mm512_reduce_add_ps(sum);
    const int e = !(total <= std::numeric_limits<float>::max()) ? 1000 : total == 0.0f ? -1000 : std::ilogb(total) + 2;
    xs.sum_exp = std::max(xs.sum_exp, e);
  }
  const int f = _mm512_reduce_min_epi32(fmin), fm = _mm512_reduce_max_epi32(fmax);
  xs.lsb = f >= 1000 ? 1000 : f - 150;
  xs.emax = fm >= 255 ? 1000 : std::max(fm, 1) - 126;
  if (n >= (int64_t{1} << 22)) xs.sum_exp = 1000;  // deferral_exact's rounding-growth bound needs K < 2^22
  return xs;
}

// What both FP8 routes below share: a decoded weight is the float e4m3 * 2^-Bias, 128-column
// groups of 4 sub-steps x 2 vectors in column order (pos(c) = c), and per group the block scale
// 2^(b - 127 + Bias) (exponent field b + Bias), which fp8_fast_ok (qmatmul_kernels.inc) checks.
template <int Bias>
struct DecFP8Base : DecBase {
  static constexpr int G = 128, NSUB = 4, NV = 2, GB = 128, kSPG = 1;
  static constexpr bool kScaled = true, kPost = false, kRowScales = false;
  static constexpr int kBias = Bias;
  struct St {
    const uint8_t* p;
  };
  explicit DecFP8Base(const QWeight& w) : DecBase(w, w.cols, 128) {}
  static constexpr int pos(int c) { return c; }
  TGT void prep(int64_t r, int64_t g0, int64_t g1, float* sb) const {
    const uint8_t* s = scales + (r / 128) * scale_cols + g0;
    const int64_t n = g1 - g0;
    for (int64_t i = 0; i < n; i += 16) {
      const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(first_lanes(n - i), s + i));
      const __m512i f = _mm512_slli_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(kBias)), 23);
      _mm512_storeu_ps(sb + i, _mm512_castsi512_ps(f));
    }
  }
  TGTI static void load(const uint8_t* gp, int sub, St& st) { st.p = gp + 32 * sub; }
  TGTI static __m512 scale(const float* sb, int64_t g) { return _mm512_set1_ps(sb[g]); }
};

// E4M3 by moving the bits, no conversion instruction: the sign-extended byte shifted left by 20
// puts exponent and mantissa in float bits 20..26 and copies of the sign in 27..31; clearing
// 27..30 leaves a float that is exactly e4m3 * 2^-120, subnormals included (exponent 0 is a
// float subnormal too). Three integer operations per 16 weights: vcvtph2ps, which the F16 route
// (e4m3 * 2^-8 as F16, then widened) needs, costs more on AMD Zen 4 (docs/perf.md session 12:
// the FP8 GEMV +10-16%). The 2^120 goes into the block scale: 2^(b-127) * 2^120, a float with
// exponent field b + 120, finite only for b <= 134 (scales up to 2^7), and the fused path's x
// times it must stay exact; fp8_fast_ok (qmatmul_kernels.inc) checks both per call. Outside that
// range the call runs the wide variant (2^112 folded back into every weight vector, scale field
// b + 8) on the GEMM path, which scales no x: the same exact products, so the same bits.
template <bool Wide>
struct DecFP8T : DecFP8Base<Wide ? 8 : 120> {
  using DecFP8Base<Wide ? 8 : 120>::DecFP8Base;
  using St = typename DecFP8Base<Wide ? 8 : 120>::St;
  TGTI static __m512 vec(const St& st, int k) {
    const __m512i d = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(st.p + 16 * k)));
    const __m512 v = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(d, 20), _mm512_set1_epi32(static_cast<int>(0x87FFFFFFu))));
    if constexpr (Wide) return _mm512_mul_ps(v, _mm512_set1_ps(0x1p112f));
    return v;
  }
};
struct DecFP8 : DecFP8T<false> {
  using Wide = DecFP8T<true>;
  using DecFP8T::DecFP8T;
};

// E4M3 through F16 (Intel cores, for weights with many E4M3 subnormals: fp8_decode_for in
// qmatmul.h): the sign-extended byte shifted left by 7 puts exponent and mantissa in F16 bits
// 7..13 and the sign in 15 (bit 14, a sign copy, is cleared): exactly e4m3 * 2^-8 as F16,
// subnormals included, which vcvtph2ps widens to a normal float. The bits route above leaves
// e4m3 subnormals as float subnormals, and an Intel core takes a microcode assist for every FMA
// with a subnormal operand (~30x the time on the development Xeon); vcvtph2ps takes none. Scale
// field b + 8: a float for every E8M0 byte up to 246; the fused path's x * 2^(b-119) is checked
// as for the bits route (fp8_fast_ok), and outside its range the same decode runs on the GEMM
// path (DecFP8H::Wide: this struct, without a Wide of its own). Same decoded order and the same
// exact products as the bits route, so the same bits.
struct DecFP8F16 : DecFP8Base<8> {
  using DecFP8Base::DecFP8Base;
  TGTI static __m512 vec(const St& st, int k) {
    const __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(st.p + 16 * k)));
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16(static_cast<short>(0xBFFF))));
  }
};
struct DecFP8H : DecFP8F16 {
  using Wide = DecFP8F16;
  using DecFP8F16::DecFP8F16;
};

// FP4: 64 bytes = 128 columns. Dword lane i holds bytes 4i..4i+3; shifting it right by 4k puts
// the nibble of column 8i+k in bits 0..3, which vpermps uses as the index into a 16-entry table.
// So decoded vector k, lane i is column 8i+k, and all 8 vectors of a group share one scale
// vector (lane i covers columns 8i..8i+7, inside one 16- or 32-column scale block).
TGTI __m512 fp4_vec(__m512i v, int k, __m512 table) {
  return _mm512_permutexvar_ps(k == 0 ? v : _mm512_srli_epi32(v, static_cast<unsigned>(4 * k)), table);
}

// MXFP4: table holds e2m1/2 and the scale 2^(b-126) (exponent field b+1), so the E8M0 byte 0
// (2^-127) stays a normal float; the product is the same exact value. Scales of padding blocks
// (past cols) are whatever the zero byte gives: their weights and x are zero.
struct DecMX : DecBase {
  static constexpr int G = 128, NSUB = 1, NV = 8, GB = 64, kSPG = 4;
  static constexpr bool kScaled = true, kPost = false, kRowScales = true;
  struct St {
    __m512i v;
  };
  explicit DecMX(const QWeight& w) : DecBase(w, w.cols / 2, 32) {}
  static constexpr int pos(int c) { return (c & 7) * 16 + (c >> 3); }
  TGT void prep(int64_t r, int64_t g0, int64_t g1, float* sb) const {
    const uint8_t* s = scales + r * scale_cols;
    const int64_t b0 = 4 * g0, n = std::min(4 * g1, nb) - b0, total = 4 * (g1 - g0);
    for (int64_t i = 0; i < total; i += 16) {
      const __mmask16 m = first_lanes(n - i);
      const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, s + b0 + i));
      const __m512i f = _mm512_slli_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(1)), 23);
      _mm512_storeu_ps(sb + i, _mm512_castsi512_ps(f));
    }
  }
  // Deferred scales (qmatmul_kernels.inc, kDeferScales): sb gets, per group and block, the
  // ratio 2^(u_prev - u) (1 for the first group) and past the last group 2^u_last, u = byte - 126;
  // padding blocks (past cols) take byte 126 (2^0). br collects the bytes' range.
  struct ByteRange {
    __m512i lo, hi;
  };
  TGT static ByteRange range_start() { return {_mm512_set1_epi8(static_cast<char>(0xFF)), _mm512_setzero_si512()}; }
  TGT static void range_bytes(const ByteRange& br, int& lo, int& hi) {
    __m256i a = _mm256_min_epu8(_mm512_castsi512_si256(br.lo), _mm512_extracti64x4_epi64(br.lo, 1));
    __m256i b = _mm256_max_epu8(_mm512_castsi512_si256(br.hi), _mm512_extracti64x4_epi64(br.hi, 1));
    __m128i c = _mm_min_epu8(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    __m128i d = _mm_max_epu8(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    byte_min_max(c, d, lo, hi);
  }
  // The ratio fields 127 + prev - cur are computed on bytes, 64 blocks at a time: they wrap when
  // |prev - cur| > 126, but then the tile's byte range fails deferral_exact and the tile is
  // prepared again the canonical way. Each field is stored as the 16-bit word field << 7, the
  // upper half of the float 2^(field - 127), so that ratio() builds a group's multiplier vector
  // with one in-lane byte shuffle of 8 bytes broadcast from memory. As floats, the preparation
  // spent a widening shuffle per 16 blocks plus three extractions (MXFP4 on AMD EPYC Zen 5:
  // 4096x2048 at T = 1 from DRAM, fast minutes, +5-17%; one core from L2, T = 1-2, 2048 columns
  // +1-3.5%, others level; docs/perf.md "Session 49").
  // Inlined into fused_rowtile (which carries the target for that): the byte range stays in
  // registers across the tile's rows and the calls go (docs/perf.md "Session 22").
  template <bool kRange>
  TGTI void prep_deferred(int64_t r, int64_t ng, float* sbf, ByteRange& br) const {
    uint8_t* sb = reinterpret_cast<uint8_t*>(sbf);  // 2 bytes a block
    const uint8_t* s = scales + r * scale_cols;
    const int64_t total = 4 * ng;
    if (total == 0) {  // no columns: the accumulators stay zero, any multiplier will do
      _mm_storel_epi64(reinterpret_cast<__m128i*>(sb), _mm_set1_epi16(127 << 7));
      return;
    }
    auto first = [](int64_t n) {
      return n >= 64 ? ~__mmask64{0} : n <= 0 ? __mmask64{0} : (__mmask64{1} << n) - 1u;
    };
    const __m512i pad = _mm512_set1_epi8(126);
    for (int64_t i = 0; i < total; i += 64) {
      const __m512i cur = _mm512_mask_loadu_epi8(pad, first(nb - i), s + i);
      // The same block of the previous group (4 bytes back); the first group's is itself.
      const __m512i prev = i == 0 ? _mm512_mask_mov_epi8(_mm512_alignr_epi32(cur, cur, 15), 0xF, cur)
                                  : _mm512_mask_loadu_epi8(pad, first(nb - (i - 4)), s + i - 4);
      if constexpr (kRange) {
        const __mmask64 live = first(total - i);
        br.lo = _mm512_mask_min_epu8(br.lo, live, br.lo, cur);
        br.hi = _mm512_mask_max_epu8(br.hi, live, br.hi, cur);
      }
      const __m512i field = _mm512_add_epi8(_mm512_sub_epi8(prev, cur), _mm512_set1_epi8(127));
      // Both halves stored whole: past `total` they land in the row's slack (Geom::sstride).
      _mm512_storeu_si512(sb + 2 * i, _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(field)), 7));
      if (i + 32 < total)
        _mm512_storeu_si512(sb + 2 * i + 64, _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(field, 1)), 7));
    }
    // 2^u_last per block, from the last group's bytes (padding blocks: 126): fields byte + 1.
    const int64_t last = total - 4;
    const __m128i lb = _mm_mask_loadu_epi8(_mm_set1_epi8(126), static_cast<__mmask16>(first_lanes(nb - last) & 0xF), s + last);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(sb + 2 * total),
                     _mm_slli_epi16(_mm_add_epi16(_mm_cvtepu8_epi16(lb), _mm_set1_epi16(1)), 7));
  }
  // The multiplier of group g (or past the last group 2^u_last) from prep_deferred's words:
  // lane l takes the word of block l / 4 into its upper half.
  TGTI static __m512 ratio(const float* sbf, int64_t g) {
    const __m512i w = _mm512_set1_epi64(*reinterpret_cast<const long long*>(reinterpret_cast<const uint8_t*>(sbf) + 8 * g));
    const __m512i idx = _mm512_setr_epi32(0x01008080, 0x01008080, 0x01008080, 0x01008080, 0x03028080, 0x03028080,
                                          0x03028080, 0x03028080, 0x05048080, 0x05048080, 0x05048080, 0x05048080,
                                          0x07068080, 0x07068080, 0x07068080, 0x07068080);
    return _mm512_castsi512_ps(_mm512_shuffle_epi8(w, idx));
  }
  TGTI static void load(const uint8_t* gp, int, St& st) { st.v = _mm512_loadu_si512(gp); }
  TGTI static void from_bits(__m512 r, St& st) { st.v = _mm512_castps_si512(r); }
  TGTI static __m512 vec(const St& st, int k) {
    const __m512 t = _mm512_setr_ps(0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.5f, 2.0f, 3.0f, -0.0f, -0.25f, -0.5f, -0.75f,
                                    -1.0f, -1.5f, -2.0f, -3.0f);
    return fp4_vec(st.v, k, t);
  }
  TGTI static __m512 scale(const float* sb, int64_t g) {
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_loadu_ps(sb + 4 * g)));
  }
};

// NVFP4: exact e2m1 table; the E4M3 block scale by the F16 trick (exactly s * 2^-8), and the
// 2^8 moved into the per-tensor multiplier: post = scale2 * 2^8. (e2m1 * s * 2^-8) is exact, so
// the decoded value (e2m1 * s * 2^-8) * (scale2 * 2^8) is dequant_row's, rounded once.
struct DecNV : DecBase {
  static constexpr int G = 128, NSUB = 1, NV = 8, GB = 64, kSPG = 8;
  static constexpr bool kScaled = true, kPost = true, kRowScales = true;
  struct St {
    __m512i v;
  };
  explicit DecNV(const QWeight& w) : DecBase(w, w.cols / 2, 16) { post = w.scale2 * 256.0f; }
  static constexpr int pos(int c) { return (c & 7) * 16 + (c >> 3); }
  // 32 scales per step; masked-off bytes load as 0 and decode to +0.
  TGT void prep(int64_t r, int64_t g0, int64_t g1, float* sb) const {
    const uint8_t* s = scales + r * scale_cols;
    const int64_t b0 = 8 * g0, n = std::min(8 * g1, nb) - b0, total = 8 * (g1 - g0);
    for (int64_t i = 0; i < total; i += 32) {
      const int64_t left = n - i;
      const __mmask32 m = left >= 32 ? ~__mmask32{0} : left <= 0 ? __mmask32{0} : (__mmask32{1} << left) - 1u;
      __m512i h = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, s + b0 + i));
      h = _mm512_and_si512(_mm512_slli_epi16(h, 7), _mm512_set1_epi16(static_cast<short>(0xBFFF)));
      _mm512_storeu_ps(sb + i, _mm512_cvtph_ps(_mm512_castsi512_si256(h)));
      _mm512_storeu_ps(sb + i + 16, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)));
    }
  }
  TGTI static void load(const uint8_t* gp, int, St& st) { st.v = _mm512_loadu_si512(gp); }
  TGTI static void from_bits(__m512 r, St& st) { st.v = _mm512_castps_si512(r); }
  TGTI static __m512 vec(const St& st, int k) {
    const __m512 t = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f,
                                    -3.0f, -4.0f, -6.0f);
    return fp4_vec(st.v, k, t);
  }
  TGTI static __m512 scale(const float* sb, int64_t g) {
    const __m512i idx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(_mm256_loadu_ps(sb + 8 * g)));
  }
};

// Fused path shapes: rows R and token tile TTM for T = 1, 2, 3-4, more. T=1 takes 8 rows per tile
// (8 weight streams in flight, each x load shared by 8 rows). From T = 3 on, 4 rows x 4 tokens
// (16 accumulators): each x load feeds 4 FMAs and each decoded weight vector 4, where 2 rows x 8
// tokens fed an x load only 2 (AMD EPYC Zen 4, `qmatmul_bench --only gemv --tokens 4|8 --shape
// 4096x4096`, alternating: T = 8 BF16 +12-17%, MXFP4 +11-14% (which ran 2 x 4 before), FP8
// level; T = 4 BF16 +20-30%, MXFP4 +11%; 3 x 8 and 6 x 4 were no better, 8 x 2 at T = 2 level;
// with the prefetch into L2 8 x 2 pays at T = 2, see below).
template <int R_, int TTM_, bool Spread_ = false>
struct Shape {
  static constexpr int R = R_, TTM = TTM_;
  static constexpr bool kSpread = Spread_;
};
// With the prefetch into L2 (session 10, alternating pairs): at T = 2, 8 rows for every format
// but FP4, 4 for FP4 (8 x 2 over 4 x 2: BF16 +8-27%, FP8 +6-7%, MXFP4 -4% to +3%); from
// T = 3, 6 rows x 4 tokens for BF16 (the head; over 4 x 4: T = 4 +6-9%, T = 6-8 +5-20%; FP8 -2%;
// from T = 5 it now takes 3 x 8, below).
template <class D>
constexpr bool kFp4 = std::is_same_v<D, DecMX> || std::is_same_v<D, DecNV>;
template <class D>
constexpr bool kFp8 = std::is_same_v<D, DecFP8> || std::is_same_v<D, DecFP8H>;
// From T = 5, every format: 3 rows x 8 tokens (24 accumulators), each weight vector decoded once
// for 8 tokens where 4 x 4 decoded it twice at T = 8. FP8 first (session 16, Intel Xeon,
// `qmatmul_bench --only gemv --shape 4096x4096`, alternating pairs: T = 8 median +27%, T = 16
// +14-26%, T = 5 +38%); the others once x was pinned in a register (V::kPinX; before, g++ loaded
// each x vector once per row and 3 x 8 was mixed for MXFP4 and BF16). Session 20, same Xeon kind,
// against 4 x 4 (6 x 4 for BF16), alternating pairs, one thread with the weights in L2 unless
// said: MXFP4 T = 5 +20%, T = 8 +11%, T = 16 +12%, from DRAM on two threads T = 8 +3.5%
// (noisy); NVFP4 T = 8 +17%; BF16 T = 6 +7%, T = 8 level in L2 and +8% (all 8 pairs 1.04-1.27)
// for the head's shape from DRAM; F16 +15%, F32 +4%. On AMD Zen 4 (session 9, x not pinned)
// 3 x 8 was no better than 4 x 4. T = 3-4 keep 4 x 4 (more rows per x load).
// On AMD Zen 5 (family 26; FusedShapes::zen5(), at run time) three shapes differ. Session
// 45's EPYC (family 26 model 2), two threads, from DRAM, alternating pairs (docs/perf.md
// "Session 45"); not measured on other CPUs, which keep the shapes above.
// - BF16 at T = 1: 2 rows per tile, far apart (fused_range's Spread), not 8 adjacent ones: each
//   thread reads 2 long streams. The head's shape +15% when the host's memory ran fast (probe
//   ~84 GB/s: 67-68 against 57-60 GB/s) and +27% when slow (~52: 46-47 against 37-38). A
//   load-only loop read 2-3 far streams per thread at 74-75 GB/s, 8 streams 64 bytes each in
//   turn at 60, 8 adjacent rows at 36. 2 rows beat 3 and 4; 1 row (one FMA chain) was level with
//   8 in fast minutes. Spread 8-row tiles gained 5% at most, and nothing at T >= 2.
// - FP8 at T = 1: 4 rows per tile, spread inside each 128-row scale block (32 rows apart, so
//   the tile shares the block's scaled x). Session 46, tensors now placed aligned at load, all
//   FP8 shapes of the model, rounds of qmatmul_bench: 4096x4096 +27% when memory ran fast
//   (58-62 against 45-48 GB/s) and +24% when slow (45-47 against 37-38); 3 spread rows +18% and
//   8 +5% (slow); 2 rows +2% spread, -6% adjacent, 1 row -27% (fast). Session 45 had measured
//   4 spread rows at -16% in fast minutes, on the same CPU; not reproduced. MXFP4 in spread
//   tiles of 2, 4 or 8 rows: level or worse in both modes (sessions 45 and 46). FP8 spread
//   across the blocks, with the block scale on the weights (exact, as the GEMM path): +11-27%
//   slow, -17 to +17% fast and decode -1 to -10% there; reverted (perf.md "Session 45").
// - T >= 5: BF16 and FP8 in 6 x 4 tiles (the head at T = 5 / 6 / 8 / 16: +6 / +13 / +11 / +8%;
//   FP8 4096x4096 at T = 8 +8%), MXFP4 and NVFP4 in 4 x 4 (MXFP4 at T = 8 +7%, 6 x 4 -5%). 3 x 8
//   was chosen on an Intel Xeon (session 20); here 2 x 8 and 3 x 8 with a 4 KiB prefetch were
//   level or worse for BF16, 4 x 4 -8% and 8 x 3 -20% against 6 x 4.
// - MXFP4 at T = 2 (the routed experts of a batched step): 6 x 2, not 4 x 2 (2048x4096 +15%,
//   4096x2048 +7%; 8 x 2 +6%). NVFP4 in 6 x 2 -7%; MXFP4 at T = 3-4 in 6 x 4 -6 to -13%.
template <class D>
struct FusedShapes {
  using S1 = Shape<8, 1>;
  using S2 = Shape<kFp4<D> ? 4 : 8, 2>;
  using S4 = Shape<std::is_same_v<D, DecBF16> ? 6 : 4, 4>;
  using SN = Shape<3, 8>;
  static bool zen5() { return zen5_shapes(); }
  using S1Zen5 = std::conditional_t<std::is_same_v<D, DecBF16>, Shape<2, 1, true>,
                                    std::conditional_t<kFp8<D>, Shape<4, 1, true>, S1>>;
  using S2Zen5 = std::conditional_t<std::is_same_v<D, DecMX>, Shape<6, 2>, S2>;
  using SNZen5 = Shape<kFp4<D> ? 4 : 6, 4>;
};

// GEMM path: register tile of 2 x 16 rows x 12 tokens (24 accumulators, 2 weight vectors and a
// broadcast), panels of 64 rows (1 MiB at 4096 columns: L2-resident).
struct GemmShape {
  static constexpr int MRV = 2, NR = 12, MB = 64;
};

#include "kernels/cpu/qmatmul_kernels.inc"

}  // namespace

void run_avx512(const QWeight& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y,
                int64_t ldy, int fused_max_t, FusedJob* job) {
  if (w.fmt == WFormat::FP8Block && fp8_via_f16(w, r0, r1)) return run_any<DecF32, DecBF16, DecF16, DecFP8H, DecMX, DecNV>(w, r0, r1, x, ldx, T, y, ldy, fused_max_t, job);
  run_any<DecF32, DecBF16, DecF16, DecFP8, DecMX, DecNV>(w, r0, r1, x, ldx, T, y, ldy, fused_max_t, job);
}

}  // namespace dsv4::qmm
