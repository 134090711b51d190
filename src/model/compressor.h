#pragma once
// The KV compressor of CSA/HCA layers (and the indexer's own compressor): pools each block of
// `ratio` positions into one entry with a per-channel softmax over positions.
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "kv/state.h"
#include "model/ops.h"
#include "model/weights.h"

namespace dsv4 {

// Feeds the rows of positions p0..p0+T-1 (x: the normed attention input [T, D]); appends each
// entry whose block closes inside the chunk to `entries` (out_dim floats each) and returns how
// many. Main entries get fp8sim on the non-rope part; indexer entries (indexer = true) get
// Hadamard + fp4sim.
int64_t compress(const ModelConfig& c, const CompressorW& w, CompressorState& s, const RopeTable& rope, const float* x,
                 int64_t T, int64_t p0, bool indexer, std::vector<float>& entries);

}  // namespace dsv4
