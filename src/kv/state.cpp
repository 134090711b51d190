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
    L.window_kv.assign(static_cast<size_t>(c.window * c.head_dim), 0.0f);
    int64_t r = c.ratio(l);
    if (r > 0) L.comp = make_comp(r, c.head_dim);
    if (r == 4) L.index_comp = make_comp(r, c.index_dim);
    st.layers.push_back(std::move(L));
  }
  return st;
}

}  // namespace dsv4
