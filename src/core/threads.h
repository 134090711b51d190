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
  // Splits [0, n) into contiguous ranges and waits. With chunks_per_thread == 1, one range per
  // thread (the caller takes one). With more, min(n, size() * chunks_per_thread) equal ranges
  // handed out in order to whichever thread is free, so a thread slowed down by something
  // else on the machine does not hold the others up. Not reentrant: fn must not call
  // parallel_for.
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn,
                    int chunks_per_thread = 1);

 private:
  void worker(int id);
  std::vector<std::thread> workers_;
  // A job is published by storing job_/n_ and then bumping generation_ (release); workers
  // acquire generation_, run their range and decrement pending_.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t n_ = 0;
  int64_t chunks_ = 0;              // 0: static split; else the number of ranges handed out
  std::atomic<int64_t> next_{0};    // the next range to hand out
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
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
