#include "kv/state.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

uint8_t* RowStore::append() {
  const int64_t page = n_ / kRowsPerPage, in_page = n_ % kRowsPerPage;
  if (page == static_cast<int64_t>(pages_.size())) {
    pages_.push_back(std::make_shared<std::vector<uint8_t>>(page_bytes()));
  } else if (pages_[page].use_count() > 1) {
    // Another copy references this page (a fork or a snapshot): its rows below n_ are shared
    // and must not change under it, and rows at or above n_ may be its own.
    pages_[page] = std::make_shared<std::vector<uint8_t>>(*pages_[page]);
  }
  ++n_;
  return pages_[page]->data() + in_page * row_bytes_;
}

void RowStore::truncate(int64_t n) {
  DSV4_CHECK(n >= 0 && n <= n_);
  n_ = n;
  // Pages past the last row are released (the next append starts a fresh one).
  pages_.resize(static_cast<size_t>((n_ + kRowsPerPage - 1) / kRowsPerPage));
}

size_t RowStore::bytes() const { return pages_.size() * page_bytes(); }

CompressorState make_compressor_state(int64_t ratio, int64_t out_dim) {
  CompressorState s;
  const bool overlap = ModelConfig::kind_of_ratio(ratio) == LayerKind::CSA;
  s.ratio = ratio;
  s.width = (overlap ? 2 : 1) * out_dim;
  s.rows = (overlap ? 2 : 1) * ratio + kRewind;
  s.a.assign(static_cast<size_t>(s.rows * s.width), 0.0f);
  s.s = s.a;
  return s;
}

static LayerState make_layer(const ModelConfig& c, int64_t r) {
  LayerState L;
  L.head_dim = c.head_dim;
  L.window = c.window;
  L.ratio = r;
  L.ring = c.window + kRewind;
  L.kv = KvCodec{c.head_dim, c.rope_dim};
  L.index = Fp4Codec{c.index_dim};
  // Only slots that were written are read; the fill makes fresh states compare equal.
  L.window_kv.assign(static_cast<size_t>(L.ring) * L.kv.bytes(), 0);
  L.entries = RowStore(L.kv.bytes());
  L.index_keys = RowStore(L.index.bytes());
  const LayerKind kind = ModelConfig::kind_of_ratio(r);
  if (kind != LayerKind::Window) L.comp = make_compressor_state(r, c.head_dim);
  if (kind == LayerKind::CSA) L.index_comp = make_compressor_state(r, c.index_dim);
  return L;
}

SequenceState make_sequence_state(const ModelConfig& c, bool mtp) {
  SequenceState st;
  for (int64_t l = 0; l < c.n_layers + (mtp ? 1 : 0); ++l) st.layers.push_back(make_layer(c, c.ratio(l)));
  return st;
}

SequenceState fork_host_state(const SequenceState& st) {
  DSV4_CHECK(!st.device);
  SequenceState out;
  out.pos = st.pos;
  out.mtp_pos = st.mtp_pos;
  out.layers = st.layers;  // vectors copy; RowStores share their pages
  return out;
}

void truncate_host_state(SequenceState& st, int64_t n_layers, int64_t pos, Stack stack) {
  const bool mtp = stack == Stack::Mtp;
  int64_t& cur = mtp ? st.mtp_pos : st.pos;
  DSV4_CHECK_MSG(pos >= 0 && pos <= cur && cur - pos <= kRewind,
                 "truncate from " + std::to_string(cur) + " to " + std::to_string(pos));
  const int64_t l0 = mtp ? n_layers : 0, l1 = mtp ? n_layers + 1 : n_layers;
  DSV4_CHECK(static_cast<int64_t>(st.layers.size()) >= l1);
  for (int64_t l = l0; l < l1; ++l) {
    LayerState& L = st.layers[l];
    // The window ring and the compressor rows of positions >= pos are simply overwritten by
    // later positions before anything reads them; entries of blocks that closed at or after
    // pos are dropped.
    if (ModelConfig::kind_of_ratio(L.ratio) != LayerKind::Window) {
      L.entries.truncate(std::min(L.entries.size(), pos / L.ratio));
      L.index_keys.truncate(std::min(L.index_keys.size(), pos / L.ratio));
    }
  }
  cur = pos;
}

static size_t comp_bytes(const CompressorState& s) { return (s.a.size() + s.s.size()) * sizeof(float); }

size_t LayerState::private_bytes() const { return window_kv.size() + comp_bytes(comp) + comp_bytes(index_comp); }

size_t LayerState::bytes() const { return private_bytes() + entries.bytes() + index_keys.bytes(); }

CacheCost layer_cache_cost(const ModelConfig& c, int64_t ratio) {
  const LayerState L = make_layer(c, ratio);
  CacheCost cost;
  cost.fixed_bytes = L.private_bytes();
  const LayerKind kind = ModelConfig::kind_of_ratio(ratio);
  if (kind != LayerKind::Window) cost.bytes_per_token = static_cast<double>(L.kv.bytes()) / static_cast<double>(ratio);
  if (kind == LayerKind::CSA) cost.bytes_per_token += static_cast<double>(L.index.bytes()) / static_cast<double>(ratio);
  return cost;
}

size_t sequence_cache_bytes(const ModelConfig& c, int64_t positions, int64_t mtp_positions) {
  size_t total = 0;
  for (int64_t l = 0; l < c.n_layers + (mtp_positions >= 0 ? 1 : 0); ++l) {
    const LayerState L = make_layer(c, c.ratio(l));
    total += L.private_bytes();
    const LayerKind kind = ModelConfig::kind_of_ratio(L.ratio);
    if (kind == LayerKind::Window) continue;
    const int64_t rows = (l < c.n_layers ? positions : mtp_positions) / L.ratio;  // a partial block: compressor rows
    const size_t pages = static_cast<size_t>((rows + RowStore::kRowsPerPage - 1) / RowStore::kRowsPerPage);
    const size_t page_rows = static_cast<size_t>(RowStore::kRowsPerPage);
    total += pages * page_rows * L.kv.bytes();
    if (kind == LayerKind::CSA) total += pages * page_rows * L.index.bytes();
  }
  return total;
}

}  // namespace dsv4
