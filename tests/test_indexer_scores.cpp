// The indexer's scores from FP4 keys (kernels/cpu/indexer_scores.h) against plain math, and the
// same bits on every ISA, for any number of keys or queries, any page size and thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "core/formats.h"
#include "core/threads.h"
#include "kernels/cpu/indexer_scores.h"
#include "kernels/cpu/qmatmul.h"
#include "kv/codec.h"

using namespace dsv4;

namespace {

std::vector<float> rnd(std::mt19937& g, size_t n, float lo = -2.0f, float hi = 2.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

// n keys as the cache holds them: fp4sim'd vectors in Fp4Codec bytes, `gap` spare bytes after
// each (a stride the kernel must honour), cut into pages of page_rows keys.
struct Keys {
  int64_t dim, rb;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // decoded, for the plain math
  std::vector<const uint8_t*> pages;
  Fp4Keys view(int64_t page_rows) {
    pages.clear();
    const int64_t n = static_cast<int64_t>(values.size()) / dim;
    for (int64_t p = 0; p < std::max<int64_t>(n, 1); p += page_rows) pages.push_back(bytes.data() + p * rb);
    return Fp4Keys{pages.data(), page_rows, rb};
  }
};

Keys make_keys(std::mt19937& g, int64_t n, int64_t dim, int64_t gap = 3) {
  const Fp4Codec codec{dim};
  Keys k{dim, static_cast<int64_t>(codec.bytes()) + gap, {}, {}, {}};
  k.bytes.assign(static_cast<size_t>(n * k.rb), 0xEE);
  k.values.resize(static_cast<size_t>(n * dim));
  for (int64_t b = 0; b < n; ++b) {
    std::vector<float> v = rnd(g, static_cast<size_t>(dim));
    for (float& x : v) x *= std::ldexp(1.0f, static_cast<int>(b % 5) - 2);  // varied block scales
    fp4sim(v.data(), static_cast<size_t>(dim), 32);
    codec.encode(v.data(), k.bytes.data() + b * k.rb);
    codec.decode(k.bytes.data() + b * k.rb, k.values.data() + b * dim);
  }
  // Exactly one copy of the bytes: a kernel reading past the last key reads unmapped heap
  // (AddressSanitizer) rather than a neighbour.
  k.bytes.resize(static_cast<size_t>((n - 1) * k.rb + codec.bytes()));
  k.bytes.shrink_to_fit();
  return k;
}

std::vector<float> scores_on(Isa isa, const std::vector<float>& q, const std::vector<float>& w, int64_t nq, int64_t heads,
                             int64_t dim, const Fp4Keys& keys, int64_t n, int64_t ld) {
  set_isa_override(isa);
  std::vector<float> s(static_cast<size_t>(nq * ld), -7.0f);
  indexer_scores(q.data(), w.data(), nq, heads, dim, keys, n, s.data(), ld);
  clear_isa_override();
  return s;
}

std::vector<Isa> isas() {
  std::vector<Isa> v;
  for (Isa isa : {Isa::Scalar, Isa::AVX2, Isa::AVX512})
    if (isa_supported(isa)) v.push_back(isa);
  return v;
}

}  // namespace

TEST(IndexerScores, MatchesPlainMathOnEveryIsa) {
  std::mt19937 g(11);
  // heads 13 = 8 + 4 + 1 (every head tile of the AVX-512 kernel), 6 = 4 + 1 + 1 (AVX2's); n
  // not a multiple of the strip; dim 64 and 128.
  for (auto [heads, dim, n] : {std::tuple<int64_t, int64_t, int64_t>{13, 128, 75}, {6, 64, 33}, {64, 128, 40}, {1, 32, 1}}) {
    Keys k = make_keys(g, n, dim);
    const int64_t nq = 3, ld = n + 2;
    const std::vector<float> q = rnd(g, static_cast<size_t>(nq * heads * dim)), w = rnd(g, static_cast<size_t>(nq * heads));
    for (Isa isa : isas()) {
      const std::vector<float> s = scores_on(isa, q, w, nq, heads, dim, k.view(1 << 20), n, ld);
      for (int64_t t = 0; t < nq; ++t)
        for (int64_t b = 0; b < ld; ++b) {
          if (b >= n) {
            ASSERT_EQ(s[t * ld + b], -7.0f) << "wrote past n";
            continue;
          }
          double want = 0, mag = 0;
          for (int64_t h = 0; h < heads; ++h) {
            double dot = 0, dmag = 0;
            for (int64_t c = 0; c < dim; ++c) {
              const double p = static_cast<double>(q[(t * heads + h) * dim + c]) * k.values[b * dim + c];
              dot += p, dmag += std::fabs(p);
            }
            want += w[t * heads + h] * std::max(0.0, dot);
            mag += std::fabs(w[t * heads + h]) * dmag;
          }
          // A dim-term chain per dot, then a heads-term chain: a few units of 2^-24 times mag.
          ASSERT_NEAR(s[t * ld + b], want, 1e-6 * mag + 1e-30) << isa_name(isa) << " heads " << heads << " t " << t << " b " << b;
        }
    }
  }
}

TEST(IndexerScores, SameBitsWhateverIsaCountPagesOrThreads) {
  std::mt19937 g(12);
  const int64_t heads = 64, dim = 128, n = 300, nq = 5;
  Keys k = make_keys(g, n, dim);
  const std::vector<float> q = rnd(g, static_cast<size_t>(nq * heads * dim)), w = rnd(g, static_cast<size_t>(nq * heads));
  const std::vector<float> ref = scores_on(Isa::Scalar, q, w, nq, heads, dim, k.view(1 << 20), n, n);
  for (Isa isa : isas()) {
    // All keys on one page, and pages of 32 and 256 keys.
    for (int64_t page_rows : {int64_t{1} << 20, int64_t{32}, int64_t{256}}) {
      const std::vector<float> s = scores_on(isa, q, w, nq, heads, dim, k.view(page_rows), n, n);
      ASSERT_EQ(std::memcmp(s.data(), ref.data(), s.size() * sizeof(float)), 0) << isa_name(isa) << " pages of " << page_rows;
    }
    // Fewer keys (a key's strip partly empty) and each query alone: the same floats.
    for (int64_t m : {1, 31, 32, 33, 257}) {
      const std::vector<float> s = scores_on(isa, q, w, nq, heads, dim, k.view(256), m, n);
      for (int64_t t = 0; t < nq; ++t)
        ASSERT_EQ(std::memcmp(s.data() + t * n, ref.data() + t * n, static_cast<size_t>(m) * sizeof(float)), 0)
            << isa_name(isa) << " n " << m;
    }
    for (int64_t t = 0; t < nq; ++t) {
      const std::vector<float> qt(q.begin() + t * heads * dim, q.begin() + (t + 1) * heads * dim);
      const std::vector<float> wt(w.begin() + t * heads, w.begin() + (t + 1) * heads);
      const std::vector<float> s = scores_on(isa, qt, wt, 1, heads, dim, k.view(32), n, n);
      ASSERT_EQ(std::memcmp(s.data(), ref.data() + t * n, static_cast<size_t>(n) * sizeof(float)), 0) << isa_name(isa) << " query " << t;
    }
  }
  // One thread.
  set_threads(1);
  for (Isa isa : isas()) {
    const std::vector<float> s = scores_on(isa, q, w, nq, heads, dim, k.view(256), n, n);
    EXPECT_EQ(std::memcmp(s.data(), ref.data(), s.size() * sizeof(float)), 0) << isa_name(isa) << " one thread";
  }
  set_threads(0);
}

// A key whose block scale is E8M0's NaN (0xFF) decodes to NaN; its dots are NaN, and relu takes
// NaN (like -0) to +0 on every path, so its score is +0 while its neighbours are unaffected.
TEST(IndexerScores, NanDotsCountAsZero) {
  std::mt19937 g(13);
  const int64_t heads = 9, dim = 64, n = 40;
  Keys k = make_keys(g, n, dim);
  const int64_t bad = 17;
  std::memset(k.bytes.data() + bad * k.rb + dim / 2, 0xFF, static_cast<size_t>(dim / 32));
  const std::vector<float> q = rnd(g, static_cast<size_t>(heads * dim)), w = rnd(g, static_cast<size_t>(heads));
  const std::vector<float> ref = scores_on(Isa::Scalar, q, w, 1, heads, dim, k.view(1 << 20), n, n);
  for (Isa isa : isas()) {
    const std::vector<float> s = scores_on(isa, q, w, 1, heads, dim, k.view(1 << 20), n, n);
    EXPECT_EQ(std::memcmp(s.data(), ref.data(), s.size() * sizeof(float)), 0) << isa_name(isa);
    EXPECT_EQ(std::bit_cast<uint32_t>(s[bad]), 0u) << isa_name(isa);
    for (int64_t b = 0; b < n; ++b) EXPECT_FALSE(std::isnan(s[b])) << isa_name(isa) << " b " << b;
  }
}
