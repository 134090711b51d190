#pragma once
// Float transposes in registers (16 x 16 AVX-512, 8 x 8 AVX), for the kernels that turn rows
// into lanes (qmatmul's GEMM panels, gemm_nt's strips of keys). Only for callers compiled for
// the ISA (the target attribute; the binary still runs elsewhere as long as they are not
// called).
// GCC 12's intrinsic headers trip -Wuninitialized once inlined (GCC PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace dsv4 {

// r[i] lane j -> r[j] lane i. Stage 1 interleaves pairs of rows (32-bit), stage 2 pairs of pairs
// (64-bit): then 128-bit lane q of b[4i+m] holds column 4q+m of rows 4i..4i+3, and stage 3
// transposes those 4 x 4 blocks of 128-bit lanes.
__attribute__((target("avx512f"), always_inline)) inline void transpose16(__m512 (&r)[16]) {
  __m512 a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a0 = _mm512_castps_pd(a[4 * i]), a1 = _mm512_castps_pd(a[4 * i + 1]);
    const __m512d a2 = _mm512_castps_pd(a[4 * i + 2]), a3 = _mm512_castps_pd(a[4 * i + 3]);
    b[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
    b[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    b[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
    b[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  for (int m = 0; m < 4; ++m) {
    const __m512 d0 = _mm512_shuffle_f32x4(b[m], b[4 + m], 0x44), d1 = _mm512_shuffle_f32x4(b[m], b[4 + m], 0xEE);
    const __m512 d2 = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], 0x44), d3 = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], 0xEE);
    r[m] = _mm512_shuffle_f32x4(d0, d2, 0x88);
    r[4 + m] = _mm512_shuffle_f32x4(d0, d2, 0xDD);
    r[8 + m] = _mm512_shuffle_f32x4(d1, d3, 0x88);
    r[12 + m] = _mm512_shuffle_f32x4(d1, d3, 0xDD);
  }
}

// r[i] lane j -> r[j] lane i for 8 x 8. Stages 1-2 as in transpose16 (then 128-bit lane q of
// b[4i+m] holds column 4q+m of rows 4i..4i+3); stage 3 swaps lanes.
__attribute__((target("avx"), always_inline)) inline void transpose8(__m256 (&r)[8]) {
  __m256 a[8], b[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    const __m256d a0 = _mm256_castps_pd(a[4 * i]), a1 = _mm256_castps_pd(a[4 * i + 1]);
    const __m256d a2 = _mm256_castps_pd(a[4 * i + 2]), a3 = _mm256_castps_pd(a[4 * i + 3]);
    b[4 * i] = _mm256_castpd_ps(_mm256_unpacklo_pd(a0, a2));
    b[4 * i + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a0, a2));
    b[4 * i + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(a1, a3));
    b[4 * i + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(a1, a3));
  }
  for (int m = 0; m < 4; ++m) {
    r[m] = _mm256_permute2f128_ps(b[m], b[4 + m], 0x20);
    r[4 + m] = _mm256_permute2f128_ps(b[m], b[4 + m], 0x31);
  }
}

}  // namespace dsv4
