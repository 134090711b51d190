#include "model/forward.h"

#include <algorithm>
#include <string>

#include "core/arena.h"
#include "core/error.h"

namespace dsv4 {

Model::Model(ModelWeights weights) : Model(std::move(weights), make_cpu_backend) {}

Model::Model(ModelWeights weights, const MakeBackend& make)
    : w_(std::make_unique<ModelWeights>(std::move(weights))), backend_(make(*w_)) {}

void Model::forward(SequenceState& st, const int32_t* tokens, int64_t T, float* logits, Logits which) const {
  const ModelConfig& c = w_->cfg;
  if (T <= 0) return;
  for (int64_t t = 0; t < T; ++t)
    if (tokens[t] < 0 || tokens[t] >= c.vocab)
      throw Error("token id " + std::to_string(tokens[t]) + " at index " + std::to_string(t) + " is outside the vocabulary [0, " +
                  std::to_string(c.vocab) + ")");
  // A backend with a fixed workspace takes a long chunk in pieces (the pass is chunk-invariant).
  const int64_t cap = backend_->max_chunk();
  if (cap <= 0 || T <= cap) return step(st, tokens, T, logits, which);
  for (int64_t t0 = 0; t0 < T; t0 += cap) {
    const int64_t n = std::min(cap, T - t0);
    float* out = nullptr;
    if (logits && which == Logits::All) out = logits + t0 * c.vocab;
    if (logits && which == Logits::Last && t0 + n == T) out = logits;
    step(st, tokens + t0, n, out, which);
  }
}

void Model::step(SequenceState& st, const int32_t* tokens, int64_t T, float* logits, Logits which) const {
  Backend& be = *backend_;
  using Sub = Backend::Sub;
  // Host temporaries of the step (all of the CPU backend's activations) are given back here.
  Arena::Scope scope(thread_arena());
  Backend::Step s = be.begin(st, tokens, T);
  for (int64_t l = 0; l < w_->cfg.n_layers; ++l) {
    be.hc_pre(l, Sub::Attn, s);
    be.norm(l, Sub::Attn, s);
    be.attention(l, st, s);
    be.hc_post(s);

    be.hc_pre(l, Sub::Ffn, s);
    be.norm(l, Sub::Ffn, s);
    be.moe(l, s);
    be.hc_post(s);
  }
  st.pos += T;
  if (!logits) return;

  // hc_head collapses the hc copies, then the final norm and the head; only for the tokens
  // whose logits are wanted.
  const int64_t t0 = which == Logits::Last ? T - 1 : 0, nt = T - t0;
  be.hc_head(s, t0, nt);
  be.final_norm(s, nt);
  be.logits(s, nt, logits);
}

}  // namespace dsv4
