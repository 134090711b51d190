#pragma once
// The data-dependent half of sampling (engine/sampler.h): from a row of (penalised) logits and one
// uniform number drawn beforehand, the token temperature / top-k / top-p / min-p pick. Split out so
// that the CPU sampler, a backend's host fallback and the CUDA kernel that ports it
// (kernels/cuda/sampling.cu) do the same operations in the same order: the sampler's RNG draws
// `u` without looking at the logits, so the draw can happen before the logits exist (on the host
// while the device computes them).
#include <cstdint>

namespace dsv4 {

// One row's parameters. Laid out for a device upload (32 bytes, no padding between fields).
struct SampleRow {
  double u = 0;           // uniform in [0, 1), used when temperature > 0
  int64_t top_k = 0;      // 0 = off
  float temperature = 0;  // 0 = greedy: the first largest logit
  float top_p = 1.0f;     // 1 = off
  float min_p = 0.0f;     // 0 = off
  float pad_ = 0;
};
static_assert(sizeof(SampleRow) == 32);

// The candidates a row's pick sorts: top_k, or all V when top_k is 0.
inline int64_t sample_candidates(const SampleRow& r, int64_t V) { return r.top_k > 0 && r.top_k < V ? r.top_k : V; }

// The token picked from l[0..V) (see engine/sampler.cpp for the rules).
int32_t sample_logits(const float* l, int64_t V, const SampleRow& r);

}  // namespace dsv4
