#pragma once
// Per-sequence decoding state: everything a later chunk needs from earlier positions, kept so
// that the last kRewind positions can be dropped cheaply (speculative decoding rejects drafted
// tokens every step) and a sequence can be forked without copying its long-lived rows.
// Starts empty for every sequence (no leakage between prompts).
//
// Layout per layer (docs/design.md "Sequence state"):
// - window ring: the KV vectors of the last window + kRewind positions, slot = pos % ring;
// - compressed entries and indexer keys: append-only rows in shared pages (RowStore), so a fork
//   shares them and a truncate only lowers a count;
// - compressor rows (a = wkv.x, s = wgate.x + ape) of the last (CSA: 2) ratio + kRewind
//   positions, slot = pos % rows: the open block, CSA's previous block, and the slack a rewind
//   needs to reopen a block that closed within the last kRewind positions.
#include <cstdint>
#include <memory>
#include <vector>

#include "io/config.h"
#include "kv/codec.h"

namespace dsv4 {

// Positions a truncate may drop without recomputing anything.
constexpr int64_t kRewind = 16;

// Append-only rows of `row_bytes` bytes in pages of kRowsPerPage rows. Copies share pages; an
// append into a shared page copies that one page first (copy on write), so rows [0, size) of
// every copy stay what they were when it was made.
class RowStore {
 public:
  static constexpr int64_t kRowsPerPage = 256;
  RowStore() = default;
  explicit RowStore(size_t row_bytes) : row_bytes_(row_bytes) {}

  int64_t size() const { return n_; }
  size_t row_bytes() const { return row_bytes_; }
  const uint8_t* row(int64_t i) const { return pages_[i / kRowsPerPage]->data() + (i % kRowsPerPage) * row_bytes_; }
  uint8_t* append();             // a new last row, contents unspecified
  void truncate(int64_t n);      // keeps rows [0, n)
  size_t bytes() const;          // bytes of the pages this store references
  size_t page_bytes() const { return static_cast<size_t>(kRowsPerPage) * row_bytes_; }
  int64_t pages() const { return static_cast<int64_t>(pages_.size()); }

 private:
  size_t row_bytes_ = 0;
  int64_t n_ = 0;
  std::vector<std::shared_ptr<std::vector<uint8_t>>> pages_;
};

// A compressor's input rows for the positions it may still pool (see the file comment).
struct CompressorState {
  int64_t ratio = 0, width = 0;  // width = coff * out_dim
  int64_t rows = 0;              // ring length
  std::vector<float> a, s;       // [rows, width], row of position p at p % rows

  float* a_row(int64_t pos) { return a.data() + (pos % rows) * width; }
  float* s_row(int64_t pos) { return s.data() + (pos % rows) * width; }
  const float* a_row(int64_t pos) const { return a.data() + (pos % rows) * width; }
  const float* s_row(int64_t pos) const { return s.data() + (pos % rows) * width; }
};

// Cached vectors are kept in their compact form (kv/codec.h): FP8 + scale for the non-RoPE part
// of KV vectors and compressed entries, FP4 + scale for indexer keys.
struct LayerState {
  int64_t head_dim = 0, window = 0, ratio = 0;
  int64_t ring = 0;                 // window ring slots: window + kRewind
  KvCodec kv;                       // window vectors and compressed entries
  Fp4Codec index;                   // indexer keys
  std::vector<uint8_t> window_kv;   // [ring, kv.bytes()], slot = pos % ring
  RowStore entries;                 // compressed entries (kv codec)
  RowStore index_keys;              // indexer keys (CSA)
  CompressorState comp, index_comp;

  const uint8_t* window_slot(int64_t pos) const { return window_kv.data() + (pos % ring) * kv.bytes(); }
  uint8_t* window_slot(int64_t pos) { return window_kv.data() + (pos % ring) * kv.bytes(); }
  size_t bytes() const;           // cache bytes referenced (ring, entry pages, compressor rows)
  size_t private_bytes() const;   // the part a fork copies: ring and compressor rows
};

// State a backend keeps outside the host caches above (the CUDA backend's device buffers).
struct BackendSequence {
  virtual ~BackendSequence() = default;
};

// Which stack a step runs (or a rewind drops): the main layers, or the MTP block (layer index
// n_layers, its own state in SequenceState::layers[n_layers] and positions in mtp_pos).
enum class Stack { Main, Mtp };

// Move-only: a copy would share (or silently drop) a backend's device state; forks go through
// the backend (Backend::fork).
struct SequenceState {
  int64_t pos = 0;      // main-model tokens consumed
  int64_t mtp_pos = 0;  // MTP block positions consumed (its state is layers[n_layers])
  std::vector<LayerState> layers;          // the CPU backend's caches (empty on other backends)
  std::unique_ptr<BackendSequence> device; // null on the CPU backend
};

// An empty compressor state for blocks of `ratio` positions of out_dim-wide entries.
CompressorState make_compressor_state(int64_t ratio, int64_t out_dim);

// Empty state shaped for the model's main layers, plus the MTP block's layer when `mtp`.
SequenceState make_sequence_state(const ModelConfig& c, bool mtp);

// Host-cache operations of the CPU layout above.
// A copy that shares the entry pages: costs the window rings and compressor rows.
SequenceState fork_host_state(const SequenceState& st);
// Drops main positions [pos, st.pos) (layers [0, n_layers)) or MTP positions [pos, st.mtp_pos)
// (layer n_layers). Requires the drop to be at most kRewind positions (DSV4_CHECK).
void truncate_host_state(SequenceState& st, int64_t n_layers, int64_t pos, Stack stack);

// Cache bytes a layer of ratio `ratio` adds per token on average (compressed entries and indexer
// keys), and the fixed bytes of its window ring and compressor rows.
struct CacheCost {
  double bytes_per_token = 0;
  size_t fixed_bytes = 0;
};
CacheCost layer_cache_cost(const ModelConfig& c, int64_t ratio);

// The most host-cache bytes a sequence holding `positions` main-model positions can reference
// (every layer's ring and compressor rows plus whole pages of entries and indexer keys), plus
// the MTP block's layer holding `mtp_positions` (-1: the state has no MTP layer). Forks share
// pages, so for them it is an upper bound.
size_t sequence_cache_bytes(const ModelConfig& c, int64_t positions, int64_t mtp_positions);

}  // namespace dsv4
