#pragma once
// Per-sequence decoding state: everything a later chunk needs from earlier positions.
// Starts empty for every sequence (no leakage between prompts).
#include <cstdint>
#include <vector>

#include "io/config.h"

namespace dsv4 {

// Rows (a = wkv.x, s = wgate.x + ape) of the block being filled, and for ratio 4 the previous
// full block, whose first half of channels the next entry pools over (overlap).
struct CompressorState {
  int64_t ratio = 0, width = 0;   // width = coff * out_dim
  std::vector<float> cur_a, cur_s;    // [ratio, width], first n_cur rows valid
  std::vector<float> prev_a, prev_s;  // [ratio, width], valid when has_prev
  int64_t n_cur = 0;
  bool has_prev = false;
};

struct LayerState {
  int64_t head_dim = 0, window = 0;
  std::vector<float> window_kv;  // [window, head_dim], slot = pos % window
  std::vector<float> entries;    // [n_entries, head_dim]: fp8sim'd nope + rope part
  std::vector<float> index_keys; // [n_entries, index_dim]: Hadamard + fp4sim'd (ratio 4)
  int64_t n_entries = 0;
  CompressorState comp, index_comp;
};

struct SequenceState {
  int64_t pos = 0;  // tokens consumed so far
  std::vector<LayerState> layers;
};

// Empty state shaped for the model's main layers.
SequenceState make_sequence_state(const ModelConfig& c);

}  // namespace dsv4
