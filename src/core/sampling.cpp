#include "core/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace dsv4 {

// The order of operations here is the contract kernels/cuda/sampling.cu's sample_kernel follows
// (double arithmetic, candidates best first, sums from the best candidate on).
int32_t sample_logits(const float* l, int64_t V, const SampleRow& r) {
  if (r.temperature == 0.0f) return static_cast<int32_t>(std::max_element(l, l + V) - l);
  // Candidates sorted by logit (ties to the lower id), cut by top-k.
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  const int64_t k = sample_candidates(r, V);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  idx.resize(static_cast<size_t>(k));

  std::vector<double> prob(idx.size());
  const double mx = l[idx[0]];
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) sum += (prob[i] = std::exp((l[idx[i]] - mx) / r.temperature));
  for (double& p : prob) p /= sum;
  // top-p: the smallest prefix whose mass reaches top_p; min-p: relative to the best token.
  size_t keep = prob.size();
  if (r.top_p < 1.0f) {
    double acc = 0;
    for (size_t i = 0; i < prob.size(); ++i) {
      acc += prob[i];
      if (acc >= r.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (r.min_p > 0.0f)
    while (keep > 1 && prob[keep - 1] < r.min_p * prob[0]) --keep;
  double mass = std::accumulate(prob.begin(), prob.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  double u = r.u * mass;
  for (size_t i = 0; i < keep; ++i) {
    if (u < prob[i]) return idx[i];
    u -= prob[i];
  }
  return idx[keep - 1];
}

}  // namespace dsv4
