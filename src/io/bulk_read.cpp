#include "io/bulk_read.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <thread>

#include "core/error.h"

namespace dsv4 {

ReadProgress::ReadProgress(uint64_t total, std::chrono::milliseconds every)
    : total_(total), every_(every), t0_(std::chrono::steady_clock::now()), last_(t0_) {}

void ReadProgress::add(uint64_t bytes) {
  const uint64_t done = done_ += bytes;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (now - last_ < every_ || done >= total_) return;
  last_ = now;
  const double s = std::chrono::duration<double>(now - t0_).count();
  std::fprintf(stderr, "dsv4: read %.1f of %.1f GB (%.0f%%, %.1f GB/s)\n", static_cast<double>(done) / 1e9,
               static_cast<double>(total_) / 1e9, 100.0 * static_cast<double>(done) / static_cast<double>(total_),
               static_cast<double>(done) / 1e9 / s);
}

void read_spans(const std::string& path, int fd, const std::vector<ReadSpan>& spans, ReadProgress* progress,
                int threads, size_t chunk) {
  if (chunk == 0) chunk = size_t{1} << 26;  // 64 MiB per pread: large enough to stream, small enough to share out
  std::vector<ReadSpan> chunks;
  for (const ReadSpan& s : spans)
    for (size_t off = 0; off < s.size; off += chunk)
      chunks.push_back({s.dst + off, s.offset + off, std::min(chunk, s.size - off)});
  if (chunks.empty()) return;
  if (threads <= 0) threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), chunks.size()));

  // On a failure, chunks that start past it are skipped and the lowest failing byte is reported,
  // so a file cut short always names its end, whichever thread got there first.
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> fail_at{UINT64_MAX};
  std::mutex mu;
  std::string error;
  auto work = [&] {
    for (size_t i; (i = next++) < chunks.size();) {
      const ReadSpan& c = chunks[i];
      if (c.offset >= fail_at.load()) continue;
      for (size_t off = 0; off < c.size;) {
        const ssize_t k = ::pread(fd, c.dst + off, c.size - off, static_cast<off_t>(c.offset + off));
        if (k <= 0) {
          const std::string why = k == 0 ? "unexpected end of file" : std::strerror(errno);
          std::lock_guard<std::mutex> lock(mu);
          if (c.offset + off < fail_at.load()) {
            fail_at = c.offset + off;
            error = path + ": read failed at byte " + std::to_string(c.offset + off) + ": " + why;
          }
          break;
        }
        off += static_cast<size_t>(k);
        if (progress) progress->add(static_cast<uint64_t>(k));
      }
    }
  };
  std::vector<std::thread> pool;
  try {
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  } catch (const std::system_error&) {
    // No more threads to be had: the ones started and this one read everything.
  }
  work();
  for (auto& t : pool) t.join();
  if (fail_at.load() != UINT64_MAX) throw Error(error);
}

}  // namespace dsv4
