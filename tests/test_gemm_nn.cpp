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
      gemm_nn(A.data(), lda, B.data(), ldb, C.data(), ldc, M, N, K);
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
      gemm_nn_local(A.data(), lda, B.data(), ldb, local.data(), ldc, M, N, K);
      EXPECT_EQ(std::memcmp(local.data(), C.data(), C.size() * sizeof(float)), 0) << isa_name(isa) << " local";
      // A sub-block (fewer rows and columns) gives the same bits as the full product.
      std::vector<float> sub(static_cast<size_t>(M * ldc), 0.0f);
      const int64_t m1 = std::max<int64_t>(1, M / 2), n1 = std::max<int64_t>(1, N / 3);
      gemm_nn(A.data() + m1 / 2 * lda, lda, B.data() + 1, ldb, sub.data(), ldc, m1 - m1 / 2, n1, K);
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
      gemm_nt(A.data(), lda, B.data(), ldb, C.data(), ldc, M, N, K);
      gemm_nn(A.data(), lda, Bt.data(), N, ref.data(), ldc, M, N, K);
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
