// What a prefill's CSA attention costs per block of 16 queries, two ways, alternating in one
// process (this VM's stage timings move by 2x between runs, so only interleaved figures compare):
// the block's queries scored against the union of their keys in one product (query_key_scores),
// then each query's softmax and weighted sum, vs each query against its own keys, as attend does
// them (keys read through row pointers where they lie).
// Each query reads its window (128 positions) and its top-k (512) of E compressed entries; at
// long contexts the queries' top-k differ and the union grows. The two must give the same bits
// (checked). V4-Flash's sizes (64 heads of 512). Not a test; docs/perf.md "Session 35" has its
// figures. Usage: attention_bench [ROUNDS] [E,E,...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/attention.h"
#include "core/threads.h"

using namespace dsv4;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<float> randv(std::mt19937& g, size_t n) {
  std::normal_distribution<float> d(0.0f, 0.5f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  std::vector<int64_t> sizes = {1024, 2048, 4096, 16384};
  if (argc > 2) {
    sizes.clear();
    std::stringstream ss(argv[2]);
    for (std::string x; std::getline(ss, x, ',');) sizes.push_back(std::atoll(x.c_str()));
  }
  const int64_t B = 16, H = 64, d = 512, W = 128, K = 512;
  std::mt19937 g(7);
  const float scale = 0.044f;
  const std::vector<float> sink(H, 0.0f);
  std::printf("threads %d; per block of %lld queries, ms: min / median over %d rounds, alternating\n",
              thread_pool().size(), static_cast<long long>(B), rounds);
  std::printf("%8s %10s %14s %14s %8s\n", "entries", "union keys", "union", "per query", "ratio");
  for (int64_t E : sizes) {
    // The block's keys: B window positions + the union of the top-k sets, as attend gathers them.
    const std::vector<float> window = randv(g, static_cast<size_t>((W + B) * d)), entries = randv(g, static_cast<size_t>(E * d));
    std::vector<std::vector<int32_t>> top(B);
    std::vector<int32_t> all(static_cast<size_t>(E));
    std::iota(all.begin(), all.end(), 0);
    for (auto& t : top) {
      std::shuffle(all.begin(), all.end(), g);
      t.assign(all.begin(), all.begin() + std::min<int64_t>(K, E));
    }
    std::vector<int32_t> uni;
    for (const auto& t : top) uni.insert(uni.end(), t.begin(), t.end());
    std::sort(uni.begin(), uni.end());
    uni.erase(std::unique(uni.begin(), uni.end()), uni.end());
    std::vector<int32_t> slot(static_cast<size_t>(E), -1);
    const int64_t nwin = W + B - 1, nu = nwin + static_cast<int64_t>(uni.size());
    // The union's keys where they lie, as attend reads them (row pointers, nothing copied).
    std::vector<const float*> ur(static_cast<size_t>(nu));
    for (int64_t j = 0; j < nwin; ++j) ur[j] = window.data() + j * d;
    for (size_t u = 0; u < uni.size(); ++u) {
      slot[uni[u]] = static_cast<int32_t>(nwin + static_cast<int64_t>(u));
      ur[nwin + u] = entries.data() + uni[u] * d;
    }
    const std::vector<float> q = randv(g, static_cast<size_t>(B * H * d));
    std::vector<float> out_a(static_cast<size_t>(B * H * d)), out_b(out_a.size()), sc, p;
    std::vector<const float*> rows;
    const int64_t n = W + std::min(K, E);  // each query's keys: its window (b - W + 1 .. b) and its top-k
    auto own_keys = [&](int64_t b, std::vector<const float*>& kr) {  // in attend's order
      kr.clear();
      for (int64_t j = b; j < b + W; ++j) kr.push_back(ur[j]);
      for (int32_t e : top[b]) kr.push_back(ur[slot[e]]);
    };
    auto csa_union = [&] {
      sc.resize(static_cast<size_t>(nu * B * H));
      query_key_scores(q.data(), B * H, ur.data(), nu, d, sc.data());
      thread_pool().parallel_for(B, [&](int64_t bb, int64_t be) {
        thread_local std::vector<float> pb;
        thread_local std::vector<const float*> kr;
        for (int64_t b = bb; b < be; ++b) {
          own_keys(b, kr);
          pb.resize(static_cast<size_t>(H * n));
          int64_t j = 0;
          auto take = [&](int64_t u) {
            for (int64_t h = 0; h < H; ++h) pb[h * n + j] = sc[(b * H + h) * nu + u];
            ++j;
          };
          for (int64_t k = b; k < b + W; ++k) take(k);
          for (int32_t e : top[b]) take(slot[e]);
          attend_scores(pb.data(), H, kr.data(), n, d, sink.data(), scale, out_a.data() + b * H * d, RunOn::Caller);
        }
      }, static_cast<int>(B));
    };
    auto csa_own = [&] {
      for (int64_t b = 0; b < B; ++b) {
        own_keys(b, rows);
        p.resize(static_cast<size_t>(H * n));
        query_key_scores(q.data() + b * H * d, H, rows.data(), n, d, p.data());
        attend_scores(p.data(), H, rows.data(), n, d, sink.data(), scale, out_b.data() + b * H * d);
      }
    };
    std::vector<double> ta, tb;
    for (int r = 0; r < rounds; ++r) {
      auto t0 = Clock::now();
      csa_union();
      ta.push_back(ms_since(t0));
      t0 = Clock::now();
      csa_own();
      tb.push_back(ms_since(t0));
    }
    if (out_a != out_b) {
      std::fprintf(stderr, "attention_bench: the two ways differ at %lld entries\n", static_cast<long long>(E));
      return 1;
    }
    auto med = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    auto mn = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
    std::printf("%8lld %10lld %6.1f / %5.1f %6.1f / %5.1f %8.2f\n", static_cast<long long>(E), static_cast<long long>(nu), mn(ta),
                med(ta), mn(tb), med(tb), med(ta) / med(tb));
  }
  return 0;
}
