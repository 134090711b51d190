#pragma once
// The smallest and largest of 16 byte lanes each of two vectors (the MXFP4 scale-byte range of a
// row tile, qmatmul_avx2.cpp / qmatmul_avx512.cpp DecMX::range_bytes, after their wider halves
// are folded in).
#include <immintrin.h>

namespace dsv4::qmm {

__attribute__((target("sse4.1"), always_inline)) inline void byte_min_max(__m128i c, __m128i d, int& lo, int& hi) {
  c = _mm_min_epu8(c, _mm_srli_si128(c, 8));
  d = _mm_max_epu8(d, _mm_srli_si128(d, 8));
  c = _mm_min_epu8(c, _mm_srli_si128(c, 4));
  d = _mm_max_epu8(d, _mm_srli_si128(d, 4));
  c = _mm_min_epu8(c, _mm_srli_si128(c, 2));
  d = _mm_max_epu8(d, _mm_srli_si128(d, 2));
  c = _mm_min_epu8(c, _mm_srli_si128(c, 1));
  d = _mm_max_epu8(d, _mm_srli_si128(d, 1));
  lo = _mm_extract_epi8(c, 0);
  hi = _mm_extract_epi8(d, 0);
}

}  // namespace dsv4::qmm
