#pragma once
// The steps of a forward pass that differ between devices (docs/backend.md). Model::forward
// (model/forward.cpp) is the one description of the pass: embedding, the layer loop with its
// mHC pre/post mixing, norms and residual wiring, and the head. It calls a Backend for every
// step that touches activations; a backend binds the weights it needs once, at creation, in
// its own memory and form, and owns each sequence's cache state.
//
// Granularity: attention (queries, KV write, compressors, indexer top-k, sparse attention,
// grouped output) and MoE (gate, routing, experts, shared expert) are one call each, because
// both make data-dependent decisions (routing, top-k, which blocks close) that a device backend
// must keep on the device; the rest are single ops.
#include <cstdint>
#include <memory>

#include "kv/state.h"
#include "model/weights.h"

namespace dsv4 {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;  // "cpu", "cuda"

  // A fresh sequence whose caches live where this backend computes.
  virtual SequenceState new_sequence() const = 0;
  // The longest chunk one step takes (Model::forward splits longer ones); 0 = no limit.
  virtual int64_t max_chunk() const { return 0; }

  // The activations of one step over T tokens at positions p0.., in backend memory, valid until
  // the step ends.
  struct Step {
    int64_t T = 0, p0 = 0;
    const int32_t* tokens = nullptr;  // [T] token ids (hash routing reads them)
    float* X = nullptr;     // [T, hc, D] residual stream
    float* x = nullptr;     // [T, D] sublayer input; after the layers, the head's input
    float* post = nullptr;  // [T, hc]
    float* comb = nullptr;  // [T, hc, hc]
    float* f = nullptr;     // [T, D] sublayer output
  };
  // Starts a step over tokens[0..T) (host, already checked against the vocabulary) at
  // positions st.pos..: returns the step's buffers with X holding the embedded tokens (hc
  // copies). The CPU backend takes the buffers from the calling thread's arena, so the caller
  // holds an Arena::Scope for the step.
  virtual Step begin(SequenceState& st, const int32_t* tokens, int64_t T) = 0;

  enum class Sub { Attn, Ffn };
  // x, post, comb = hc_pre(layer's mixer for `sub`, X).
  virtual void hc_pre(int64_t layer, Sub sub, Step& s) = 0;
  // x = rmsnorm(x) with the layer's attn_norm / ffn_norm.
  virtual void norm(int64_t layer, Sub sub, Step& s) = 0;
  // f = attention(x); writes this chunk into the layer's caches in st.
  virtual void attention(int64_t layer, SequenceState& st, Step& s) = 0;
  // f = MoE(x) (routed experts + shared expert), tokens as given to begin().
  virtual void moe(int64_t layer, Step& s) = 0;
  // X = post * f + comb X.
  virtual void hc_post(Step& s) = 0;
  // x[0..n) = hc_head(X of tokens t0..t0+n), before the final norm.
  virtual void hc_head(Step& s, int64_t t0, int64_t n) = 0;
  // x[0..n) = rmsnorm(x) with the final norm.
  virtual void final_norm(Step& s, int64_t n) = 0;
  // out (host, [n, vocab]) = head(x[0..n)).
  virtual void logits(Step& s, int64_t n, float* out) = 0;
};

// The CPU reference backend (model/cpu_backend.cpp). `w` must outlive it.
std::unique_ptr<Backend> make_cpu_backend(const ModelWeights& w);

}  // namespace dsv4
