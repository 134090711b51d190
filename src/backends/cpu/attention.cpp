#include "backends/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/arena.h"
#include "core/threads.h"
#include "kernels/cpu/gemm_nn.h"
#include "backends/cpu/ops.h"

namespace dsv4 {

void attend_heads(const float* Q, int64_t H, const float* K, int64_t n, int64_t d, const float* sink, float scale, float* out) {
  if (n == 0) {
    std::fill(out, out + H * d, 0.0f);
    return;
  }
  std::vector<float> p(static_cast<size_t>(H * n));
  std::vector<const float*> rows(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) rows[j] = K + j * d;
  query_key_scores(Q, H, rows.data(), n, d, p.data());  // p[h, j] = q_h . K_j
  count_matmul_flops(static_cast<uint64_t>(2 * H * n * d));
  attend_scores(p.data(), H, rows.data(), n, d, sink, scale, out);
}

void attend_scores(float* p, int64_t H, const float* const* K, int64_t n, int64_t d, const float* sink, float scale,
                   float* out, RunOn where) {
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
    gemm_nn(p, n, K, out, d, H, d, n);
  } else {
    softmax(0, H);
    gemm_nn_local(p, n, K, out, d, H, d, n);
  }
  count_matmul_flops(static_cast<uint64_t>(2 * H * n * d));  // the weighted sum
}

void query_key_scores(const float* Q, int64_t nq, const float* const* K, int64_t n, int64_t d, float* S) {
  if (nq == 0 || n == 0) return;
  gemm_nt(Q, d, K, S, n, nq, n, d);
}

void indexer_select(const float* q, const float* w, int64_t nq, const int64_t* vis, const Fp4Keys& keys, int64_t heads,
                    int64_t dim, int64_t k, int32_t* sel, int32_t* sel_n) {
  if (nq <= 0) return;
  // One scan of the keys for all nq queries (each strip of keys decoded once), up to the
  // furthest any of them sees; a query's scores past its own visible keys are not read.
  const int64_t n = *std::max_element(vis, vis + nq);
  Arena::Scope scope(thread_arena());
  float* scores = thread_arena().take(nq * n, /*zero=*/false).data();
  indexer_scores(q, w, nq, heads, dim, keys, n, scores, n);
  // The FLOPs of the scores used: each query's visible keys.
  count_matmul_flops(static_cast<uint64_t>(2 * heads * dim * std::accumulate(vis, vis + nq, int64_t{0})));
  thread_pool().parallel_for(nq, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const std::vector<int32_t> top = topk(scores + t * n, vis[t], k);
      std::copy(top.begin(), top.end(), sel + t * k);
      sel_n[t] = static_cast<int32_t>(top.size());
    }
  });
}

}  // namespace dsv4
