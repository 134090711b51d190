#include "core/threads.h"

#include <algorithm>
#include <chrono>
#include <memory>

namespace dsv4 {

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax() { _mm_pause(); }
#else
static inline void cpu_relax() {}
#endif

// How long an idle worker spins before sleeping: long enough to bridge the gaps between the
// jobs of one forward step, short enough not to burn a core between requests.
static constexpr auto kSpin = std::chrono::microseconds(2000);
static constexpr int kPureSpin = 2000;  // pauses before spinning starts to yield

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

static void run_range(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int id, int parts) {
  int64_t b = n * id / parts, e = n * (id + 1) / parts;
  if (b < e) fn(b, e);
}

static void run_chunks(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int64_t chunks,
                       std::atomic<int64_t>& next) {
  for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) fn(n * c / chunks, n * (c + 1) / chunks);
}

void ThreadPool::worker(int id) {
  uint64_t seen = 0;
  for (;;) {
    // Spin (reading only) for kSpin, checking the clock every 256 pauses, then sleep. Past the
    // first kPureSpin pauses each round also yields, so that on a machine shared with other
    // work the spinning does not keep those processes (or our own threads) off the core.
    uint64_t g = generation_.load(std::memory_order_acquire);
    if (g == seen) {
      auto t0 = std::chrono::steady_clock::now();
      for (int k = 1; (g = generation_.load(std::memory_order_acquire)) == seen && !stop_.load(); ++k) {
        cpu_relax();
        if (k > kPureSpin) std::this_thread::yield();
        if ((k & 255) == 0 && std::chrono::steady_clock::now() - t0 > kSpin) break;
      }
      if (g == seen && !stop_.load()) {
        std::unique_lock<std::mutex> lk(mu_);
        sleepers_.fetch_add(1);
        wake_.wait(lk, [&] { return stop_.load() || generation_.load() != seen; });
        sleepers_.fetch_sub(1);
        g = generation_.load(std::memory_order_acquire);
      }
    }
    if (stop_.load()) return;
    seen = g;
    if (chunks_ > 0) {
      run_chunks(*job_, n_, chunks_, next_);
    } else {
      run_range(*job_, n_, id, size());
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int chunks_per_thread) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    fn(0, n);
    return;
  }
  job_ = &fn;
  n_ = n;
  chunks_ = chunks_per_thread > 1 ? std::min<int64_t>(n, int64_t{size()} * chunks_per_thread) : 0;
  next_.store(0, std::memory_order_relaxed);
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1);  // seq_cst: ordered before the sleepers_ load below
  // A worker counts itself in sleepers_ under mu_ before it re-checks generation_, so taking
  // mu_ here means it either saw the new generation or is waiting and gets this notify.
  if (sleepers_.load() > 0) {
    { std::lock_guard<std::mutex> lk(mu_); }
    wake_.notify_all();
  }
  if (chunks_ > 0) {
    run_chunks(fn, n, chunks_, next_);
  } else {
    run_range(fn, n, 0, size());
  }
  for (int k = 1; pending_.load(std::memory_order_acquire) != 0; ++k) {
    cpu_relax();
    if (k > kPureSpin) std::this_thread::yield();  // a worker may be waiting for this core
  }
}

int default_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

static std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> p;
  return p;
}

ThreadPool& thread_pool() {
  auto& p = pool_slot();
  if (!p) p = std::make_unique<ThreadPool>(default_threads());
  return *p;
}

void set_threads(int n) {
  if (n <= 0) n = default_threads();
  auto& p = pool_slot();
  if (p && p->size() == n) return;
  p = std::make_unique<ThreadPool>(n);
}

}  // namespace dsv4
