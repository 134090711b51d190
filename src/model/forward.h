#pragma once
// The DeepSeek-V4 forward pass (shared/spec/MODEL.md), float32, on a Backend (model/backend.h),
// for the main model and for the MTP block. A step consumes a chunk of tokens of each of its
// sequences at their next positions and updates their state, so prefill in chunks of any size,
// one-token decode and any batch give the same logits for a sequence.
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/state.h"
#include "model/backend.h"
#include "model/layers.h"
#include "model/rows.h"
#include "model/weights.h"

namespace dsv4 {

// One sequence's part of a step.
struct SeqInput {
  SequenceState* st = nullptr;
  const int32_t* tokens = nullptr;  // [n]: main: the tokens; MTP: the next token of each position
  int64_t n = 0;
  Rows logits = Rows::Last;
  float* logits_out = nullptr;      // host [1 or n, vocab] per `logits`
  float* hidden_out = nullptr;      // host [n, hc*D], the final hc state per row (main only), or null
  const float* hidden_in = nullptr; // MTP: host [n, hc*D], the main model's final hc state per row
  // Host [1 or n] per `logits`: the greedy token (first largest logit) of each logits row, or
  // with `sample` that row's sampled token. With logits_out null the logits stay in backend
  // memory (Backend::argmax / Backend::sample: a device copies back only the ids).
  int32_t* argmax_out = nullptr;
  // Host [1 or n] per `logits`, with argmax_out: each logits row's sampling parameters and drawn
  // number (Sampler::row): argmax_out gets sample_logits(row, sample[r]) instead of the argmax.
  // Each row's candidates must fit Backend::sample_max_candidates (the engine checks).
  const SampleRow* sample = nullptr;
};

class Model {
 public:
  // The backend `make` builds over the weights (which the Model keeps at a fixed address).
  template <class Make>
  Model(ModelWeights weights, Make&& make)
      : w_(std::make_unique<ModelWeights>(std::move(weights))), backend_(make(*w_)) {}

  const ModelConfig& config() const { return w_->cfg; }
  const ModelWeights& weights() const { return *w_; }
  const Backend& backend() const { return *backend_; }
  const char* device() const { return backend_->name(); }
  bool has_mtp() const { return w_->mtp.has_value(); }
  int64_t hidden_size() const { return w_->cfg.hc * w_->cfg.dim; }

  // A parallel run (docs/parallel.md): EP, this process holds only its experts (the loader bound
  // only those) and every MoE layer exchanges expert outputs; TP, it computes its attention
  // groups and head rows and exchanges those. Through shard.comm.
  void set_shard(const Shard& shard) { shard_ = shard; }
  const Shard* shard() const { return shard_.comm ? &shard_ : nullptr; }

  SequenceState new_sequence() const { return backend_->new_sequence(); }
  SequenceState fork(const SequenceState& st) const { return backend_->fork(st); }
  void truncate(SequenceState& st, int64_t pos, Stack stack) const { backend_->truncate(st, pos, stack); }

  // Runs the inputs through `stack` in one step where the backend allows (else one sequence,
  // and chunks of at most its max_rows, at a time), advancing each sequence by its n. The
  // inputs are assumed checked (engine/engine.cpp validates everything before a step): token
  // ids inside the vocabulary, distinct sequences, n > 0, hidden_in given for MTP.
  void step(Stack stack, const std::vector<SeqInput>& in) const;

 private:
  void run(Stack stack, const std::vector<SeqInput>& in) const;
  // out (host, [n, vocab]) = head(s.x[0..n)); TP: each rank's vocabulary rows, gathered.
  void logits(Backend::Step& s, int64_t n, float* out) const;

  std::unique_ptr<ModelWeights> w_;  // a fixed address for the backend's references
  std::unique_ptr<Backend> backend_;
  Shard shard_;
};

}  // namespace dsv4
