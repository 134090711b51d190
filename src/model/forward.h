#pragma once
// The DeepSeek-V4 forward pass (shared/spec/MODEL.md), float32, on a Backend (model/backend.h):
// the CPU reference backend by default, the CUDA backend (model/cuda_backend.h) when given.
// A call consumes a chunk of tokens at the sequence's next positions and updates its state, so
// prefill in chunks of any size and one-token decode give the same logits as one long forward.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kv/state.h"
#include "model/backend.h"
#include "model/ops.h"
#include "model/weights.h"

namespace dsv4 {

class Model {
 public:
  // The CPU backend.
  explicit Model(ModelWeights weights);
  // The backend `make` builds over the weights (which the Model keeps at a fixed address).
  using MakeBackend = std::function<std::unique_ptr<Backend>(const ModelWeights&)>;
  Model(ModelWeights weights, const MakeBackend& make);

  const ModelConfig& config() const { return w_->cfg; }
  const ModelWeights& weights() const { return *w_; }
  const char* device() const { return backend_->name(); }
  SequenceState new_sequence() const { return backend_->new_sequence(); }

  // Which positions of a chunk get logits: all of them ([T, vocab], scoring) or only the last
  // ([1, vocab], generation: the head is the largest single matrix).
  enum class Logits { All, Last };

  // Feeds tokens[0..T) at positions st.pos.. and advances st.pos by T. Writes logits (host
  // memory) when `logits` is non-null. Throws dsv4::Error for a token id outside the vocabulary.
  // A backend's sequences are not shared between threads: one forward per sequence at a time
  // (and, on CUDA, per Model: its workspace is shared).
  void forward(SequenceState& st, const int32_t* tokens, int64_t T, float* logits, Logits which = Logits::All) const;

 private:
  void step(SequenceState& st, const int32_t* tokens, int64_t T, float* logits, Logits which) const;

  std::unique_ptr<ModelWeights> w_;  // a fixed address for the backend's references
  std::unique_ptr<Backend> backend_;
};

}  // namespace dsv4
