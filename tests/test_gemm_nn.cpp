// gemm_nn against plain math, and bit-identical across ISAs, sizes and sub-blocks.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/cpu/gemm_nn.h"
#include "kernels/cpu/qmatmul.h"

using namespace dsv4;

namespace {
std::vector<float> rnd(std::mt19937& g, size_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}
// Pointers to the n rows of a matrix with row stride ld.
std::vector<const float*> rows_of(const float* p, int64_t ld, int64_t n) {
  std::vector<const float*> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[i] = p + i * ld;
  return r;
}
}  // namespace

TEST(GemmNN, MatchesPlainMathOnEveryIsa) {
  std::mt19937 g(5);
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {64, 512, 200}, {11, 77, 45}, {9, 33, 3}}) {
    const int64_t lda = K + 3, ldb = N + 5, ldc = N + 7;
    auto A = rnd(g, static_cast<size_t>(M * lda)), B = rnd(g, static_cast<size_t>(K * ldb));
    std::vector<float> ref(static_cast<size_t>(M * ldc), -7.0f);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += static_cast<double>(A[m * lda + k]) * B[k * ldb + n];
        ref[m * ldc + n] = static_cast<float>(s);
      }
    std::vector<float> first;
    for (Isa isa : {Isa::Scalar, Isa::AVX2, Isa::AVX512}) {
      if (!isa_supported(isa)) continue;
      set_isa_override(isa);
      std::vector<float> C(static_cast<size_t>(M * ldc), -7.0f);
      const auto Br = rows_of(B.data(), ldb, K);
      gemm_nn(A.data(), lda, Br.data(), C.data(), ldc, M, N, K);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < ldc; ++n) {
          if (n >= N) {
            ASSERT_EQ(C[m * ldc + n], -7.0f) << "wrote outside C";
            continue;
          }
          ASSERT_NEAR(C[m * ldc + n], ref[m * ldc + n], 1e-5 * K) << isa_name(isa);
        }
      // One fma chain per element in k order: every ISA gives the same bits.
      if (first.empty())
        first = C;
      else
        EXPECT_EQ(std::memcmp(first.data(), C.data(), C.size() * sizeof(float)), 0) << isa_name(isa);
      // On the calling thread (callers already on the pool): the same bits.
      std::vector<float> local(static_cast<size_t>(M * ldc), -7.0f);
      gemm_nn_local(A.data(), lda, Br.data(), local.data(), ldc, M, N, K);
      EXPECT_EQ(std::memcmp(local.data(), C.data(), C.size() * sizeof(float)), 0) << isa_name(isa) << " local";
      // A sub-block (fewer rows and columns) gives the same bits as the full product.
      std::vector<float> sub(static_cast<size_t>(M * ldc), 0.0f);
      const int64_t m1 = std::max<int64_t>(1, M / 2), n1 = std::max<int64_t>(1, N / 3);
      const auto Br1 = rows_of(B.data() + 1, ldb, K);
      gemm_nn(A.data() + m1 / 2 * lda, lda, Br1.data(), sub.data(), ldc, m1 - m1 / 2, n1, K);
      for (int64_t m = 0; m < m1 - m1 / 2; ++m)
        for (int64_t n = 0; n < n1 && n + 1 < N; ++n) ASSERT_EQ(sub[m * ldc + n], C[(m + m1 / 2) * ldc + n + 1]);
    }
    clear_isa_override();
  }
}

// gemm_nt: A . B^T with B's rows as the columns of C. Each element is gemm_nn's chain on B
// transposed, bit for bit, on every ISA; shapes with partial strips (N not a multiple of 32) and
// K not a multiple of the 16 x 16 transpose blocks.
TEST(GemmNT, IsGemmNNOnTheTransposeOnEveryIsa) {
  std::mt19937 g(6);
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{64, 640, 512}, {9, 70, 37}, {1, 1, 1}, {17, 32, 16}, {8, 33, 100}}) {
    const int64_t lda = K + 3, ldb = K + 5, ldc = N + 7;
    auto A = rnd(g, static_cast<size_t>(M * lda)), B = rnd(g, static_cast<size_t>(N * ldb));
    std::vector<float> Bt(static_cast<size_t>(K * N));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) Bt[k * N + n] = B[n * ldb + k];
    std::vector<float> first;
    for (Isa isa : {Isa::Scalar, Isa::AVX2, Isa::AVX512}) {
      if (!isa_supported(isa)) continue;
      set_isa_override(isa);
      std::vector<float> C(static_cast<size_t>(M * ldc), -7.0f), ref(static_cast<size_t>(M * ldc), -7.0f);
      const auto Br = rows_of(B.data(), ldb, N), Btr = rows_of(Bt.data(), N, K);
      gemm_nt(A.data(), lda, Br.data(), C.data(), ldc, M, N, K);
      gemm_nn(A.data(), lda, Btr.data(), ref.data(), ldc, M, N, K);
      ASSERT_EQ(std::memcmp(C.data(), ref.data(), C.size() * sizeof(float)), 0) << isa_name(isa) << " " << M << "x" << N << "x" << K;
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k) s += static_cast<double>(A[m * lda + k]) * B[n * ldb + k];
          ASSERT_NEAR(C[m * ldc + n], s, 1e-5 * K) << isa_name(isa);
        }
        for (int64_t n = N; n < ldc; ++n) ASSERT_EQ(C[m * ldc + n], -7.0f) << "wrote outside C";
      }
      if (first.empty())
        first = C;
      else
        EXPECT_EQ(std::memcmp(first.data(), C.data(), C.size() * sizeof(float)), 0) << isa_name(isa);
    }
    clear_isa_override();
  }
}

// B's rows are read where they lie (attention's keys: scattered over the window, the ring and
// the decoded entries): rows given in any order, anywhere in memory, give exactly the bits of
// the same rows gathered into one contiguous matrix, for both products and every ISA.
TEST(GemmRows, ScatteredRowsEqualTheGatheredCopy) {
  std::mt19937 g(7);
  const int64_t M = 19, K = 70, N = 45, pool_rows = 300;
  const auto A = rnd(g, static_cast<size_t>(M * K)), pool = rnd(g, static_cast<size_t>(pool_rows * 64));
  // Rows picked at random from a larger pool (repeats allowed, as a key in both the window and
  // the entries would be), each at its own offset within its 64-float slot.
  auto pick = [&](int64_t n, int64_t len) {
    std::uniform_int_distribution<int64_t> r(0, pool_rows - 1), off(0, 64 - len);
    std::vector<const float*> p(static_cast<size_t>(n));
    for (auto& x : p) x = pool.data() + r(g) * 64 + off(g);
    return p;
  };
  const auto nn_rows = pick(K, N), nt_rows = pick(N, 60);
  std::vector<float> nn_copy, nt_copy;
  for (const float* r : nn_rows) nn_copy.insert(nn_copy.end(), r, r + N);
  for (const float* r : nt_rows) nt_copy.insert(nt_copy.end(), r, r + 60);
  for (Isa isa : {Isa::Scalar, Isa::AVX2, Isa::AVX512}) {
    if (!isa_supported(isa)) continue;
    set_isa_override(isa);
    std::vector<float> a(static_cast<size_t>(M * N)), b(a.size());
    gemm_nn(A.data(), K, nn_rows.data(), a.data(), N, M, N, K);
    gemm_nn(A.data(), K, rows_of(nn_copy.data(), N, K).data(), b.data(), N, M, N, K);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << isa_name(isa) << " gemm_nn";
    std::vector<float> c(static_cast<size_t>(M * N)), e(c.size());
    gemm_nt(A.data(), K, nt_rows.data(), c.data(), N, M, N, 60);
    gemm_nt(A.data(), K, rows_of(nt_copy.data(), 60, N).data(), e.data(), N, M, N, 60);
    EXPECT_EQ(std::memcmp(c.data(), e.data(), c.size() * sizeof(float)), 0) << isa_name(isa) << " gemm_nt";
  }
  clear_isa_override();
}
