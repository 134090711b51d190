#pragma once
// C[M, N] = A[M, K] . B[K, N] for float32 row-major A and C (lda, ldc strides) and B given by
// its rows (B[k]: N floats): the attention's probabilities-times-values product, where B (the
// values) is read row by row, each where it lies (no gathered copy).
// Each C element is accumulated over k in increasing order in one chain, whatever the ISA tile,
// so results do not depend on M, N or how the work is split. Columns run in parallel on the pool.
#include <cstdint>

namespace dsv4 {

void gemm_nn(const float* A, int64_t lda, const float* const* B, float* C, int64_t ldc, int64_t M, int64_t N, int64_t K);

// The same on the calling thread (callers already running on the pool: it is not reentrant).
void gemm_nn_local(const float* A, int64_t lda, const float* const* B, float* C, int64_t ldc, int64_t M, int64_t N,
                   int64_t K);

// C[M, N] = A[M, K] . B[N, K]^T (B given by its N rows of K floats: attention's query-key
// scores, the keys as rows): each element the same one fma chain in k order as gemm_nn gives with B transposed,
// bit for bit. Each 32-row strip of B is transposed into a thread's buffer, then run through
// gemm_nn's tiles (the fused qmatmul with K = 512 F32 "weights" ran ~4x slower per FLOP here).
void gemm_nt(const float* A, int64_t lda, const float* const* B, float* C, int64_t ldc, int64_t M, int64_t N, int64_t K);

}  // namespace dsv4
