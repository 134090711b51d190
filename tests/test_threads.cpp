// The persistent pool: every index of [0, n) is handed out exactly once, in contiguous ranges,
// for both the static and the dynamic split, across many back-to-back jobs (workers spinning)
// and after pauses long enough for the workers to fall asleep. And errors that cross threads.
#include <gtest/gtest.h>

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
      for (int cpt : {1, 8}) check_cover(pool, 1 + (rep * 37) % 101, cpt);
  }
}

TEST(ThreadPool, WakesSleepingWorkers) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 4; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin: workers sleep
    check_cover(pool, 1000, rep % 2 == 0 ? 1 : 8);
  }
}

// The static split gives each thread one range, so a job of size() units runs one unit on
// every thread (the FMA-peak probe relies on it).
TEST(ThreadPool, StaticSplitOneRangePerThread) {
  ThreadPool pool(4);
  std::atomic<int> calls{0};
  std::vector<std::thread::id> ids(4);
  pool.parallel_for(4, [&](int64_t b, int64_t e) {
    EXPECT_EQ(e - b, 1);
    ids[static_cast<size_t>(b)] = std::this_thread::get_id();
    calls.fetch_add(1);
  });
  EXPECT_EQ(calls.load(), 4);
  for (int i = 0; i < 4; ++i)
    for (int j = i + 1; j < 4; ++j) EXPECT_NE(ids[i], ids[j]);
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
