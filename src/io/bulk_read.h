// Reading checkpoint bytes into memory with several reads in flight (`--load read`).
// One thread reading 64 MiB at a time leaves a fast disk (NVMe queues) and the kernel's page
// zeroing and copying on one core; a V4 checkpoint is 150-865 GB. Spans are cut into chunks
// that a few threads take in turn; progress is reported while it runs.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace dsv4 {

// Bytes [offset, offset + size) of a file go to dst.
struct ReadSpan {
  char* dst;
  uint64_t offset;
  size_t size;
};

// Shared by every file of one load: prints "dsv4: read X of Y GB ..." to stderr at most every
// `every` (never when the whole load finishes sooner). Thread-safe.
class ReadProgress {
 public:
  explicit ReadProgress(uint64_t total, std::chrono::milliseconds every = std::chrono::seconds(10));
  void add(uint64_t bytes);
  uint64_t done() const { return done_.load(); }

 private:
  const uint64_t total_;
  const std::chrono::milliseconds every_;
  const std::chrono::steady_clock::time_point t0_;
  std::atomic<uint64_t> done_{0};
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_;
};

// Reads every span of the open file `fd` (named `path` in errors). Throws dsv4::Error naming
// the file and the byte offset on a failed or short read; the destination is then partly
// written. `threads` <= 0: one per core, at most 8. `chunk`: bytes per read (0: 64 MiB).
void read_spans(const std::string& path, int fd, const std::vector<ReadSpan>& spans, ReadProgress* progress,
                int threads = 0, size_t chunk = 0);

}  // namespace dsv4
