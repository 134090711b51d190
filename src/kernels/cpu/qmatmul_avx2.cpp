// AVX2 (+FMA, F16C) qmatmul kernels: the 256-bit port of qmatmul_avx512.cpp. Only functions
// carrying the target attribute use these instructions; qmatmul.cpp dispatches here only when
// the CPU reports avx2, fma and f16c.
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

#include "core/formats.h"
#include "core/threads.h"
#include "kernels/cpu/byte_range.h"
#include "kernels/cpu/qmatmul_impl.h"
#include "kernels/cpu/transpose.h"

namespace dsv4::qmm {
namespace {

#define DSV4_T256 "avx2,fma,f16c,bmi,bmi2"
#define TGT __attribute__((target(DSV4_T256)))
#define TGTI __attribute__((target(DSV4_T256), always_inline)) inline

struct V {
  using reg = __m256;
  static constexpr int W = 8;
  TGTI static reg zero() { return _mm256_setzero_ps(); }
  TGTI static reg set1(float v) { return _mm256_set1_ps(v); }
  TGTI static reg load(const float* p) { return _mm256_loadu_ps(p); }
  TGTI static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  TGTI static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  TGTI static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  TGTI static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  TGTI static reg bcast(const float* p) { return _mm256_broadcast_ss(p); }
  TGTI static void store_first(float* p, reg v, int n) {
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(p, m, v);
  }
  TGTI static void transpose(reg (&r)[8]) { transpose8(r); }  // r[i] lane j -> r[j] lane i
  // Pins v in a register: the compiler can no longer re-read it from memory at each use.
  TGTI static void keep(reg& v) { asm("" : "+x"(v)); }
  // Not with 16 registers: pinning x (see the AVX-512 V) ran the AVX2 FP8 tiles at T = 2 and 4
  // ~5% slower (docs/perf.md session 20).
  static constexpr bool kPinX = false;
  // Largest fused-path prefetch distance (kernels.inc prefetch_distance: 8 KiB / R, at most a
  // row's length). The AVX2 tiles hold 2-4 rows at T = 1 (AVX-512: 8), so fewer bytes were in
  // flight; on AMD Zen 4 in AVX2 mode, two threads from DRAM, alternating: FP8 4096x4096 +14.6%,
  // MXFP4 2048x4096 +7%; past a row's length (MXFP4 4096x2048) 0.83 (docs/perf.md session 25).
  static constexpr int64_t kPrefetchMax = 2048;
  // The canonical reduction tree: lanes l + l+4, then l + l+2, l + l+1.
  TGTI static float hsum(reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // out[k] = hsum(v[k]) for k < N, one by one (qmatmul_avx512.cpp sums 16 at a time).
  template <int N>
  TGTI static void hsum_many(const reg* v, float* out) {
#pragma GCC unroll 16
    for (int k = 0; k < N; ++k) out[k] = hsum(v[k]);
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

TGTI __m256i load128_cvt_u8_epi32(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

struct DecF32 : DecBase {
  static constexpr int G = 32, NSUB = 1, NV = 4, GB = 128, kSPG = 0;
  static constexpr bool kScaled = false, kPost = false, kRowScales = false;
  struct St {
    const uint8_t* p;
  };
  explicit DecF32(const QWeight& w) : DecBase(w, w.cols * 4, 0) {}
  static constexpr int pos(int c) { return c; }
  void prep(int64_t, int64_t, int64_t, float*) const {}
  TGTI static void load(const uint8_t* gp, int, St& st) { st.p = gp; }
  TGTI static __m256 vec(const St& st, int k) { return _mm256_loadu_ps(reinterpret_cast<const float*>(st.p + 32 * k)); }
  TGTI static __m256 scale(const float*, int64_t) { return _mm256_setzero_ps(); }
};

struct DecBF16 : DecBase {
  static constexpr int G = 16, NSUB = 1, NV = 2, GB = 32, kSPG = 0;
  static constexpr bool kScaled = false, kPost = false, kRowScales = false;
  struct St {
    __m256i v;
  };
  explicit DecBF16(const QWeight& w) : DecBase(w, w.cols * 2, 0) {}
  static constexpr int pos(int c) { return (c & 1) * 8 + (c >> 1); }
  void prep(int64_t, int64_t, int64_t, float*) const {}
  TGTI static void load(const uint8_t* gp, int, St& st) { st.v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gp)); }
  TGTI static __m256 vec(const St& st, int k) {
    return k == 0 ? _mm256_castsi256_ps(_mm256_slli_epi32(st.v, 16))
                  : _mm256_castsi256_ps(_mm256_and_si256(st.v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  TGTI static __m256 scale(const float*, int64_t) { return _mm256_setzero_ps(); }
};

struct DecF16 : DecBase {
  static constexpr int G = 16, NSUB = 1, NV = 2, GB = 32, kSPG = 0;
  static constexpr bool kScaled = false, kPost = false, kRowScales = false;
  struct St {
    const uint8_t* p;
  };
  explicit DecF16(const QWeight& w) : DecBase(w, w.cols * 2, 0) {}
  static constexpr int pos(int c) { return c; }
  void prep(int64_t, int64_t, int64_t, float*) const {}
  TGTI static void load(const uint8_t* gp, int, St& st) { st.p = gp; }
  TGTI static __m256 vec(const St& st, int k) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(st.p + 16 * k)));
  }
  TGTI static __m256 scale(const float*, int64_t) { return _mm256_setzero_ps(); }
};

// Of packed tokens (n a multiple of 8): lsb, the smallest exponent of a nonzero x's last
// significant bit; emax, every |x| below 2^emax (1000: not finite); sum_exp, every token's sum
// of |x| below 2^sum_exp. See qmatmul_impl.h XStats.
TGT XStats x_range_stats(const float* px, int64_t T, int64_t ldx, int64_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), one = _mm256_set1_epi32(1);
  __m256i fmin = _mm256_set1_epi32(1000), fmax = _mm256_setzero_si256();
  int sum_exp = -1000;
  for (int64_t t = 0; t < T; ++t) {
    __m256 sum = _mm256_setzero_ps();
    for (int64_t c = 0; c < n; c += 8) {
      const __m256i v = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(px + t * ldx + c)), abs_mask);
      sum = _mm256_add_ps(sum, _mm256_castsi256_ps(v));
      const __m256i field = _mm256_srli_epi32(v, 23);
      const __m256i zero = _mm256_cmpeq_epi32(v, _mm256_setzero_si256());
      fmin = _mm256_min_epi32(fmin, _mm256_blendv_epi8(_mm256_max_epi32(field, one), _mm256_set1_epi32(1000), zero));
      fmax = _mm256_max_epi32(fmax, field);
    }
    alignas(32) float part[8];
    _mm256_store_ps(part, sum);
    float total = 0.0f;
    for (float p : part) total += p;
    const int e = !(total <= std::numeric_limits<float>::max()) ? 1000 : total == 0.0f ? -1000 : std::ilogb(total) + 2;
    sum_exp = std::max(sum_exp, e);
  }
  alignas(32) int32_t lo[8], hi[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lo), fmin);
  _mm256_store_si256(reinterpret_cast<__m256i*>(hi), fmax);
  const int f = *std::min_element(lo, lo + 8), fm = *std::max_element(hi, hi + 8);
  XStats xs;
  xs.lsb = f >= 1000 ? 1000 : f - 150;
  xs.emax = fm >= 255 ? 1000 : std::max(fm, 1) - 126;
  xs.sum_exp = n >= (int64_t{1} << 22) ? 1000 : sum_exp;  // deferral_exact's rounding-growth bound needs K < 2^22
  return xs;
}

// FP8 as on AVX-512 (qmatmul_avx512.cpp DecFP8T): a weight decodes to the float e4m3 * 2^-120 (its
// 7 magnitude bits at 20-26, the sign at 31); block scales 2^(b-7) (exponent field b + 120), in
// range per call by fp8_fast_ok, else the Wide variant (weights times 2^112, scale field b + 8) on
// the GEMM path. The bytes get there without a widening shuffle: one 32-byte load serves two
// sub-steps; a 16-bit arithmetic shift by 4 puts each word's high byte in bits 4-11 with its sign
// above (the even bytes are moved into the high byte first), and the high word is masked in place,
// the low one shifted up by 16: 9 integer operations per 32 weights instead of 12 with
// vpmovsxbd, none of them a shuffle. On AMD Zen 3 (AVX2 only) GEMV T = 1 from DRAM +11% over the
// vpmovsxbd decode at the same tile, T >= 2 level (docs/perf.md session 14). Two accumulator
// chains per lane (kSplit, as the FP4 decoders): T = 1 +7%, T = 2 +17% (session 25).
template <bool Wide>
struct DecFP8T : DecBase {
  static constexpr int G = 128, NSUB = 8, NV = 2, GB = 128, kSPG = 1, kSplit = 2;
  static constexpr bool kScaled = true, kPost = false, kRowScales = false;
  static constexpr uint32_t kBias = Wide ? 8 : 120;  // the scale's exponent field is b + kBias
  struct St {
    __m256i t;
  };
  explicit DecFP8T(const QWeight& w) : DecBase(w, w.cols, 128) {}
  // Sub-step 2q + p reads bytes 32q.. (dword i: columns 32q + 4i + b); p = 0 takes the odd bytes
  // (b = 3 in vector 0, b = 1 in vector 1), p = 1 the even ones (b = 2, then b = 0).
  static constexpr int pos(int c) {
    const int q = c >> 5, i = (c >> 2) & 7, b = c & 3;
    return (2 * q + ((b & 1) ? 0 : 1)) * 16 + ((b >> 1) ? 0 : 1) * 8 + i;
  }
  void prep(int64_t r, int64_t g0, int64_t g1, float* sb) const {
    const uint8_t* s = scales + (r / 128) * scale_cols;
    for (int64_t g = g0; g < g1; ++g) sb[g - g0] = std::bit_cast<float>((static_cast<uint32_t>(s[g]) + kBias) << 23);
  }
  // Each word's high byte, arithmetic-shifted right by 4 within the word: the byte sits in bits
  // 4-11 with its sign copied above (even bytes are moved up into the high byte first).
  TGTI static void load(const uint8_t* gp, int sub, St& st) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gp + 32 * (sub >> 1)));
    st.t = _mm256_srai_epi16((sub & 1) ? _mm256_slli_epi16(v, 8) : v, 4);
  }
  // Vector 0 from the high word, vector 1 from the low word moved up; the mask keeps the sign and
  // the 7 bits that make the float e4m3 * 2^-120.
  TGTI static __m256 vec(const St& st, int k) {
    const __m256i w = k == 0 ? st.t : _mm256_slli_epi32(st.t, 16);
    const __m256 v = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0x87F00000u))));
    if constexpr (Wide) return _mm256_mul_ps(v, _mm256_set1_ps(0x1p112f));
    return v;
  }
  TGTI static __m256 scale(const float* sb, int64_t g) { return _mm256_broadcast_ss(sb + g); }
};
struct DecFP8 : DecFP8T<false> {
  using Wide = DecFP8T<true>;
  using DecFP8T::DecFP8T;
};

// E4M3 through F16, in the bits route's decoded order (pos above), for Intel cores and weights
// with many E4M3 subnormals (fp8_decode_for in qmatmul.h; the bits route makes them float
// subnormals, and an Intel core takes a microcode assist for every FMA with one). Per sub-step one
// vpshufb puts the 16 bytes of its two vectors, in lane order, into the high bytes of 16 words
// (vector 0's four per 128-bit lane in the low qword, vector 1's in the high one), vpermq joins
// the lanes' qwords, and an arithmetic shift by 1 with bit 14 cleared makes each word the F16
// e4m3 * 2^-8 (subnormals included), which vcvtph2ps widens to a normal float. Scale field b + 8,
// as DecFP8F16 on AVX-512; outside fp8_fast_ok's range the same decode runs on the GEMM path.
// Same decoded order and the same exact products as the bits route, so the same bits; about twice
// its operations, so only Auto's subnormal-rich calls take it.
struct DecFP8F16 : DecFP8T<true> {  // geometry, order, scale field b + 8 and prep: the wide bits route's
  struct St {
    __m256i h;  // vector 0's F16 in the low 128 bits, vector 1's in the high
  };
  using DecFP8T::DecFP8T;
  // Sub-step 2q + p: vector 0 lane i is byte 32q + 4i + 3 - p, vector 1 lane i byte 32q + 4i + 1 - p.
  TGTI static void load(const uint8_t* gp, int sub, St& st) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gp + 32 * (sub >> 1)));
    const int p = sub & 1;
    const char z = static_cast<char>(0x80);  // vpshufb: a zero byte
    const __m256i ctl = _mm256_setr_epi8(z, 3 - p, z, 7 - p, z, 11 - p, z, 15 - p, z, 1 - p, z, 5 - p, z, 9 - p, z, 13 - p,
                                         z, 3 - p, z, 7 - p, z, 11 - p, z, 15 - p, z, 1 - p, z, 5 - p, z, 9 - p, z, 13 - p);
    const __m256i w = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, ctl), 0xD8);  // qwords 0, 2, 1, 3
    st.h = _mm256_and_si256(_mm256_srai_epi16(w, 1), _mm256_set1_epi16(static_cast<short>(0xBFFF)));
  }
  TGTI static __m256 vec(const St& st, int k) {
    return _mm256_cvtph_ps(k == 0 ? _mm256_castsi256_si128(st.h) : _mm256_extracti128_si256(st.h, 1));
  }
};
struct DecFP8H : DecFP8F16 {
  using Wide = DecFP8F16;
  using DecFP8F16::DecFP8F16;
};

// FP4 (MXFP4 and NVFP4): 32 bytes = 64 columns per group, decoded by byte lookups: both nibbles of every
// byte are looked up with vpshufb in two 16-byte tables, the low and high bytes of the value's
// bf16 pattern (every e2m1 value, sign included, is exact in bf16), interleaved into words, and
// each dword's two words put in the top half of a float lane by a shift or a mask, as for BF16
// weights: no sign to move by hand. Two sub-steps (low nibbles, then high) keep two word vectors
// per row live. MXFP4 and NVFP4 keep two accumulator chains per lane (kSplit = 2, see
// qmatmul_kernels.inc): with one, a tile's few rows were a few chains of 8 dependent FMAs per
// group, and the GEMV waited on their latency (Zen 4, one thread, best of 30 passes, alternating:
// MXFP4 T = 1 +7-13%, T = 2 +45%; NVFP4 T = 1 +29%, T = 2 -7%; docs/perf.md session 25). It
// replaced a vpermps lookup (8 entries: the sign moved by hand, 5 operations per 8 weights): with
// the deferred scales below, the MXFP4 GEMV at T = 1 ran +20-30% on AMD Zen 4 in AVX2 mode
// (docs/perf.md session 13) and +71% on Zen 3 (session 14). NVFP4 takes per-vector scales
// instead (DecNV): +14-38% at T = 1, +17% at T = 2 on Zen 3.
// Layout: byte j = 16h + 8u + 2t + e of the group, nibble parity p (low nibble: even column);
// sub-step p's word vector w[u] holds its value in word 2t + e of 128-bit half h, and vector
// k = 2u + e of the sub-step in lane 4h + t. A 32-column block is a half: lane 4h + t lies in
// block h.
constexpr int mx_pos(int c) {
  const int p = c & 1, j = c >> 1, h = j >> 4, u = (j >> 3) & 1, t = (j >> 1) & 3, e = j & 1;
  return (4 * p + 2 * u + e) * 8 + 4 * h + t;
}
// The bf16 bit pattern of e2m1 code n (bit 3 the sign) times mul.
constexpr uint16_t e2m1_bf16(int n, float mul) {
  constexpr float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = (n & 8 ? -mag[n & 7] : mag[n & 7]) * mul;
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(v) >> 16);
}
// The byte-table decode above, values e2m1 / MulInv (MXFP4: 2, its scale table's offset; NVFP4: 1).
template <int MulInv>
struct Fp4Bytes {
  struct St {
    __m256i w[2];
  };
  TGTI static __m256i table(bool high) {
    alignas(16) uint8_t b[16] = {};
    for (int n = 0; n < 16; ++n) {
      const uint16_t v = e2m1_bf16(n, 1.0f / MulInv);
      b[n] = static_cast<uint8_t>(high ? v >> 8 : v & 0xFF);
    }
    return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(b)));
  }
  TGTI static void load(const uint8_t* gp, int sub, St& st) {
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gp));
    if (sub) b = _mm256_srli_epi16(b, 4);
    const __m256i n = _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
    const __m256i lo = _mm256_shuffle_epi8(table(false), n), hi = _mm256_shuffle_epi8(table(true), n);
    st.w[0] = _mm256_unpacklo_epi8(lo, hi);
    st.w[1] = _mm256_unpackhi_epi8(lo, hi);
  }
  TGTI static __m256 vec(const St& st, int k) {
    const __m256i w = st.w[k >> 1];
    return _mm256_castsi256_ps(k & 1 ? _mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)))
                                     : _mm256_slli_epi32(w, 16));
  }
  static constexpr int pos(int c) { return mx_pos(c); }
};

// Scale rows with a scalar tail: n valid blocks from s, padded with zeros up to total.
template <class Cvt>
TGT void prep_blocks(const uint8_t* s, int64_t n, int64_t total, float* sb, Cvt cvt) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(sb + i, cvt.vec(load128_cvt_u8_epi32(s + i)));
  for (; i < n; ++i) sb[i] = cvt.one(s[i]);
  for (; i < total; ++i) sb[i] = 0.0f;
}

struct CvtE8M0p1 {  // 2^(b-126)
  TGTI __m256 vec(__m256i b) const {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(1)), 23));
  }
  float one(uint8_t b) const { return std::bit_cast<float>((static_cast<uint32_t>(b) + 1u) << 23); }
};

struct CvtE4M3 {  // e4m3 value * 2^-8, exactly
  TGTI __m256 vec(__m256i b) const {
    // Sign-extend the byte into the dword, then the F16 trick on the low 16 bits.
    const __m256i sx = _mm256_srai_epi32(_mm256_slli_epi32(b, 24), 24);
    __m256i h = _mm256_and_si256(_mm256_slli_epi32(sx, 7), _mm256_set1_epi32(0xBFFF));
    h = _mm256_packus_epi32(h, h);  // words: lanes 0-3 and 4-7 in each 128-bit half
    h = _mm256_permute4x64_epi64(h, 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  }
  float one(uint8_t b) const { return e4m3_to_f32(b) * 0x1p-8f; }
};

// MXFP4 (see mx_pos): the table holds e2m1 / 2 and the scale is 2^(b-126), as in
// qmatmul_avx512.cpp.
struct DecMX : DecBase, Fp4Bytes<2> {
  static constexpr int G = 64, NSUB = 2, NV = 4, GB = 32, kSPG = 2, kSplit = 2;
  static constexpr bool kScaled = true, kPost = false, kRowScales = true;
  explicit DecMX(const QWeight& w) : DecBase(w, w.cols / 2, 32) {}
  TGT void prep(int64_t r, int64_t g0, int64_t g1, float* sb) const {
    const int64_t b0 = 2 * g0;
    prep_blocks(scales + r * scale_cols + b0, std::min(2 * g1, nb) - b0, 2 * (g1 - g0), sb, CvtE8M0p1{});
  }
  // Deferred scales (qmatmul_kernels.inc, kDeferScales), as DecMX in qmatmul_avx512.cpp: sb
  // gets, per group and block, 2^(u_prev - u) (1 for the first group) and past the last group
  // 2^u_last, u = byte - 126; padding blocks (past cols) take byte 126. br collects the bytes'
  // range. The ratio fields 127 + prev - cur wrap on bytes when |prev - cur| > 126, but then the
  // range fails deferral_exact and the tile is prepared again the canonical way.
  struct ByteRange {
    __m256i lo, hi;
  };
  TGT static ByteRange range_start() { return {_mm256_set1_epi8(static_cast<char>(0xFF)), _mm256_setzero_si256()}; }
  TGT static void range_bytes(const ByteRange& br, int& lo, int& hi) {
    __m128i c = _mm_min_epu8(_mm256_castsi256_si128(br.lo), _mm256_extracti128_si256(br.lo, 1));
    __m128i d = _mm_max_epu8(_mm256_castsi256_si128(br.hi), _mm256_extracti128_si256(br.hi, 1));
    byte_min_max(c, d, lo, hi);
  }
  template <bool kRange>
  TGT void prep_deferred(int64_t r, int64_t ng, float* sb, ByteRange& br) const {
    const uint8_t* s = scales + r * scale_cols;
    const int64_t total = 2 * ng;
    auto byte = [&](int64_t j) -> uint8_t { return j < nb ? s[j] : 126; };
    // 32 blocks at a time: cur = bytes [i, i + 32), prev = the same blocks of the previous group
    // (2 bytes back; the first group's are its own). Read from the row where both lie in it (the
    // first chunk: cur alone), else from copies: past nb byte 126, past total byte i again (so
    // the range is unchanged; the ratios written there are overwritten or never read).
    for (int64_t i = 0; i < total; i += 32) {
      __m256i cur, prev;
      if (i >= 2 && i + 32 <= nb) {
        cur = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
        prev = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i - 2));
      } else if (i == 0 && 32 <= nb) {  // prev: cur moved up 2 bytes, its first 2 bytes kept
        cur = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
        const __m256i up = _mm256_alignr_epi8(cur, _mm256_permute2x128_si256(cur, cur, 0x08), 14);
        prev = _mm256_blendv_epi8(up, cur, _mm256_setr_epi16(-1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
      } else {
        alignas(32) uint8_t c[32], p[32];
        for (int k = 0; k < 32; ++k) {
          const int64_t j = i + k < total ? i + k : i;
          c[k] = byte(j);
          p[k] = byte(j < 2 ? j : j - 2);
        }
        cur = _mm256_load_si256(reinterpret_cast<const __m256i*>(c));
        prev = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
      }
      if constexpr (kRange) {
        br.lo = _mm256_min_epu8(br.lo, cur);
        br.hi = _mm256_max_epu8(br.hi, cur);
      }
      const __m256i field = _mm256_add_epi8(_mm256_sub_epi8(prev, cur), _mm256_set1_epi8(127));
      for (int k = 0; k < 4; ++k) {
        const __m128i q = k < 2 ? _mm256_castsi256_si128(field) : _mm256_extracti128_si256(field, 1);
        const __m256i f = _mm256_cvtepu8_epi32(k & 1 ? _mm_srli_si128(q, 8) : q);
        _mm256_storeu_ps(sb + i + 8 * k, _mm256_castsi256_ps(_mm256_slli_epi32(f, 23)));
      }
    }
    for (int b = 0; b < 2; ++b)  // 2^u_last per block (written after the loop's overshoot)
      sb[total + b] = std::bit_cast<float>(static_cast<uint32_t>(total > 0 ? byte(total - 2 + b) + 1 : 127) << 23);
  }
  // The deferred path's multiplier of group g (prep_deferred's floats are scale()'s layout).
  TGTI static __m256 ratio(const float* sb, int64_t g) { return scale(sb, g); }
  TGTI static __m256 scale(const float* sb, int64_t g) {
    const __m256i idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sb + 2 * g)), idx);
  }
};

// NVFP4: the byte-table decode of DecMX with the exact e2m1 values (not halved) and the same
// layout (mx_pos); block scale s * 2^-8 (F16 trick), post = scale2 * 2^8, see qmatmul_avx512.cpp.
// Lane 4h + t of vector k = 2u + e holds columns 32h + 16u + ..., block 2h + u: the multiplier of
// vector k is [s(2u) x4, s(2u+2) x4] of the group's 4 blocks, prepared once per row as two vectors
// per group (scale_k). Not deferred: E4M3 scales are not powers of two.
struct DecNV : DecBase, Fp4Bytes<1> {
  static constexpr int G = 64, NSUB = 2, NV = 4, GB = 32, kSPG = 16, kSplit = 2;
  static constexpr bool kScaled = true, kPost = true, kRowScales = true;
  explicit DecNV(const QWeight& w) : DecBase(w, w.cols / 2, 16) { post = w.scale2 * 256.0f; }
  // sb: per group, vector 0 = blocks (0, 2), vector 1 = blocks (1, 3), each repeated over 4 lanes.
  TGT void prep(int64_t r, int64_t g0, int64_t g1, float* sb) const {
    const uint8_t* s = scales + r * scale_cols;
    alignas(32) float blk[32];
    const __m256i i0 = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2), i1 = _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3);
    for (int64_t g = g0; g < g1; g += 8) {
      const int64_t b0 = 4 * g, n = std::clamp<int64_t>(nb - b0, 0, 32);
      prep_blocks(s + b0, n, 32, blk, CvtE4M3{});
      for (int64_t j = 0; j < 8 && g + j < g1; ++j) {
        const __m256 q = _mm256_castps128_ps256(_mm_load_ps(blk + 4 * j));
        float* o = sb + (g + j - g0) * kSPG;
        _mm256_storeu_ps(o, _mm256_permutevar8x32_ps(q, i0));
        _mm256_storeu_ps(o + 8, _mm256_permutevar8x32_ps(q, i1));
      }
    }
  }
  TGTI static __m256 scale_k(const float* sb, int64_t g, int k) { return _mm256_loadu_ps(sb + g * kSPG + 8 * (k >> 1)); }
};

// Fused path shapes (16 registers): rows R and token tile TTM for T = 1, 2, 3-4, more. T=1 takes
// 8 rows (8 weight streams in flight; Zen 4 in AVX2 mode, alternating pairs against 4 rows: the
// BF16 head from DRAM +28%, docs/perf.md session 13), FP8 4 (its decode holds a vector per row
// across a sub-step: 8 rows spill; on Zen 3, 4 rows against 8: +18%, session 14), MXFP4 3 and
// NVFP4 2: with two chains per row (kSplit) 6 and 4 accumulators, more spill (session 25).
// FP8 and MXFP4 take T >= 3 in 2 x 2 tiles (8 accumulators), not 1 x 4: on Zen 4, one thread,
// FP8 +32-43%, MXFP4 +1-5% at T = 4 and +11-15% at T = 8 (session 25); NVFP4 level either way.
template <int R_, int TTM_, bool Spread_ = false>
struct Shape {
  static constexpr int R = R_, TTM = TTM_;
  static constexpr bool kSpread = Spread_;
};
template <class D>
struct FusedShapes {
  static constexpr bool kMX = std::is_same_v<D, DecMX>, kNV = std::is_same_v<D, DecNV>;
  static constexpr bool kFP8 = std::is_same_v<D, DecFP8> || std::is_same_v<D, DecFP8H>;
  using S1 = Shape<kNV ? 2 : kMX ? 3 : kFP8 ? 4 : 8, 1>;
  using S2 = Shape<2, 2>;
  using S4 = Shape<kMX || kFP8 ? 2 : 1, kMX || kFP8 ? 2 : 4>;
  using SN = S4;
  static constexpr bool zen5() { return false; }  // no other shapes in AVX2 mode
  using S1Zen5 = S1;
  using S2Zen5 = S2;
  using SNZen5 = SN;
};

// GEMM path: register tile of 2 x 8 rows x 6 tokens (12 accumulators, 2 weight vectors and a
// broadcast: 15 of the 16 registers), panels of 32 rows.
struct GemmShape {
  static constexpr int MRV = 2, NR = 6, MB = 32;
};

#include "kernels/cpu/qmatmul_kernels.inc"

}  // namespace

void run_avx2(const QWeight& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y,
              int64_t ldy, int fused_max_t, FusedJob* job) {
  if (w.fmt == WFormat::FP8Block && fp8_via_f16(w, r0, r1))
    return run_any<DecF32, DecBF16, DecF16, DecFP8H, DecMX, DecNV>(w, r0, r1, x, ldx, T, y, ldy, fused_max_t, job);
  run_any<DecF32, DecBF16, DecF16, DecFP8, DecMX, DecNV>(w, r0, r1, x, ldx, T, y, ldy, fused_max_t, job);
}

}  // namespace dsv4::qmm
