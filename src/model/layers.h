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

// This process's share of the model in a parallel run (docs/parallel.md): EP, the routed
// experts by id; TP, the attention heads by output group and the head's vocabulary rows.
struct Shard : Share {
  parallel::Comm* comm = nullptr;
};

// s.f = attention(s.x) of layer l (weights L) for every row of the step; writes each
// sequence's rows into its caches of layer l.
// With a TP shard: this rank runs its output groups' heads and the groups' z columns come
// through shard->comm.
void attention_layer(Backend& be, const ModelConfig& c, int64_t l, const LayerW& L, Backend::Step& s,
                     const Shard* shard = nullptr);


// s.f = MoE(s.x) (routed experts + shared expert) over all rows; hash layers route by the tokens.
// With an EP shard: this rank runs its experts and the others' outputs come through shard->comm.
void moe_layer(Backend& be, const ModelConfig& c, const LayerW& L, Backend::Step& s, const Shard* shard = nullptr);

}  // namespace dsv4
