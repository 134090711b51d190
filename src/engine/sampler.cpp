#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "core/rng.h"
#include "core/sampling.h"

namespace dsv4 {

void validate(const SamplingParams& p) {
  auto bad = [](const std::string& what) { throw Error("sampling: " + what); };
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature)) bad("temperature must be >= 0, got " + std::to_string(p.temperature));
  if (p.top_k < 0) bad("top-k must be >= 0, got " + std::to_string(p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1)) bad("top-p must be in (0, 1], got " + std::to_string(p.top_p));
  if (!(p.min_p >= 0 && p.min_p < 1)) bad("min-p must be in [0, 1), got " + std::to_string(p.min_p));
  if (!(p.repetition_penalty > 0) || !std::isfinite(p.repetition_penalty))
    bad("repetition penalty must be > 0, got " + std::to_string(p.repetition_penalty));
  if (!std::isfinite(p.presence_penalty)) bad("presence penalty must be finite");
  if (!std::isfinite(p.frequency_penalty)) bad("frequency penalty must be finite");
}

Sampler::Sampler(const SamplingParams& p) : p_(p) {
  validate(p);
  xoshiro256_seed(rng_, p.seed);
}

double Sampler::uniform() { return xoshiro256_uniform(rng_); }

int32_t Sampler::sample(const float* logits, int64_t V, const std::vector<int32_t>& history) {
  std::vector<float> l(logits, logits + V);
  if (penalised()) {
    std::unordered_map<int32_t, int64_t> seen;
    for (int32_t id : history) ++seen[id];
    for (auto [id, count] : seen) {
      if (id < 0 || id >= V) continue;
      float& v = l[id];
      v = v > 0 ? v / p_.repetition_penalty : v * p_.repetition_penalty;
      v -= p_.presence_penalty;
      v -= p_.frequency_penalty * static_cast<float>(count);
    }
  }
  return sample_logits(l.data(), V, row());
}

SampleRow Sampler::row() {
  SampleRow r;
  r.top_k = p_.top_k;
  r.temperature = p_.temperature;
  r.top_p = p_.top_p;
  r.min_p = p_.min_p;
  if (p_.temperature != 0.0f) r.u = uniform();  // one draw per non-greedy pick, whatever the logits
  return r;
}

bool Sampler::penalised() const {
  return p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
}

}  // namespace dsv4
