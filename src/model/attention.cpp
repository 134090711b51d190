#include "model/attention.h"

#include <algorithm>
#include <cmath>

#include "model/ops.h"

namespace dsv4 {

void attend_with_sink(const float* q, const std::vector<const float*>& keys, int64_t d, float sink, float scale, float* out) {
  std::vector<float> s(keys.size());
  float mx = sink;
  for (size_t j = 0; j < keys.size(); ++j) mx = std::max(mx, s[j] = dot(q, keys[j], d) * scale);
  float den = std::exp(sink - mx);  // the sink only adds to the denominator
  for (size_t j = 0; j < keys.size(); ++j) den += (s[j] = std::exp(s[j] - mx));
  std::fill(out, out + d, 0.0f);
  for (size_t j = 0; j < keys.size(); ++j) {
    const float p = s[j] / den;
    for (int64_t k = 0; k < d; ++k) out[k] += p * keys[j][k];
  }
}

std::vector<int32_t> indexer_topk(const float* q, const float* w, const float* keys, int64_t n, int64_t heads, int64_t dim,
                                  int64_t k) {
  std::vector<float> score(static_cast<size_t>(n), 0.0f);
  for (int64_t b = 0; b < n; ++b) {
    float sc = 0;
    for (int64_t h = 0; h < heads; ++h) sc += w[h] * std::max(0.0f, dot(q + h * dim, keys + b * dim, dim));
    score[b] = sc;
  }
  return topk(score.data(), n, k);
}

}  // namespace dsv4
