#include "backends/cpu/attention.h"

#include <algorithm>
#include <cmath>

#include "core/threads.h"
#include "kernels/cpu/gemm_nn.h"
#include "kernels/cpu/qmatmul.h"
#include "backends/cpu/ops.h"

namespace dsv4 {

void attend_heads(const float* Q, int64_t H, const float* K, int64_t n, int64_t d, const float* sink, float scale, float* out) {
  if (n == 0) {
    std::fill(out, out + H * d, 0.0f);
    return;
  }
  // Scores S[h, j] = q_h . K_j: the keys act as an F32 weight [n, d], the heads as tokens.
  std::vector<float> p(static_cast<size_t>(H * n));
  qmatmul(f32_weight(K, n, d), 0, n, Q, d, H, p.data(), n);
  count_matmul_flops(static_cast<uint64_t>(2 * H * n * d));
  attend_scores(p.data(), H, K, n, d, sink, scale, out);
}

void attend_scores(float* p, int64_t H, const float* K, int64_t n, int64_t d, const float* sink, float scale, float* out,
                   RunOn where) {
  if (n == 0) {
    std::fill(out, out + H * d, 0.0f);
    return;
  }
  auto softmax = [&](int64_t hb, int64_t he) {
    for (int64_t h = hb; h < he; ++h) {
      float* s = p + h * n;
      float mx = sink[h];
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, s[j] *= scale);
      float den = std::exp(sink[h] - mx);  // the sink only adds to the denominator
      for (int64_t j = 0; j < n; ++j) den += (s[j] = std::exp(s[j] - mx));
      const float inv = 1.0f / den;
      for (int64_t j = 0; j < n; ++j) s[j] *= inv;
    }
  };
  if (where == RunOn::Pool) {
    thread_pool().parallel_for(H, softmax);
    gemm_nn(p, n, K, d, out, d, H, d, n);
  } else {
    softmax(0, H);
    gemm_nn_local(p, n, K, d, out, d, H, d, n);
  }
  count_matmul_flops(static_cast<uint64_t>(2 * H * n * d));  // the weighted sum
}

void query_key_scores(const float* Q, int64_t nq, const float* K, int64_t n, int64_t d, float* S) {
  if (nq == 0 || n == 0) return;
  qmatmul(f32_weight(Q, nq, d), 0, nq, K, d, n, S, nq);
}

std::vector<int32_t> indexer_topk(const float* q, const float* w, const float* keys, int64_t n, int64_t heads, int64_t dim,
                                  int64_t k) {
  if (n == 0) return {};
  std::vector<float> dots(static_cast<size_t>(heads * n));  // the keys as a weight, heads as tokens
  qmatmul(f32_weight(keys, n, dim), 0, n, q, dim, heads, dots.data(), n);
  count_matmul_flops(static_cast<uint64_t>(2 * heads * n * dim));
  // Each key's score sums its heads in order h = 0, 1, ...: split over keys (ranges of 256), the
  // bits do not depend on the split.
  std::vector<float> score(static_cast<size_t>(n), 0.0f);
  constexpr int64_t kKeys = 256;
  thread_pool().parallel_for((n + kKeys - 1) / kKeys, [&](int64_t cb, int64_t ce) {
    const int64_t b0 = cb * kKeys, b1 = std::min(n, ce * kKeys);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t b = b0; b < b1; ++b) score[b] += w[h] * std::max(0.0f, dots[h * n + b]);
  });
  return topk(score.data(), n, k);
}

}  // namespace dsv4
