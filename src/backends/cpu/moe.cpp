#include "backends/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/ops.h"

namespace dsv4 {

void route_token(const float* logits, int64_t E, int64_t k, const float* bias, const int32_t* hash_ids, double scale,
                 int32_t* ids, float* weights) {
  std::vector<float> a(static_cast<size_t>(E));
  for (int64_t i = 0; i < E; ++i) a[i] = std::sqrt(softplus(logits[i]));
  if (hash_ids) {
    std::copy(hash_ids, hash_ids + k, ids);
  } else {
    std::vector<float> biased(static_cast<size_t>(E));
    for (int64_t i = 0; i < E; ++i) biased[i] = a[i] + (bias ? bias[i] : 0.0f);  // the bias only selects
    std::vector<int32_t> top = topk(biased.data(), E, k);
    std::copy(top.begin(), top.end(), ids);
  }
  float sum = 0;
  for (int64_t j = 0; j < k; ++j) sum += a[ids[j]];
  for (int64_t j = 0; j < k; ++j) weights[j] = a[ids[j]] / sum * static_cast<float>(scale);
}

void swiglu_clamped(float* g, const float* u, int64_t n, float lim, float w) {
  for (int64_t j = 0; j < n; ++j) {
    float gv = g[j], uv = u[j];
    if (lim > 0) {  // asymmetric: the up projection both ways, the gate only from above
      uv = std::clamp(uv, -lim, lim);
      gv = std::min(gv, lim);
    }
    g[j] = silu(gv) * uv * w;
  }
}

}  // namespace dsv4
