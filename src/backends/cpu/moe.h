#pragma once
// MoE routing and the clamped SwiGLU activation.
#include <cstdint>

namespace dsv4 {

// One token's routing from its gate logits [E]: a = sqrt(softplus(logits)); the k experts are
// hash_ids (hash layers) or the top k of a + bias; weights = a_e / sum(a) * scale.
void route_token(const float* logits, int64_t E, int64_t k, const float* bias, const int32_t* hash_ids, double scale,
                 int32_t* ids, float* weights);

// h = silu(g') * u' * w with u' = clamp(u, -lim, lim), g' = min(g, lim) when lim > 0.
// Written into g.
void swiglu_clamped(float* g, const float* u, int64_t n, float lim, float w);

}  // namespace dsv4
