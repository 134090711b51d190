#pragma once
// The two sublayers of a block (MODEL.md "Attention", "MoE"), each written once as a sequence
// of backend ops (model/backend.h): every backend runs the same stages in the same order.
#include <cstdint>

#include "io/config.h"
#include "model/backend.h"
#include "model/weights.h"
#include "parallel/partition.h"

namespace dsv4::parallel {
class Comm;
}

namespace dsv4 {

// s.f = attention(s.x) of layer l (weights L) for every row of the step; writes each
// sequence's rows into its caches of layer l.
void attention_layer(Backend& be, const ModelConfig& c, int64_t l, const LayerW& L, Backend::Step& s);

// This process's share of the routed experts in an expert-parallel run (docs/parallel.md).
struct MoeShard {
  ExpertSplit split;
  parallel::Comm* comm = nullptr;
};

// s.f = MoE(s.x) (routed experts + shared expert) over all rows; hash layers route by the tokens.
// With a shard: this rank runs its experts and the others' outputs come through shard->comm.
void moe_layer(Backend& be, const ModelConfig& c, const LayerW& L, Backend::Step& s, const MoeShard* shard = nullptr);

}  // namespace dsv4
