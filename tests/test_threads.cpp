// The persistent pool: every index of [0, n) is handed out exactly once, in contiguous ranges,
// for both the static and the dynamic split, across many back-to-back jobs (workers spinning)
// and after pauses long enough for the workers to fall asleep. And errors that cross threads.
#include <gtest/gtest.h>

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/threads.h"

using namespace dsv4;

namespace {

// Runs one job and checks the coverage: each index once, ranges non-empty and in bounds.
void check_cover(ThreadPool& pool, int64_t n, int chunks_per_thread) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<int> calls{0}, bad{0};
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        if (!(0 <= b && b < e && e <= n)) bad.fetch_add(1);
        for (int64_t i = b; i < e && i < n; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        calls.fetch_add(1);
      },
      chunks_per_thread);
  ASSERT_EQ(bad.load(), 0) << "n " << n;
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i << " of " << n;
  if (chunks_per_thread <= 1) EXPECT_LE(calls.load(), pool.size());
  else EXPECT_LE(calls.load(), pool.size() * chunks_per_thread);
}

}  // namespace

TEST(ThreadPool, EveryIndexOnceBackToBack) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 300; ++rep)
      for (int cpt : {1, 8, ThreadPool::kOnePerThread}) check_cover(pool, 1 + (rep * 37) % 101, cpt);
  }
}

TEST(ThreadPool, WakesSleepingWorkers) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 4; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin: workers sleep
    check_cover(pool, 1000, rep % 3 == 0 ? 1 : rep % 3 == 1 ? 8 : ThreadPool::kOnePerThread);
  }
}

// kOnePerThread gives each thread one range, so a job of size() units runs one unit on every
// thread (the FMA-peak probe relies on it).
TEST(ThreadPool, OneRangePerThread) {
  ThreadPool pool(4);
  std::atomic<int> calls{0};
  std::vector<std::thread::id> ids(4);
  pool.parallel_for(4, [&](int64_t b, int64_t e) {
    EXPECT_EQ(e - b, 1);
    ids[static_cast<size_t>(b)] = std::this_thread::get_id();
    calls.fetch_add(1);
  }, ThreadPool::kOnePerThread);
  EXPECT_EQ(calls.load(), 4);
  for (int i = 0; i < 4; ++i)
    for (int j = i + 1; j < 4; ++j) EXPECT_NE(ids[i], ids[j]);
}

namespace {
std::atomic<int> g_held{0};  // 1 while hold_thread runs, 2 once it has returned
void hold_thread(int) {
  g_held.store(1);
  timespec ts{0, 400'000'000};
  nanosleep(&ts, nullptr);
  g_held.store(2);
}
}  // namespace

// A worker that the machine does not run (here: held in a signal handler for 400 ms; on a
// shared machine, another process on its core) holds no job up: the other threads take its
// ranges. Before, every job waited for every worker to check in, and tests beside each other
// under ctest -j2 ran 3-4x slower than alone.
TEST(ThreadPool, AThreadThatDoesNotRunHoldsNoJobUp) {
  ThreadPool pool(3);
  std::vector<pthread_t> workers(3);
  pool.parallel_for(3, [&](int64_t b, int64_t) { workers[static_cast<size_t>(b)] = pthread_self(); }, ThreadPool::kOnePerThread);
  struct sigaction sa {}, old{};
  sa.sa_handler = hold_thread;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  g_held.store(0);
  ASSERT_EQ(pthread_kill(workers[2], SIGUSR1), 0);
  while (g_held.load() == 0) std::this_thread::yield();
  for (int rep = 0; rep < 200; ++rep) check_cover(pool, 1 + rep % 64, 1 + rep % 8);
  EXPECT_EQ(g_held.load(), 1) << "the jobs waited for the held worker";
  while (g_held.load() != 2) std::this_thread::yield();
  check_cover(pool, 1000, 1);  // and it takes part again
  sigaction(SIGUSR1, &old, nullptr);
}

// A copy of an Error owns its text (core/error.h): threads holding copies share no string.
// std::runtime_error's own copies share one, with the same what() pointer.
TEST(ErrorCopies, OwnTheirText) {
  const Error a("the body is not valid JSON", ErrorKind::ResourceExhausted);
  Error b = a;
  EXPECT_NE(a.what(), b.what());
  EXPECT_STREQ(a.what(), b.what());
  EXPECT_EQ(b.kind, ErrorKind::ResourceExhausted);
  Error c("another");
  c = a;
  EXPECT_NE(a.what(), c.what());
  EXPECT_STREQ(a.what(), c.what());
  EXPECT_EQ(c.kind, ErrorKind::ResourceExhausted);
  // As a failed job's event travels: made in one thread, kept in a slot, read in another after
  // the maker's original is gone.
  std::optional<Error> slot;
  std::mutex m;
  std::thread maker([&] {
    const Error e("server shutting down", ErrorKind::Internal);
    std::lock_guard<std::mutex> lock(m);
    slot = e;
  });
  maker.join();
  std::thread reader([&] {
    std::lock_guard<std::mutex> lock(m);
    EXPECT_STREQ(slot->what(), "server shutting down");
    slot.reset();
  });
  reader.join();
}
