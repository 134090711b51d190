#pragma once
// The two sublayers of a block (MODEL.md "Attention", "MoE"), each written once as a sequence
// of backend ops (model/backend.h): every backend runs the same stages in the same order.
#include <cstdint>

#include "io/config.h"
#include "model/backend.h"
#include "model/weights.h"

namespace dsv4 {

// s.f = attention(s.x) of layer l (weights L) for every row of the step; writes each
// sequence's rows into its caches of layer l.
void attention_layer(Backend& be, const ModelConfig& c, int64_t l, const LayerW& L, Backend::Step& s);

// s.f = MoE(s.x) (routed experts + shared expert) over all rows; hash layers route by the tokens.
void moe_layer(Backend& be, const ModelConfig& c, const LayerW& L, Backend::Step& s);

}  // namespace dsv4
