// What the CSA indexer's scan costs (kernels/cpu/indexer_scores.h): nq queries of 64 heads x 128
// (V4's indexer) against n FP4 keys in 256-key pages, as the cache holds them; GFLOP/s against
// the FMA peak measured between the rounds (this VM's speed moves by the minute: only figures of
// one run compare). Not a test; docs/perf.md "Session 36" has its figures.
// Usage: indexer_bench [ROUNDS] [N,N,...] [NQ,NQ,...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/formats.h"
#include "core/threads.h"
#include "kernels/cpu/indexer_scores.h"
#include "kv/codec.h"
#include "tools/roofline.h"

using namespace dsv4;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<int64_t> list(const char* s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::atoll(x.c_str()));
  return v;
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const std::vector<int64_t> sizes = list(argc > 2 ? argv[2] : "512,4096,16384,65536");
  const std::vector<int64_t> queries = list(argc > 3 ? argv[3] : "1,16");
  const int64_t H = 64, dI = 128, page = 256;
  const Fp4Codec codec{dI};
  const int64_t rb = static_cast<int64_t>(codec.bytes());
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::printf("threads %d; %lld heads x %lld; ms min / median over %d rounds; FMA peak measured before each size\n",
              thread_pool().size(), static_cast<long long>(H), static_cast<long long>(dI), rounds);
  std::printf("%8s %4s %16s %10s %12s\n", "keys", "nq", "ms", "GFLOP/s", "of FMA peak");
  for (int64_t n : sizes) {
    std::vector<uint8_t> bytes(static_cast<size_t>(n * rb));
    std::vector<float> v(static_cast<size_t>(dI));
    for (int64_t b = 0; b < n; ++b) {
      for (float& x : v) x = nd(g);
      fp4sim(v.data(), v.size(), 32);
      codec.encode(v.data(), bytes.data() + b * rb);
    }
    std::vector<const uint8_t*> pages;
    for (int64_t p = 0; p < n; p += page) pages.push_back(bytes.data() + p * rb);
    const Fp4Keys keys{pages.data(), page, rb};
    const double peak = measure_peak_gflops(3);
    for (int64_t nq : queries) {
      std::vector<float> q(static_cast<size_t>(nq * H * dI)), w(static_cast<size_t>(nq * H)), s(static_cast<size_t>(nq * n));
      for (float& x : q) x = nd(g);
      for (float& x : w) x = nd(g);
      std::vector<double> t;
      for (int r = 0; r < rounds; ++r) {
        const auto t0 = Clock::now();
        indexer_scores(q.data(), w.data(), nq, H, dI, keys, n, s.data(), n);
        t.push_back(ms_since(t0));
      }
      std::sort(t.begin(), t.end());
      const double med = t[t.size() / 2], gf = 2.0 * nq * H * n * dI / med / 1e6;
      std::printf("%8lld %4lld %7.3f / %6.3f %10.1f %11.1f%%\n", static_cast<long long>(n), static_cast<long long>(nq), t[0],
                  med, gf, 100.0 * gf / peak);
    }
  }
}
