#pragma once
// Per-sequence decoding state: everything a later chunk needs from earlier positions.
// Starts empty for every sequence (no leakage between prompts).
#include <cstdint>
#include <memory>
#include <vector>

#include "io/config.h"
#include "kv/codec.h"

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

// Cached vectors are kept in their compact form (kv/codec.h): FP8 + scale for the non-RoPE part
// of KV vectors and compressed entries, FP4 + scale for indexer keys.
struct LayerState {
  int64_t head_dim = 0, window = 0;
  KvCodec kv;                       // window vectors and compressed entries
  Fp4Codec index;                   // indexer keys
  std::vector<uint8_t> window_kv;   // [window, kv.bytes()], slot = pos % window
  std::vector<uint8_t> entries;     // [n_entries, kv.bytes()]
  std::vector<uint8_t> index_keys;  // [n_entries, index.bytes()] (ratio 4)
  int64_t n_entries = 0;
  CompressorState comp, index_comp;

  size_t bytes() const;  // cache bytes held (window ring, entries, indexer keys, compressor rows)
};

// State a backend keeps outside the host caches above (the CUDA backend's device buffers).
struct BackendSequence {
  virtual ~BackendSequence() = default;
};

// Move-only: a copy would share (or silently drop) a backend's device state.
struct SequenceState {
  int64_t pos = 0;  // tokens consumed so far
  std::vector<LayerState> layers;          // the CPU backend's caches (empty on other backends)
  std::unique_ptr<BackendSequence> device; // null on the CPU backend
};

// Empty state shaped for the model's main layers.
SequenceState make_sequence_state(const ModelConfig& c);

// Cache bytes a layer of ratio `ratio` adds per token on average (compressed entries and indexer
// keys), and the fixed bytes of its window ring and compressor rows.
struct CacheCost {
  double bytes_per_token = 0;
  size_t fixed_bytes = 0;
};
CacheCost layer_cache_cost(const ModelConfig& c, int64_t ratio);

}  // namespace dsv4
