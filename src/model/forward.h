#pragma once
// The DeepSeek-V4 forward pass (shared/spec/MODEL.md) on the CPU reference backend, float32.
// A call consumes a chunk of tokens at the sequence's next positions and updates its state, so
// prefill in chunks of any size and one-token decode give the same logits as one long forward.
#include <cstdint>
#include <vector>

#include "kv/state.h"
#include "model/ops.h"
#include "model/weights.h"

namespace dsv4 {

class Model {
 public:
  explicit Model(ModelWeights weights);

  const ModelConfig& config() const { return w_.cfg; }
  const ModelWeights& weights() const { return w_; }
  SequenceState new_sequence() const { return make_sequence_state(w_.cfg); }

  // Which positions of a chunk get logits: all of them ([T, vocab], scoring) or only the last
  // ([1, vocab], generation: the head is the largest single matrix).
  enum class Logits { All, Last };

  // Feeds tokens[0..T) at positions st.pos.. and advances st.pos by T. Writes logits when
  // `logits` is non-null. Throws dsv4::Error for a token id outside the vocabulary.
  void forward(SequenceState& st, const int32_t* tokens, int64_t T, float* logits, Logits which = Logits::All) const;

 private:
  void block(int64_t l, const LayerW& L, LayerState& ls, float* X, const int32_t* tokens, int64_t T, int64_t p0) const;
  void attention(const LayerW& L, const RopeTable& rope, LayerState& ls, const float* x, int64_t T, int64_t p0, float* out) const;
  void moe(const LayerW& L, const float* x, const int32_t* tokens, int64_t T, float* out) const;

  ModelWeights w_;
  std::vector<RopeTable> rope_;  // one per main layer
};

}  // namespace dsv4
