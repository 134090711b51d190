#include "tools/roofline.h"

// GCC 12's intrinsic headers trip -Wuninitialized once inlined (GCC PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>

#include <sys/mman.h>

#include "core/threads.h"
#include "kernels/cpu/qmatmul.h"

namespace dsv4 {

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The read probe takes the faster of two access patterns: one sequential stream per thread, and
// kReadStreams streams per thread (equal parts of the thread's block, 256 bytes from each in
// turn). The GEMV kernels read 3-8 rows at once, each in its own page, and on the session-22
// Xeon that ran 13-45% faster than a single stream (alternating runs: the BF16 head's GEMV at
// 30-36 GB/s against a one-stream probe of 24-32), so one stream alone was no limit; 16 streams
// read at 32-35 GB/s in the same minutes (docs/perf.md "Session 22").
constexpr int kReadStreams = 16;

// Calls chunk(q) for every 64 floats of p[0..n) (n a multiple of 64): in order, or with streams
// in the interleaved order above, then whatever the streams leave over in order. Inlined into
// each ISA's reader so that chunk, which carries that ISA's target, inlines too.
template <class Chunk>
__attribute__((always_inline)) inline void walk(const float* p, size_t n, bool streams, Chunk&& chunk) {
  size_t done = 0;
  if (streams) {
    const size_t per = n / kReadStreams / 64 * 64;
    for (size_t i = 0; i < per; i += 64)
#pragma GCC unroll 16
      for (int k = 0; k < kReadStreams; ++k) chunk(p + k * per + i);
    done = per * kReadStreams;
  }
  for (size_t i = done; i < n; i += 64) chunk(p + i);
}

// Both sum the floats with 4 independent vector accumulators so the loop is load-bound.
__attribute__((target("avx512f"))) float read_avx512(const float* p, size_t n, bool streams) {
  __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
  walk(p, n, streams, [&](const float* q) __attribute__((target("avx512f"))) {
    a = _mm512_add_ps(a, _mm512_load_ps(q));
    b = _mm512_add_ps(b, _mm512_load_ps(q + 16));
    c = _mm512_add_ps(c, _mm512_load_ps(q + 32));
    d = _mm512_add_ps(d, _mm512_load_ps(q + 48));
  });
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
}

__attribute__((target("avx2"))) float read_avx2(const float* p, size_t n, bool streams) {
  __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
  walk(p, n, streams, [&](const float* q) __attribute__((target("avx2"))) {
    for (int h = 0; h < 64; h += 32) {
      a = _mm256_add_ps(a, _mm256_load_ps(q + h));
      b = _mm256_add_ps(b, _mm256_load_ps(q + h + 8));
      c = _mm256_add_ps(c, _mm256_load_ps(q + h + 16));
      d = _mm256_add_ps(d, _mm256_load_ps(q + h + 24));
    }
  });
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  float s = 0;
  for (float v : out) s += v;
  return s;
}

float read_scalar(const float* p, size_t n) {
  float s[8] = {};
  for (size_t i = 0; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += p[i + j];
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

// Scalar (no SIMD): one stream either way.
float read_block(Isa isa, const float* p, size_t n, bool streams) {
  if (isa == Isa::AVX512) return read_avx512(p, n, streams);
  if (isa == Isa::AVX2) return read_avx2(p, n, streams);
  return read_scalar(p, n);
}

// 12 independent FMA chains per thread: enough to cover the FMA latency on both ports.
__attribute__((target("avx512f,fma"))) float fma_avx512(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, a);
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) float fma_avx2(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, a);
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

float fma_scalar(int64_t iters) {
  float acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = static_cast<float>(i);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = acc[i] * 0.999999f + 1e-7f;
  return acc[0] + acc[11];
}

volatile float g_sink;

}  // namespace

double measure_read_bandwidth(size_t bytes, int reps) {
  const size_t n = bytes / sizeof(float);
  // 2 MiB-aligned and advised into huge pages, as the engine reads weights (safetensors.cpp):
  // with 4 KiB pages the probe paid TLB misses the weights do not (one stream: +7-14% with huge
  // pages on the session-22 Xeon).
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t rounded = (n * sizeof(float) + kHuge - 1) / kHuge * kHuge;
  float* buf = static_cast<float*>(std::aligned_alloc(kHuge, rounded));
  if (buf == nullptr) throw std::bad_alloc();
  ::madvise(buf, rounded, MADV_HUGEPAGE);  // advice only: fine if THP is off
  ThreadPool& pool = thread_pool();
  // First touch in parallel so pages are spread like the weights they stand for.
  pool.parallel_for(static_cast<int64_t>(n / 16), [&](int64_t b, int64_t e) {
    std::memset(buf + b * 16, 1, static_cast<size_t>(e - b) * 16 * sizeof(float));
  });
  const Isa isa = active_isa();
  double best = 0;
  for (int r = 0; r < reps; ++r)
    for (bool streams : {false, true}) {
      double t0 = now();
      pool.parallel_for(static_cast<int64_t>(n / 64), [&](int64_t b, int64_t e) {
        g_sink = read_block(isa, buf + b * 64, static_cast<size_t>(e - b) * 64, streams);
      });
      double dt = now() - t0;
      best = std::max(best, static_cast<double>(n / 64 * 64 * sizeof(float)) / dt / 1e9);
    }
  std::free(buf);
  return best;
}

float probe_read_sum(const float* p, size_t n, bool streams) { return read_block(active_isa(), p, n, streams); }

double measure_peak_gflops(int reps) {
  ThreadPool& pool = thread_pool();
  const Isa isa = active_isa();
  const int64_t iters = 20'000'000;
  const double lanes = isa == Isa::AVX512 ? 16 : isa == Isa::AVX2 ? 8 : 1;
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    double t0 = now();
    pool.parallel_for(pool.size(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        g_sink = isa == Isa::AVX512 ? fma_avx512(iters) : isa == Isa::AVX2 ? fma_avx2(iters) : fma_scalar(iters / 16);
    }, ThreadPool::kOnePerThread);  // every core's FMA units, not one core's twice
    double dt = now() - t0;
    const double per_thread = isa == Isa::Scalar ? static_cast<double>(iters / 16) * 12 * 2 : static_cast<double>(iters) * 12 * 2 * lanes;
    best = std::max(best, per_thread * pool.size() / dt / 1e9);
  }
  return best;
}

}  // namespace dsv4
