#pragma once
// The KV compressor of CSA/HCA layers (and the indexer's own compressor): pools each block of
// `ratio` positions into one entry with a per-channel softmax over positions.
#include <cstdint>
#include <vector>

#include "backends/cpu/ops.h"
#include "io/config.h"
#include "kv/state.h"
#include "model/weights.h"

namespace dsv4 {

// The compressor's rows for T tokens (x: the normed attention input [T, D]): a = wkv.x and
// g = wgate.x, each [T, coff*out_dim]. One product over every token of a step.
void compress_project(const CompressorW& w, const float* x, int64_t T, float* a, float* g);

// Feeds one sequence's rows of positions p0..p0+T-1 (a, g from compress_project) into its
// state; appends each entry whose block closes inside the chunk to `entries` (out_dim floats
// each) and returns how many. KV entries get fp8sim on the non-rope part; indexer keys
// (Comp::Index) get Hadamard + fp4sim.
int64_t compress_feed(const ModelConfig& c, const CompressorW& w, CompressorState& s, const RopeTable& rope, const float* a,
                      const float* g, int64_t T, int64_t p0, Comp which, std::vector<float>& entries);

// Both, for one sequence.
int64_t compress(const ModelConfig& c, const CompressorW& w, CompressorState& s, const RopeTable& rope, const float* x,
                 int64_t T, int64_t p0, Comp which, std::vector<float>& entries);

}  // namespace dsv4
