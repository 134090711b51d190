#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "core/error.h"

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

static uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Sampler::Sampler(const SamplingParams& p) : p_(p) {
  validate(p);
  uint64_t x = p.seed;
  for (auto& s : s_) s = splitmix(x);
}

double Sampler::uniform() {  // xoshiro256**
  auto rotl = [](uint64_t v, int k) { return (v << k) | (v >> (64 - k)); };
  const uint64_t r = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return static_cast<double>(r >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(const float* logits, int64_t V, const std::vector<int32_t>& history) {
  std::vector<float> l(logits, logits + V);
  if (p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
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
  if (p_.temperature == 0.0f) return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());

  // Candidates sorted by logit (ties to the lower id), cut by top-k.
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  int64_t k = p_.top_k > 0 ? std::min(p_.top_k, V) : V;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  idx.resize(static_cast<size_t>(k));

  std::vector<double> prob(idx.size());
  const double mx = l[idx[0]];
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) sum += (prob[i] = std::exp((l[idx[i]] - mx) / p_.temperature));
  for (double& p : prob) p /= sum;
  // top-p: the smallest prefix whose mass reaches top_p; min-p: relative to the best token.
  size_t keep = prob.size();
  if (p_.top_p < 1.0f) {
    double acc = 0;
    for (size_t i = 0; i < prob.size(); ++i) {
      acc += prob[i];
      if (acc >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p_.min_p > 0.0f)
    while (keep > 1 && prob[keep - 1] < p_.min_p * prob[0]) --keep;
  double mass = std::accumulate(prob.begin(), prob.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  double u = uniform() * mass;
  for (size_t i = 0; i < keep; ++i) {
    if (u < prob[i]) return idx[i];
    u -= prob[i];
  }
  return idx[keep - 1];
}

}  // namespace dsv4
