// Sampling: each filter against its definition, seeded determinism, distribution sanity.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/sampling.h"
#include "engine/sampler.h"

using namespace dsv4;

namespace {
std::vector<float> logits_of(std::initializer_list<float> v) { return std::vector<float>(v); }

std::map<int32_t, int> histogram(SamplingParams p, const std::vector<float>& l, int n, std::vector<int32_t> hist = {}) {
  Sampler s(p);
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) h[s.sample(l.data(), static_cast<int64_t>(l.size()), hist)]++;
  return h;
}
}  // namespace

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  Sampler s({});
  auto l = logits_of({0.5f, 2.0f, -1.0f, 2.0f});
  EXPECT_EQ(s.sample(l.data(), 4, {}), 1);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDiffers) {
  SamplingParams p;
  p.temperature = 1.0f;
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[i] = std::sin(static_cast<float>(i));
  auto run = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(l.data(), 50, {}));
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST(Sampler, TemperatureMatchesSoftmax) {
  SamplingParams p;
  p.temperature = 0.5f;
  auto l = logits_of({0.0f, 0.3f, 0.6f});
  auto h = histogram(p, l, 40000);
  double z = std::exp(0.0) + std::exp(0.6) + std::exp(1.2);
  EXPECT_NEAR(h[0] / 40000.0, std::exp(0.0) / z, 0.015);
  EXPECT_NEAR(h[1] / 40000.0, std::exp(0.6) / z, 0.015);
  EXPECT_NEAR(h[2] / 40000.0, std::exp(1.2) / z, 0.015);
}

TEST(Sampler, TopKKeepsOnlyKBest) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  auto h = histogram(p, logits_of({1.0f, 3.0f, 2.9f, 0.0f}), 2000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_GT(h[1], 0);
  EXPECT_GT(h[2], 0);
}

TEST(Sampler, TopPSmallestPrefixReachingMass) {
  // probabilities 0.5, 0.3, 0.2 (log-space logits): top_p 0.7 keeps {0, 1}; 0.5 keeps {0}.
  SamplingParams p;
  p.temperature = 1.0f;
  auto l = logits_of({std::log(0.5f), std::log(0.3f), std::log(0.2f)});
  p.top_p = 0.7f;
  auto h = histogram(p, l, 4000);
  EXPECT_EQ(h.count(2), 0u);
  EXPECT_NEAR(h[0] / 4000.0, 0.5 / 0.8, 0.03);
  p.top_p = 0.5f;
  EXPECT_EQ(histogram(p, l, 500).size(), 1u);
}

TEST(Sampler, MinPRelativeToBest) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.5f;  // keep tokens with p >= 0.5 * p_max
  auto l = logits_of({std::log(0.5f), std::log(0.3f), std::log(0.2f)});
  auto h = histogram(p, l, 4000);
  EXPECT_EQ(h.count(2), 0u);
  EXPECT_GT(h[1], 0);
}

TEST(Sampler, RepetitionAndPresencePenalties) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  auto l = logits_of({1.0f, 1.5f, -0.5f});
  EXPECT_EQ(s.sample(l.data(), 3, {1}), 0);  // 1.5 / 2 = 0.75 < 1.0
  SamplingParams q;
  q.presence_penalty = 0.6f;
  Sampler t(q);
  EXPECT_EQ(t.sample(l.data(), 3, {1, 1, 1}), 0);  // 1.5 - 0.6 = 0.9 < 1.0
  auto neg = logits_of({-1.0f, -1.2f});
  Sampler u(p);
  EXPECT_EQ(u.sample(neg.data(), 2, {0}), 1);  // -1 * 2 = -2 < -1.2
  // Frequency: the penalty grows with the count (presence would not tell 1 from 3).
  SamplingParams f;
  f.frequency_penalty = 0.2f;
  Sampler w(f);
  EXPECT_EQ(w.sample(l.data(), 3, {1}), 1);        // 1.5 - 0.2 = 1.3 > 1.0
  EXPECT_EQ(w.sample(l.data(), 3, {1, 1, 1}), 0);  // 1.5 - 0.6 = 0.9 < 1.0
}

TEST(Sampler, RejectsBadParameters) {
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.temperature = -1.0f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.min_p = 1.0f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.top_k = -2;
  EXPECT_THROW(Sampler{p}, Error);
}

// A device pick (core/sampling.h: the row's parameters with the uniform number drawn by row(),
// then sample_logits where the logits are) gives the token sample() gives with the same seed, pick
// after pick: the draws do not depend on the logits, so the two samplers stay in step.
TEST(Sampler, RowThenSampleLogitsEqualsSample) {
  const std::vector<SamplingParams> params = {
      {}, {.temperature = 1.0f}, {.temperature = 0.7f, .top_p = 0.9f}, {.temperature = 1.2f, .top_k = 5, .min_p = 0.1f}};
  for (const SamplingParams& base : params)
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      SamplingParams p = base;
      p.seed = seed;
      Sampler a(p), b(p);
      for (int i = 0; i < 40; ++i) {
        std::vector<float> l(64);
        for (int j = 0; j < 64; ++j) l[j] = std::sin(static_cast<float>(j * (i + 3) + static_cast<int>(seed)));
        EXPECT_EQ(a.sample(l.data(), 64, {}), sample_logits(l.data(), 64, b.row())) << "seed " << seed << ", pick " << i;
      }
    }
  EXPECT_FALSE(Sampler({}).penalised());
  EXPECT_TRUE(Sampler({.frequency_penalty = 0.5f}).penalised());
}

namespace {
// sample_logits as first written (core/sampling.h's contract): every candidate through
// std::partial_sort with the comparator, then the same arithmetic.
int32_t sample_reference(const float* l, int64_t V, const SampleRow& r) {
  if (r.temperature == 0.0f) return static_cast<int32_t>(std::max_element(l, l + V) - l);
  std::vector<int32_t> idx(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) idx[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  auto by_logit = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  const int64_t k = sample_candidates(r, V);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  idx.resize(static_cast<size_t>(k));
  std::vector<double> prob(idx.size());
  const double mx = l[idx[0]];
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) sum += (prob[i] = std::exp((l[idx[i]] - mx) / r.temperature));
  for (double& p : prob) p /= sum;
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
  double mass = 0;
  for (size_t i = 0; i < keep; ++i) mass += prob[i];
  double u = r.u * mass;
  for (size_t i = 0; i < keep; ++i) {
    if (u < prob[i]) return idx[i];
    u -= prob[i];
  }
  return idx[keep - 1];
}

// Logits with many ties (steps of 1/4), both signed zeros and some -inf: what the order's rules
// are about.
std::vector<float> tied_logits(int64_t V, uint32_t seed) {
  std::vector<float> l(static_cast<size_t>(V));
  uint32_t s = seed;
  for (float& x : l) {
    s = s * 1664525u + 1013904223u;
    const int q = static_cast<int>(s >> 24) % 41 - 20;
    x = q == 0 ? ((s >> 8 & 1) ? -0.0f : 0.0f) : q == -20 ? -INFINITY : 0.25f * static_cast<float>(q);
  }
  return l;
}
}  // namespace

// The candidates' order itself, read out position by position: at a temperature of 1e30 every
// finite candidate weighs exactly 1, so u = (j + 1/2) / n picks the j-th. Sizes on both sides of
// the radix sort's threshold (core/sampling.cpp) and the model's vocabulary.
TEST(SampleLogits, CandidatesInTheComparatorsOrderAtEverySize) {
  for (int64_t V : {100, 2047, 2048, 2049, 6000, 129280}) {
    const std::vector<float> l = tied_logits(V, static_cast<uint32_t>(V));
    std::vector<int32_t> order(static_cast<size_t>(V));
    for (int64_t i = 0; i < V; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (int64_t top_k : {int64_t{0}, int64_t{2048}, V - 1}) {
      const int64_t k = sample_candidates({.top_k = top_k}, V);
      int64_t finite = 0;
      while (finite < k && std::isfinite(l[order[static_cast<size_t>(finite)]])) ++finite;
      ASSERT_GT(finite, 0);
      const int64_t step = std::max<int64_t>(1, finite / 300);
      for (int64_t j = 0; j < finite; j += (j < 40 || j > finite - 40) ? 1 : step) {
        const SampleRow r{.u = (static_cast<double>(j) + 0.5) / static_cast<double>(finite), .top_k = top_k, .temperature = 1e30f};
        ASSERT_EQ(sample_logits(l.data(), V, r), order[static_cast<size_t>(j)]) << "V " << V << ", top_k " << top_k << ", position " << j;
      }
    }
  }
}

// NaN logits come last on both paths (as the CUDA kernels' `beats` has it): a top-k of the finite
// candidates never picks one, and the order before them is the comparator's.
TEST(SampleLogits, NanCandidatesComeLast) {
  for (int64_t V : {100, 3000}) {
    std::vector<float> l = tied_logits(V, 5);
    for (int64_t i : {int64_t{0}, V / 3, V - 1}) l[static_cast<size_t>(i)] = std::nanf("");
    std::vector<int32_t> order;
    for (int64_t i = 0; i < V; ++i)
      if (!std::isnan(l[static_cast<size_t>(i)])) order.push_back(static_cast<int32_t>(i));
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    int64_t finite = 0;
    while (finite < static_cast<int64_t>(order.size()) && std::isfinite(l[order[static_cast<size_t>(finite)]])) ++finite;
    const int64_t top_k = V - 3;  // every candidate but the three NaNs; below or above the radix threshold
    for (int64_t j = 0; j < finite; ++j) {
      const SampleRow r{.u = (static_cast<double>(j) + 0.5) / static_cast<double>(finite), .top_k = top_k, .temperature = 1e30f};
      ASSERT_EQ(sample_logits(l.data(), V, r), order[static_cast<size_t>(j)]) << "V " << V << ", position " << j;
    }
  }
}

// The whole pick equals the partial_sort definition, over the parameters' ranges.
TEST(SampleLogits, EqualsThePartialSortDefinition) {
  int checked = 0;
  for (int64_t V : {300, 5000, 129280}) {
    for (uint32_t seed = 1; seed <= (V > 100000 ? 1u : 6u); ++seed) {
      std::vector<float> l = tied_logits(V, seed * 7919u);
      for (float& x : l) x *= 1.0f + 0.01f * static_cast<float>(seed);  // other spreads
      for (int64_t top_k : {int64_t{0}, int64_t{1}, int64_t{40}, int64_t{3000}, V})
        for (float top_p : {1.0f, 0.9f, 0.3f})
          for (float min_p : {0.0f, 0.05f}) {
            const double u = std::fmod(0.1234567 * static_cast<double>(seed + checked), 1.0);
            const SampleRow r{.u = u, .top_k = top_k, .temperature = 0.5f + 0.25f * static_cast<float>(seed % 4), .top_p = top_p, .min_p = min_p};
            ASSERT_EQ(sample_logits(l.data(), V, r), sample_reference(l.data(), V, r))
                << "V " << V << ", seed " << seed << ", top_k " << top_k << ", top_p " << top_p << ", min_p " << min_p;
            ++checked;
          }
    }
  }
}
