#include "core/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/rank_key.h"

namespace dsv4 {

namespace {

// Candidates best first in core/rank_key.h's order: logit descending, ties to the lower id,
// NaN last. A small k takes std::partial_sort (about V comparisons). A large one -- every
// candidate, when top_k is off, which is the default -- takes an LSD radix sort of the logits'
// bits: partial_sort was a heap sort of the whole vocabulary there, 26 ms a token at V = 129280
// (the model's step is ~90 ms). Both give the one order the comparator defines (test_sampler.cpp
// compares them).
constexpr int64_t kRadixFrom = 2048;

// idx = the first k candidates in that order.
void sort_candidates(const float* l, int64_t V, int64_t k, std::vector<int32_t>& idx) {
  if (k < kRadixFrom) {
    idx.resize(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    // The radix sort's key, so that NaN goes last here too (a float comparator is no order with NaN).
    auto by_logit = [&](int32_t a, int32_t b) {
      const uint32_t ka = rank_key(l[a]), kb = rank_key(l[b]);
      return ka < kb || (ka == kb && a < b);
    };
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
    idx.resize(static_cast<size_t>(k));
    return;
  }
  // (key << 32 | id): three stable passes of 11 key bits from id order; equal keys keep their
  // ids ascending.
  constexpr int kBits = 11, kPasses = 3, kBuckets = 1 << kBits;
  thread_local std::vector<uint64_t> a, b;
  thread_local std::vector<uint32_t> count;
  a.resize(static_cast<size_t>(V));
  b.resize(static_cast<size_t>(V));
  count.assign(kPasses * kBuckets, 0);
  auto digit = [](uint64_t e, int d) { return static_cast<uint32_t>(e >> (32 + kBits * d)) & (kBuckets - 1); };
  for (int64_t i = 0; i < V; ++i) {
    const uint64_t e = static_cast<uint64_t>(rank_key(l[i])) << 32 | static_cast<uint32_t>(i);
    a[static_cast<size_t>(i)] = e;
    for (int d = 0; d < kPasses; ++d) ++count[d * kBuckets + digit(e, d)];
  }
  for (int d = 0; d < kPasses; ++d) {
    uint32_t* at = &count[d * kBuckets];
    if (at[digit(a[0], d)] == static_cast<uint32_t>(V)) continue;  // one digit value: the order stays
    uint32_t sum = 0;
    for (int v = 0; v < kBuckets; ++v) {
      const uint32_t c = at[v];
      at[v] = sum;
      sum += c;
    }
    for (int64_t i = 0; i < V; ++i) {
      const uint64_t e = a[static_cast<size_t>(i)];
      b[at[digit(e, d)]++] = e;
    }
    a.swap(b);
  }
  idx.resize(static_cast<size_t>(k));  // (from k: no vocabulary-sized fill each pick)
  for (int64_t i = 0; i < k; ++i) idx[static_cast<size_t>(i)] = static_cast<int32_t>(a[static_cast<size_t>(i)]);
}

}  // namespace

// The order of operations here is the contract kernels/cuda/sampling.cu's sample_kernel follows
// (double arithmetic, candidates best first, sums from the best candidate on).
int32_t sample_logits(const float* l, int64_t V, const SampleRow& r) {
  if (r.temperature == 0.0f) return static_cast<int32_t>(std::max_element(l, l + V) - l);
  // Candidates sorted by logit (ties to the lower id), cut by top-k. Buffers kept per thread:
  // a vocabulary's worth each, which malloc would otherwise map and fault in every token.
  thread_local std::vector<int32_t> idx;
  thread_local std::vector<double> prob;
  const int64_t k = sample_candidates(r, V);
  sort_candidates(l, V, k, idx);
  prob.resize(idx.size());

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
