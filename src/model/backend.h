#pragma once
// The steps of a forward pass that differ between devices (docs/backend.md). Model
// (model/forward.cpp) is the one description of the pass: embedding, the layer loop with its
// mHC pre/post mixing, norms and residual wiring, and the head, for the main model and for the
// MTP block. It calls a Backend for every step that touches activations; a backend binds the
// weights it needs once, at creation, in its own memory and form, and owns each sequence's
// cache state.
//
// A step covers the tokens of several sequences at once (docs/design.md "Batched steps"): row
// t of every activation belongs to one sequence at one position. Ops over rows (norms, mHC,
// MoE, every projection) run over all rows at once, so each weight is read once per step;
// attention runs per sequence on its own state. Every op computes a row the same way whatever
// else is in the step (canonical summation order), so a sequence's logits do not depend on
// its batch.
//
// Granularity: attention (queries, KV write, compressors, indexer top-k, sparse attention,
// grouped output) and MoE (gate, routing, experts, shared expert) are one call each, because
// both make data-dependent decisions (routing, top-k, which blocks close) that a device backend
// must keep on the device; the rest are single ops.
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/state.h"
#include "model/weights.h"

namespace dsv4 {

// One sequence's rows of a step: rows [t0, t0 + n) at positions p0.., state `st`.
struct StepSeq {
  SequenceState* st = nullptr;
  int64_t t0 = 0, n = 0, p0 = 0;
};

// Which stack a step runs: the main layers, or the MTP block (layer index n_layers, its own
// state in SequenceState::layers[n_layers] and positions in mtp_pos).
enum class Stack { Main, Mtp };

// What the host asks of a step (built by Model, validated by the engine).
struct StepPlan {
  Stack stack = Stack::Main;
  std::vector<int32_t> tokens;   // [T] token ids (MTP: the next token of each position)
  std::vector<int64_t> pos;      // [T] each row's position
  std::vector<StepSeq> seqs;     // disjoint row ranges covering [0, T), in row order
  const float* hidden = nullptr; // MTP: [T, hc*D] the main model's final hc state per row
  int64_t T() const { return static_cast<int64_t>(tokens.size()); }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;  // "cpu", "cuda"

  // A fresh sequence whose caches live where this backend computes (with the MTP block's
  // layer when the model has one).
  virtual SequenceState new_sequence() const = 0;
  // A sequence that continues from `st` (shares what it can; docs/design.md). Throws
  // Error(Unsupported) where the backend cannot.
  virtual SequenceState fork(const SequenceState& st) const = 0;
  // Drops positions [pos, current) of the main layers, or of the MTP block; at most kRewind.
  virtual void truncate(SequenceState& st, int64_t pos, Stack stack) const = 0;

  // The longest chunk one step takes in total rows (the caller splits longer ones); 0 = no limit.
  virtual int64_t max_rows() const { return 0; }
  // Whether one step may hold several sequences; if not, the caller runs them one by one.
  virtual bool batched() const { return true; }

  // The activations of one step, in backend memory, valid until the step ends.
  struct Step {
    const StepPlan* plan = nullptr;
    int64_t T = 0;
    float* X = nullptr;     // [T, hc, D] residual stream
    float* x = nullptr;     // [T, D] sublayer input; after the layers, the head's input
    float* post = nullptr;  // [T, hc]
    float* comb = nullptr;  // [T, hc, hc]
    float* f = nullptr;     // [T, D] sublayer output
  };
  // Starts a step: returns its buffers with X holding the embedded tokens (hc copies; MTP: the
  // block's input from the embedding and plan.hidden). The CPU backend takes the buffers from
  // the calling thread's arena, so the caller holds an Arena::Scope for the step.
  virtual Step begin(const StepPlan& plan) = 0;

  enum class Sub { Attn, Ffn };
  // Layer index l in [0, n_layers]; n_layers is the MTP block.
  // x, post, comb = hc_pre(layer's mixer for `sub`, X).
  virtual void hc_pre(int64_t layer, Sub sub, Step& s) = 0;
  // x = rmsnorm(x) with the layer's attn_norm / ffn_norm.
  virtual void norm(int64_t layer, Sub sub, Step& s) = 0;
  // f = attention(x); writes each sequence's rows into its caches of this layer.
  virtual void attention(int64_t layer, Step& s) = 0;
  // f = MoE(x) (routed experts + shared expert), over all rows; hash layers route by the tokens.
  virtual void moe(int64_t layer, Step& s) = 0;
  // X = post * f + comb X.
  virtual void hc_post(Step& s) = 0;
  // out (host, [rows.size(), hc*D]) = X of the given rows.
  virtual void read_hidden(Step& s, const std::vector<int64_t>& rows, float* out) = 0;
  // x[i] = hc_head(X of rows[i]) with the main model's or the MTP block's hc_head, before the
  // final norm.
  virtual void hc_head(Stack stack, Step& s, const std::vector<int64_t>& rows) = 0;
  // x[0..n) = rmsnorm(x) with the main model's / the MTP block's final norm.
  virtual void final_norm(Stack stack, Step& s, int64_t n) = 0;
  // out (host, [n, vocab]) = head(x[0..n)).
  virtual void logits(Step& s, int64_t n, float* out) = 0;
};

}  // namespace dsv4
