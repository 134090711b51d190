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

// The claim word: generation << 32 | per-thread flag << 31 | ranges << 16 | next range.
static constexpr uint64_t kPerThreadBit = uint64_t{1} << 31;
static constexpr int kMaxRanges = (1 << 15) - 1;
static uint32_t claim_gen(uint64_t c) { return static_cast<uint32_t>(c >> 32); }
static int claim_ranges(uint64_t c) { return static_cast<int>((c >> 16) & 0x7fff); }
static int claim_next(uint64_t c) { return static_cast<int>(c & 0xffff); }

static void run_range(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int64_t i, int64_t parts) {
  const int64_t b = n * i / parts, e = n * (i + 1) / parts;
  if (b < e) fn(b, e);
}

void ThreadPool::take_ranges(uint64_t c) {
  for (const uint32_t gen = claim_gen(c); claim_gen(c) == gen;) {
    const int parts = claim_ranges(c), i = claim_next(c);
    if (i >= parts) return;
    // Read before the claim; they belong to c's job if the claim succeeds: that job cannot end,
    // and the next one cannot be published, before range i has been claimed.
    const auto* fn = job_.load(std::memory_order_relaxed);
    const int64_t n = n_.load(std::memory_order_relaxed);
    if (claim_.compare_exchange_weak(c, c + 1, std::memory_order_acquire, std::memory_order_acquire)) {
      run_range(*fn, n, i, parts);
      done_.fetch_add(1, std::memory_order_release);
      c += 1;
    }
    // On failure c holds the current word: another range of this job, or a later job (its
    // generation differs: the caller's loop takes that one up).
  }
}

void ThreadPool::worker(int id) {
  uint32_t seen = 0;  // the generation of the last job this worker looked at
  for (;;) {
    // Spin (reading only) for kSpin, checking the clock every 256 pauses, then sleep. Past the
    // first kPureSpin pauses each round also yields, so that on a machine shared with other
    // work the spinning does not keep those processes (or our own threads) off the core.
    uint64_t c = claim_.load(std::memory_order_acquire);
    if (claim_gen(c) == seen) {
      auto t0 = std::chrono::steady_clock::now();
      for (int k = 1; claim_gen(c = claim_.load(std::memory_order_acquire)) == seen && !stop_.load(); ++k) {
        cpu_relax();
        if (k > kPureSpin) std::this_thread::yield();
        if ((k & 255) == 0 && std::chrono::steady_clock::now() - t0 > kSpin) break;
      }
      if (claim_gen(c) == seen && !stop_.load()) {
        std::unique_lock<std::mutex> lk(mu_);
        sleepers_.fetch_add(1);
        wake_.wait(lk, [&] { return stop_.load() || claim_gen(claim_.load()) != seen; });
        sleepers_.fetch_sub(1);
        c = claim_.load(std::memory_order_acquire);
      }
    }
    if (stop_.load()) return;
    // The newest job (jobs published while this worker was not running ended without it); it
    // is looked at once, so a kOnePerThread range runs once.
    seen = claim_gen(c);
    if (c & kPerThreadBit) {
      // Its range is this worker's own, so the job cannot end (nor its fields change) before it.
      run_range(*job_.load(std::memory_order_relaxed), n_.load(std::memory_order_relaxed), id, claim_ranges(c));
      done_.fetch_add(1, std::memory_order_release);
    } else {
      take_ranges(c);
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int chunks_per_thread) {
  if (n <= 0) return;
  const bool per_thread = chunks_per_thread == kOnePerThread;
  if (workers_.empty() || (n == 1 && !per_thread)) {
    fn(0, n);
    return;
  }
  const int parts = per_thread ? size()
                               : static_cast<int>(std::min<int64_t>({n, int64_t{size()} * std::max(chunks_per_thread, 1), kMaxRanges}));
  // The previous job has ended (its ranges all done, waited for below): nobody reads these now.
  job_.store(&fn, std::memory_order_relaxed);
  n_.store(n, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  if (++generation_ == 0) ++generation_;  // 0 is the workers' "none seen yet"
  const uint64_t c = uint64_t{generation_} << 32 | (per_thread ? kPerThreadBit : 0) | static_cast<uint64_t>(parts) << 16;
  claim_.store(c);  // seq_cst: ordered before the sleepers_ load below
  // A worker counts itself in sleepers_ under mu_ before it re-checks claim_, so taking
  // mu_ here means it either saw the new generation or is waiting and gets this notify.
  if (sleepers_.load() > 0) {
    { std::lock_guard<std::mutex> lk(mu_); }
    wake_.notify_all();
  }
  if (per_thread) {
    run_range(fn, n, 0, parts);
    done_.fetch_add(1, std::memory_order_release);
  } else {
    take_ranges(c);
  }
  for (int k = 1; done_.load(std::memory_order_acquire) != parts; ++k) {
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
