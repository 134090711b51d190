#include "kernels/cpu/indexer_scores.h"

// GCC 12's intrinsic headers trip -Wuninitialized once inlined (GCC PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/formats.h"
#include "core/threads.h"
#include "kernels/cpu/qmatmul.h"

namespace dsv4 {

namespace {

constexpr int64_t S = kIndexerStrip;

// The codec's values (kv/codec.cpp decodes with the same functions): E2M1 codes, E8M0 scales.
const float* e2m1_values() {
  static const std::array<float, 16> t = [] {
    std::array<float, 16> v{};
    for (int c = 0; c < 16; ++c) v[static_cast<size_t>(c)] = e2m1_to_f32(static_cast<uint8_t>(c));
    return v;
  }();
  return t.data();
}

const float* e8m0_values() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> v{};
    for (int b = 0; b < 256; ++b) v[static_cast<size_t>(b)] = e8m0_to_f32(static_cast<uint8_t>(b));
    return v;
  }();
  return t.data();
}

// A strip: keys 0..m-1 at base + i * rb, decoded into buf[c * S + i] (column-major, so a column
// of the strip is two AVX-512 vectors); lanes m..S-1 hold zeros.

void decode_scalar(const uint8_t* base, int64_t rb, int64_t m, int64_t dim, float* buf) {
  const float *val = e2m1_values(), *scl = e8m0_values();
  for (int64_t i = 0; i < S; ++i) {
    if (i >= m) {
      for (int64_t c = 0; c < dim; ++c) buf[c * S + i] = 0.0f;
      continue;
    }
    const uint8_t* p = base + i * rb;
    const uint8_t* sc = p + dim / 2;
    for (int64_t c = 0; c < dim; ++c) buf[c * S + i] = val[(p[c / 2] >> (4 * (c & 1))) & 0xF] * scl[sc[c / 32]];
  }
}

// One query's scores over a decoded strip (out: S floats), the order of the header.
void strip_scalar(const float* q, const float* w, int64_t heads, int64_t dim, const float* buf, float* out) {
  for (int64_t i = 0; i < S; ++i) {
    float score = 0.0f;
    for (int64_t h = 0; h < heads; ++h) {
      float dot = 0.0f;
      for (int64_t c = 0; c < dim; ++c) dot = std::fma(q[h * dim + c], buf[c * S + i], dot);
      score = std::fma(w[h], dot > 0.0f ? dot : 0.0f, score);  // NaN and -0 give +0, as maxps(dot, +0)
    }
    out[i] = score;
  }
}

// ---- AVX-512: 16 keys per vector, both halves of the strip in one tile.

#define DSV4_IX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))

DSV4_IX512 void decode_avx512(const uint8_t* base, int64_t rb, int64_t m, int64_t dim, float* buf) {
  const __m512 tbl = _mm512_loadu_ps(e2m1_values());
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t mh = std::clamp<int64_t>(m - 16 * half, 0, 16);
    // Lanes past the strip's keys gather nothing (their bytes may lie past the page) and decode
    // code 0: +0.
    const __mmask16 mask = static_cast<__mmask16>(mh >= 16 ? 0xFFFF : (1u << mh) - 1u);
    const __m512i off = _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(16 * half))),
                                           _mm512_set1_epi32(static_cast<int>(rb)));
    for (int64_t blk = 0; blk < dim / 32; ++blk) {
      // Scale byte blk: the top byte of the dword ending on it (never reads past the key).
      const __m512i sidx = _mm512_add_epi32(off, _mm512_set1_epi32(static_cast<int>(dim / 2 + blk - 3)));
      const __m512i sd = _mm512_mask_i32gather_epi32(zero, mask, sidx, base, 1);
      const __m512 s = _mm512_i32gather_ps(_mm512_srli_epi32(sd, 24), e8m0_values(), 4);
      for (int64_t j = 0; j < 4; ++j) {  // the block's 4 dwords of codes, 8 columns each
        const __m512i cidx = _mm512_add_epi32(off, _mm512_set1_epi32(static_cast<int>(blk * 16 + 4 * j)));
        const __m512i cd = _mm512_mask_i32gather_epi32(zero, mask, cidx, base, 1);
        float* col = buf + (blk * 32 + 8 * j) * S + 16 * half;
        // Nibble k of the dword is column 8j + k (low nibble first, bytes in order).
        _mm512_storeu_ps(col + 0 * S, _mm512_mul_ps(_mm512_permutexvar_ps(cd, tbl), s));
        _mm512_storeu_ps(col + 1 * S, _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(cd, 4), tbl), s));
        _mm512_storeu_ps(col + 2 * S, _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(cd, 8), tbl), s));
        _mm512_storeu_ps(col + 3 * S, _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(cd, 12), tbl), s));
        _mm512_storeu_ps(col + 4 * S, _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(cd, 16), tbl), s));
        _mm512_storeu_ps(col + 5 * S, _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(cd, 20), tbl), s));
        _mm512_storeu_ps(col + 6 * S, _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(cd, 24), tbl), s));
        _mm512_storeu_ps(col + 7 * S, _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(cd, 28), tbl), s));
      }
    }
  }
}

// R heads x 32 keys in 2R accumulators (one fma chain each down the columns), then their
// scores into s0, s1 in head order. R is a constant so the accumulators stay in registers.
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"), always_inline)) inline void heads_avx512(
    const float* q, const float* w, int64_t dim, const float* buf, __m512& s0, __m512& s1) {
  __m512 c[R][2];
  for (auto& r : c) r[0] = r[1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < dim; ++k) {
    const __m512 b0 = _mm512_loadu_ps(buf + k * S), b1 = _mm512_loadu_ps(buf + k * S + 16);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 a = _mm512_set1_ps(q[i * dim + k]);
      c[i][0] = _mm512_fmadd_ps(a, b0, c[i][0]);
      c[i][1] = _mm512_fmadd_ps(a, b1, c[i][1]);
    }
  }
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    const __m512 wi = _mm512_set1_ps(w[i]);
    s0 = _mm512_fmadd_ps(wi, _mm512_max_ps(c[i][0], zero), s0);  // maxps: NaN and -0 give +0
    s1 = _mm512_fmadd_ps(wi, _mm512_max_ps(c[i][1], zero), s1);
  }
}

DSV4_IX512 void strip_avx512(const float* q, const float* w, int64_t heads, int64_t dim, const float* buf, float* out) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0;
  int64_t h = 0;
  for (; h + 8 <= heads; h += 8) heads_avx512<8>(q + h * dim, w + h, dim, buf, s0, s1);
  for (; h + 4 <= heads; h += 4) heads_avx512<4>(q + h * dim, w + h, dim, buf, s0, s1);
  for (; h < heads; ++h) heads_avx512<1>(q + h * dim, w + h, dim, buf, s0, s1);
  _mm512_storeu_ps(out, s0);
  _mm512_storeu_ps(out + 16, s1);
}

// ---- AVX2: 8 keys per vector; the strip's halves of 16 keys one after the other.

#define DSV4_IX2 __attribute__((target("avx2,fma")))

// The values of 8 codes (low 4 bits of each lane) times the scales: two 8-entry permutes, picked
// by the code's bit 3 moved to the sign bit.
__attribute__((target("avx2,fma"), always_inline)) inline __m256 value_avx2(__m256 lo, __m256 hi, __m256i code, __m256 s) {
  const __m256 v = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, code), _mm256_permutevar8x32_ps(hi, code),
                                    _mm256_castsi256_ps(_mm256_slli_epi32(code, 28)));
  return _mm256_mul_ps(v, s);
}

DSV4_IX2 void decode_avx2(const uint8_t* base, int64_t rb, int64_t m, int64_t dim, float* buf) {
  const __m256 lo = _mm256_loadu_ps(e2m1_values()), hi = _mm256_loadu_ps(e2m1_values() + 8);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i zero = _mm256_setzero_si256();
  for (int64_t part = 0; part < 4; ++part) {
    const int64_t mp = std::clamp<int64_t>(m - 8 * part, 0, 8);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(mp)), lane);
    const __m256i off = _mm256_mullo_epi32(_mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int>(8 * part))),
                                           _mm256_set1_epi32(static_cast<int>(rb)));
    for (int64_t blk = 0; blk < dim / 32; ++blk) {
      const __m256i sidx = _mm256_add_epi32(off, _mm256_set1_epi32(static_cast<int>(dim / 2 + blk - 3)));
      const __m256i sd = _mm256_mask_i32gather_epi32(zero, reinterpret_cast<const int*>(base), sidx, mask, 1);
      const __m256 s = _mm256_i32gather_ps(e8m0_values(), _mm256_srli_epi32(sd, 24), 4);
      for (int64_t j = 0; j < 4; ++j) {
        const __m256i cidx = _mm256_add_epi32(off, _mm256_set1_epi32(static_cast<int>(blk * 16 + 4 * j)));
        const __m256i cd = _mm256_mask_i32gather_epi32(zero, reinterpret_cast<const int*>(base), cidx, mask, 1);
        float* col = buf + (blk * 32 + 8 * j) * S + 8 * part;
        _mm256_storeu_ps(col + 0 * S, value_avx2(lo, hi, cd, s));
        _mm256_storeu_ps(col + 1 * S, value_avx2(lo, hi, _mm256_srli_epi32(cd, 4), s));
        _mm256_storeu_ps(col + 2 * S, value_avx2(lo, hi, _mm256_srli_epi32(cd, 8), s));
        _mm256_storeu_ps(col + 3 * S, value_avx2(lo, hi, _mm256_srli_epi32(cd, 12), s));
        _mm256_storeu_ps(col + 4 * S, value_avx2(lo, hi, _mm256_srli_epi32(cd, 16), s));
        _mm256_storeu_ps(col + 5 * S, value_avx2(lo, hi, _mm256_srli_epi32(cd, 20), s));
        _mm256_storeu_ps(col + 6 * S, value_avx2(lo, hi, _mm256_srli_epi32(cd, 24), s));
        _mm256_storeu_ps(col + 7 * S, value_avx2(lo, hi, _mm256_srli_epi32(cd, 28), s));
      }
    }
  }
}

template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void heads_avx2(const float* q, const float* w, int64_t dim,
                                                                          const float* buf, __m256& s0, __m256& s1) {
  __m256 c[R][2];
  for (auto& r : c) r[0] = r[1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < dim; ++k) {
    const __m256 b0 = _mm256_loadu_ps(buf + k * S), b1 = _mm256_loadu_ps(buf + k * S + 8);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const __m256 a = _mm256_set1_ps(q[i * dim + k]);
      c[i][0] = _mm256_fmadd_ps(a, b0, c[i][0]);
      c[i][1] = _mm256_fmadd_ps(a, b1, c[i][1]);
    }
  }
  const __m256 zero = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    const __m256 wi = _mm256_set1_ps(w[i]);
    s0 = _mm256_fmadd_ps(wi, _mm256_max_ps(c[i][0], zero), s0);
    s1 = _mm256_fmadd_ps(wi, _mm256_max_ps(c[i][1], zero), s1);
  }
}

DSV4_IX2 void strip_avx2(const float* q, const float* w, int64_t heads, int64_t dim, const float* buf, float* out) {
  for (int64_t half = 0; half < 2; ++half) {
    const float* b = buf + 16 * half;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t h = 0;
    for (; h + 4 <= heads; h += 4) heads_avx2<4>(q + h * dim, w + h, dim, b, s0, s1);
    for (; h < heads; ++h) heads_avx2<1>(q + h * dim, w + h, dim, b, s0, s1);
    _mm256_storeu_ps(out + 16 * half, s0);
    _mm256_storeu_ps(out + 16 * half + 8, s1);
  }
}

}  // namespace

void indexer_scores(const float* q, const float* w, int64_t nq, int64_t heads, int64_t dim, const Fp4Keys& keys,
                    int64_t n, float* scores, int64_t ld) {
  if (n <= 0 || nq <= 0) return;
  DSV4_CHECK(dim > 0 && dim % 32 == 0);
  DSV4_CHECK(keys.page_rows % S == 0 || n <= keys.page_rows);  // a strip never spans two pages
  const Isa isa = active_isa();
  auto decode = isa == Isa::AVX512 ? decode_avx512 : isa == Isa::AVX2 ? decode_avx2 : decode_scalar;
  auto strip = isa == Isa::AVX512 ? strip_avx512 : isa == Isa::AVX2 ? strip_avx2 : strip_scalar;
  const int64_t strips = (n + S - 1) / S;
  // Strips handed out in chunks (a vCPU slowed by another tenant does not hold the rest up).
  thread_pool().parallel_for(
      strips,
      [&](int64_t s0, int64_t s1) {
        thread_local std::vector<float> buf;
        buf.resize(static_cast<size_t>(dim * S));
        float out[S];
        for (int64_t s = s0; s < s1; ++s) {
          const int64_t b0 = s * S, m = std::min(S, n - b0);
          decode(keys.pages[b0 / keys.page_rows] + (b0 % keys.page_rows) * keys.row_bytes, keys.row_bytes, m, dim,
                 buf.data());
          for (int64_t t = 0; t < nq; ++t) {
            strip(q + t * heads * dim, w + t * heads, heads, dim, buf.data(), out);
            std::memcpy(scores + t * ld + b0, out, static_cast<size_t>(m) * sizeof(float));
          }
        }
      },
      4);
}

}  // namespace dsv4
