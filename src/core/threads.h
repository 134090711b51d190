#pragma once
// A persistent worker pool: threads are created once and reused by every parallel_for.
// Workers spin for a short while after each job before sleeping, so the many small jobs of a
// decode step (a hundred or more matmuls) start without a futex wake-up each (in a VM a wake-up
// is an inter-processor interrupt and costs tens of microseconds).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsv4 {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Splits [0, n) into contiguous ranges, runs fn on each and waits. The ranges are
  // min(n, size() * chunks_per_thread) equal pieces handed out in order to whichever thread asks
  // first, the caller included: a thread that the machine has not run yet (another process on
  // its core) does not hold the job up, the others take its ranges. The boundaries depend only
  // on n, size() and chunks_per_thread, never on which thread runs a range. With
  // kOnePerThread, exactly size() ranges, range i on thread i (probes that must load every
  // core). Not reentrant: fn must not call parallel_for.
  static constexpr int kOnePerThread = 0;
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn,
                    int chunks_per_thread = 1);

 private:
  void worker(int id);
  // Runs the ranges of the job published in claim word c that are still unclaimed.
  void take_ranges(uint64_t c);
  std::vector<std::thread> workers_;
  // A job: job_ and n_, then claim_, which idle workers watch. claim_ packs the job's
  // generation (32 bits), whether it is kOnePerThread (1), its number of ranges (15) and the
  // next unclaimed range (16). A range is claimed by a CAS that keeps the generation, so a worker
  // that wakes late, after its job was finished without it, cannot take a range of the next one
  // with the old job's fields. done_ counts finished ranges.
  std::atomic<const std::function<void(int64_t, int64_t)>*> job_{nullptr};
  std::atomic<int64_t> n_{0};
  std::atomic<uint64_t> claim_{0};
  std::atomic<int> done_{0};
  uint32_t generation_ = 0;  // the last job's (only the caller of parallel_for touches it)
  std::atomic<bool> stop_{false};
  // Sleeping: workers that spun out wait on wake_; the publisher notifies when sleepers_ > 0.
  std::mutex mu_;
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
};

// The process-wide pool used by the CPU backend. set_threads(0) means "all cores".
ThreadPool& thread_pool();
void set_threads(int n);
int default_threads();

}  // namespace dsv4
