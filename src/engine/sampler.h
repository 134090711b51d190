#pragma once
// Token sampling from logits: penalties, greedy, temperature, top-k, top-p, min-p, with a
// seeded platform-independent RNG (same seed, same tokens, on every machine).
#include <cstdint>
#include <vector>

namespace dsv4 {
struct SampleRow;  // core/sampling.h (not included: apps see this header)
}

namespace dsv4 {

struct SamplingParams {
  float temperature = 0.0f;         // 0 = greedy (argmax)
  int64_t top_k = 0;                // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off; keep tokens with p >= min_p * p_max
  float repetition_penalty = 1.0f;  // 1 = off; seen tokens: logit > 0 ? logit / rp : logit * rp
  float presence_penalty = 0.0f;    // 0 = off; seen tokens: logit -= presence_penalty
  float frequency_penalty = 0.0f;   // 0 = off; seen tokens: logit -= frequency_penalty * times seen
  uint64_t seed = 0;
};

// Validates ranges; throws dsv4::Error naming the parameter.
void validate(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // Picks the next token from logits[0..V); `history` (prompt + generated) feeds the penalties.
  int32_t sample(const float* logits, int64_t V, const std::vector<int32_t>& history);
  const SamplingParams& params() const { return p_; }
  // What sample() would use for its next pick, its uniform number drawn now (the draw does not
  // depend on the logits): for a device that picks the token itself (core/sampling.h). The next
  // pick must then be that device's: the RNG has moved on.
  SampleRow row();
  // Whether the penalties change the logits (then the pick needs the history).
  bool penalised() const;
  // How many tokens a pick chooses among over a vocabulary of V: top-k, or all V.
  int64_t candidates(int64_t V) const { return p_.top_k > 0 && p_.top_k < V ? p_.top_k : V; }

 private:
  double uniform();  // [0, 1)
  SamplingParams p_;
  uint64_t rng_[4];  // xoshiro256** state (core/rng.h)
};

}  // namespace dsv4
