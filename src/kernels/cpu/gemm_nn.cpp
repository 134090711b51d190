#include "kernels/cpu/gemm_nn.h"

// GCC 12's intrinsic headers trip -Wuninitialized once inlined (GCC PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/threads.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/transpose.h"

namespace dsv4 {

namespace {

// Row k of B: a contiguous matrix (a transposed strip) or rows given by pointers (attention's
// keys where they lie: a query's 640 keys were a 1.3 MB copy before every product).
struct Strided {
  const float* p;
  int64_t ld;
  const float* operator[](int64_t k) const { return p + k * ld; }
};
struct Rows {
  const float* const* r;
  const float* operator[](int64_t k) const { return r[k]; }
};

// Scalar reference: the same per-element order (k ascending, one fma chain) as the SIMD tiles.
// Not inlined into the SIMD tiles' remainders (there g++ 12 warned of a loop it could not
// bound, for gemm_nt's constant-width strips).
template <class BR>
__attribute__((noinline)) void tile_scalar(const float* A, int64_t lda, BR B, float* C, int64_t ldc, int64_t M,
                                           int64_t n0, int64_t n1, int64_t K) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      float acc = 0;
      for (int64_t k = 0; k < K; ++k) acc = std::fma(A[m * lda + k], B[k][n], acc);
      C[m * ldc + n] = acc;
    }
}

// 8 rows x 32 columns of C in 16 accumulators; per k: two loads of B, eight broadcasts of A.
template <class BR>
__attribute__((target("avx512f"))) void tile_avx512(const float* A, int64_t lda, BR B, float* C, int64_t ldc, int64_t M,
                                                     int64_t n0, int64_t n1, int64_t K) {
  int64_t n = n0;
  for (; n + 32 <= n1; n += 32) {
    int64_t m = 0;
    for (; m + 8 <= M; m += 8) {
      __m512 c[8][2];
      for (auto& r : c) r[0] = r[1] = _mm512_setzero_ps();
      for (int64_t k = 0; k < K; ++k) {
        const float* bk = B[k];
        const __m512 b0 = _mm512_loadu_ps(bk + n), b1 = _mm512_loadu_ps(bk + n + 16);
        for (int i = 0; i < 8; ++i) {
          const __m512 a = _mm512_set1_ps(A[(m + i) * lda + k]);
          c[i][0] = _mm512_fmadd_ps(a, b0, c[i][0]);
          c[i][1] = _mm512_fmadd_ps(a, b1, c[i][1]);
        }
      }
      for (int i = 0; i < 8; ++i) {
        _mm512_storeu_ps(C + (m + i) * ldc + n, c[i][0]);
        _mm512_storeu_ps(C + (m + i) * ldc + n + 16, c[i][1]);
      }
    }
    for (; m < M; ++m) {
      __m512 c0 = _mm512_setzero_ps(), c1 = c0;
      for (int64_t k = 0; k < K; ++k) {
        const __m512 a = _mm512_set1_ps(A[m * lda + k]);
        const float* bk = B[k];
        c0 = _mm512_fmadd_ps(a, _mm512_loadu_ps(bk + n), c0);
        c1 = _mm512_fmadd_ps(a, _mm512_loadu_ps(bk + n + 16), c1);
      }
      _mm512_storeu_ps(C + m * ldc + n, c0);
      _mm512_storeu_ps(C + m * ldc + n + 16, c1);
    }
  }
  if (n < n1) tile_scalar(A, lda, B, C, ldc, M, n, n1, K);
}

// R rows x 16 columns in 2R accumulators. R is a constant: with a run-time row count GCC keeps
// c[][] on the stack through the k loop (the qmatmul GEMM tile ran at a quarter of the FMA peak
// so on AMD Zen 3, docs/perf.md session 14).
template <int R, class BR>
__attribute__((target("avx2,fma"), always_inline)) inline void rows_avx2(const float* A, int64_t lda, BR B, float* C,
                                                                        int64_t ldc, int64_t m, int64_t n, int64_t K) {
  __m256 c[R][2];
  for (auto& r : c) r[0] = r[1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = B[k];
    const __m256 b0 = _mm256_loadu_ps(bk + n), b1 = _mm256_loadu_ps(bk + n + 8);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const __m256 a = _mm256_set1_ps(A[(m + i) * lda + k]);
      c[i][0] = _mm256_fmadd_ps(a, b0, c[i][0]);
      c[i][1] = _mm256_fmadd_ps(a, b1, c[i][1]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    _mm256_storeu_ps(C + (m + i) * ldc + n, c[i][0]);
    _mm256_storeu_ps(C + (m + i) * ldc + n + 8, c[i][1]);
  }
}

// 4 rows x 16 columns in 8 accumulators, then the rows left one at a time.
template <class BR>
__attribute__((target("avx2,fma"))) void tile_avx2(const float* A, int64_t lda, BR B, float* C, int64_t ldc, int64_t M,
                                                   int64_t n0, int64_t n1, int64_t K) {
  int64_t n = n0;
  for (; n + 16 <= n1; n += 16) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) rows_avx2<4>(A, lda, B, C, ldc, m, n, K);
    for (; m < M; ++m) rows_avx2<1>(A, lda, B, C, ldc, m, n, K);
  }
  if (n < n1) tile_scalar(A, lda, B, C, ldc, M, n, n1, K);
}

// dst[c * ldd + i] = rows[i][k0 + c] for a 16 x 16 block.
__attribute__((target("avx512f"))) void transpose16_avx512(const float* const* rows, int64_t k0, float* dst, int64_t ldd) {
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(rows[i] + k0);
  transpose16(r);
  for (int c = 0; c < 16; ++c) _mm512_storeu_ps(dst + c * ldd, r[c]);
}

// The same for 8 x 8.
__attribute__((target("avx"))) void transpose8_avx(const float* const* rows, int64_t k0, float* dst, int64_t ldd) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows[i] + k0);
  transpose8(r);
  for (int c = 0; c < 8; ++c) _mm256_storeu_ps(dst + c * ldd, r[c]);
}

// bt[k * 32 + j] = B[j][k] for the strip's w <= 32 rows of B (k < K); columns j >= w zero.
void transpose_strip(const float* const* B, int64_t w, int64_t K, float* bt) {
  int64_t k0 = 0;
  const Isa isa = active_isa();
  if (isa == Isa::AVX512 && w == 32)
    for (; k0 + 16 <= K; k0 += 16) {
      transpose16_avx512(B, k0, bt + k0 * 32, 32);
      transpose16_avx512(B + 16, k0, bt + k0 * 32 + 16, 32);
    }
  if (isa == Isa::AVX2 && w == 32)
    for (; k0 + 8 <= K; k0 += 8)
      for (int64_t j = 0; j < 32; j += 8) transpose8_avx(B + j, k0, bt + k0 * 32 + j, 32);
  for (int64_t k = k0; k < K; ++k)
    for (int64_t j = 0; j < 32; ++j) bt[k * 32 + j] = j < w ? B[j][k] : 0.0f;
}

}  // namespace

namespace {

// Columns [n0, n1) of C with the active ISA's tile.
template <class BR>
void columns(const float* A, int64_t lda, BR B, float* C, int64_t ldc, int64_t M, int64_t n0, int64_t n1, int64_t K) {
  const Isa isa = active_isa();
  if (isa == Isa::AVX512)
    tile_avx512(A, lda, B, C, ldc, M, n0, n1, K);
  else if (isa == Isa::AVX2)
    tile_avx2(A, lda, B, C, ldc, M, n0, n1, K);
  else
    tile_scalar(A, lda, B, C, ldc, M, n0, n1, K);
}

}  // namespace

void gemm_nn(const float* A, int64_t lda, const float* const* B, float* C, int64_t ldc, int64_t M, int64_t N, int64_t K) {
  // Split N in 32-column strips over the pool; every element's k-order is the same in any split.
  const int64_t strips = (N + 31) / 32;
  thread_pool().parallel_for(strips, [&](int64_t b, int64_t e) { columns(A, lda, Rows{B}, C, ldc, M, b * 32, std::min(N, e * 32), K); });
}

void gemm_nt(const float* A, int64_t lda, const float* const* B, float* C, int64_t ldc, int64_t M, int64_t N, int64_t K) {
  const int64_t strips = (N + 31) / 32;
  thread_pool().parallel_for(strips, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> bt, ct;  // the strip transposed: [K, 32]
    bt.resize(static_cast<size_t>(K * 32));
    for (int64_t s = b; s < e; ++s) {
      const int64_t n0 = s * 32, w = std::min<int64_t>(32, N - n0);
      transpose_strip(B + n0, w, K, bt.data());
      if (w == 32) {
        columns(A, lda, Strided{bt.data(), 32}, C + n0, ldc, M, 0, 32, K);
        continue;
      }
      // A partial strip: zero columns past N (the tiles' full width instead of the scalar
      // remainder; a column's chain never reads another's), the first w copied out.
      ct.resize(static_cast<size_t>(M * 32));
      columns(A, lda, Strided{bt.data(), 32}, ct.data(), 32, M, 0, 32, K);
      for (int64_t m = 0; m < M; ++m) std::copy(ct.begin() + m * 32, ct.begin() + m * 32 + w, C + m * ldc + n0);
    }
  });
}

void gemm_nn_local(const float* A, int64_t lda, const float* const* B, float* C, int64_t ldc, int64_t M, int64_t N,
                   int64_t K) {
  columns(A, lda, Rows{B}, C, ldc, M, 0, N, K);
}

}  // namespace dsv4
