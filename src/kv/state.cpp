#include "kv/state.h"

namespace dsv4 {

static CompressorState make_comp(int64_t ratio, int64_t out_dim) {
  CompressorState s;
  s.ratio = ratio;
  s.width = (ratio == 4 ? 2 : 1) * out_dim;
  s.cur_a.assign(static_cast<size_t>(ratio * s.width), 0.0f);
  s.cur_s = s.cur_a;
  if (ratio == 4) {
    s.prev_a = s.cur_a;
    s.prev_s = s.cur_a;
  }
  return s;
}

SequenceState make_sequence_state(const ModelConfig& c) {
  SequenceState st;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerState L;
    L.head_dim = c.head_dim;
    L.window = c.window;
    L.kv = KvCodec{c.head_dim, c.rope_dim};
    L.index = Fp4Codec{c.index_dim};
    L.window_kv.assign(static_cast<size_t>(c.window) * L.kv.bytes(), 0);
    int64_t r = c.ratio(l);
    if (r > 0) L.comp = make_comp(r, c.head_dim);
    if (r == 4) L.index_comp = make_comp(r, c.index_dim);
    st.layers.push_back(std::move(L));
  }
  return st;
}

static size_t comp_bytes(const CompressorState& s) {
  return (s.cur_a.size() + s.cur_s.size() + s.prev_a.size() + s.prev_s.size()) * sizeof(float);
}

size_t LayerState::bytes() const {
  return window_kv.size() + entries.size() + index_keys.size() + comp_bytes(comp) + comp_bytes(index_comp);
}

CacheCost layer_cache_cost(const ModelConfig& c, int64_t ratio) {
  const KvCodec kv{c.head_dim, c.rope_dim};
  const Fp4Codec ix{c.index_dim};
  CacheCost cost;
  cost.fixed_bytes = static_cast<size_t>(c.window) * kv.bytes();
  if (ratio > 0) {
    cost.bytes_per_token = static_cast<double>(kv.bytes()) / static_cast<double>(ratio);
    cost.fixed_bytes += comp_bytes(make_comp(ratio, c.head_dim));
  }
  if (ratio == 4) {
    cost.bytes_per_token += static_cast<double>(ix.bytes()) / 4.0;
    cost.fixed_bytes += comp_bytes(make_comp(ratio, c.index_dim));
  }
  return cost;
}

}  // namespace dsv4
