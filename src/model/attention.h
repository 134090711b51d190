#pragma once
// Pieces of sparse attention shared by every backend's reference: the sink softmax over a set
// of key/value vectors (K = V in DeepSeek-V4) and the CSA indexer's top-k selection.
#include <cstdint>
#include <vector>

namespace dsv4 {

// out[0..d) = sum_j p_j keys[j], p_j = exp(q.k_j*scale) / (sum_j' exp(q.k_j'*scale) + exp(sink)).
// out is overwritten.
void attend_with_sink(const float* q, const std::vector<const float*>& keys, int64_t d, float sink, float scale, float* out);

// Indexer: score(b) = sum_h w[h] * relu(q[h] . keys[b]) for b < n; returns the top min(k, n)
// entry indices (ties to the lower index).
std::vector<int32_t> indexer_topk(const float* q, const float* w, const float* keys, int64_t n, int64_t heads, int64_t dim,
                                  int64_t k);

}  // namespace dsv4
