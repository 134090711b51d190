#include "server/snapshot_writer.h"

#include <cstdio>
#include <filesystem>
#include <system_error>
#include <utility>

#include "core/error.h"

namespace dsv4::server {

SnapshotWriter::SnapshotWriter(int64_t max_queued_bytes) : max_queued_(max_queued_bytes) {
  thread_ = std::thread([this] { loop(); });
}

SnapshotWriter::~SnapshotWriter() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool SnapshotWriter::write(const std::string& path, SnapshotImage im) {
  const auto bytes = static_cast<int64_t>(im.file_bytes());
  {
    std::lock_guard<std::mutex> l(mu_);
    if (queued_bytes_ > 0 && queued_bytes_ + bytes > max_queued_) return false;
    queued_bytes_ += bytes;
    ++pending_[path];
    ops_.push_back({path, true, std::move(im)});
  }
  cv_.notify_one();
  return true;
}

void SnapshotWriter::remove(const std::string& path) {
  {
    std::lock_guard<std::mutex> l(mu_);
    ops_.push_back({path, false, {}});
  }
  cv_.notify_one();
}

bool SnapshotWriter::pending(const std::string& path) const {
  std::lock_guard<std::mutex> l(mu_);
  return pending_.count(path) != 0;
}

std::vector<std::string> SnapshotWriter::failed() {
  std::lock_guard<std::mutex> l(mu_);
  return std::exchange(failed_, {});
}

void SnapshotWriter::flush() {
  std::unique_lock<std::mutex> l(mu_);
  idle_.wait(l, [&] { return ops_.empty() && !busy_; });
}

void SnapshotWriter::loop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || !ops_.empty(); });
    if (ops_.empty()) return;  // stopping, and everything queued is done
    Op op = std::move(ops_.front());
    ops_.pop_front();
    busy_ = true;
    l.unlock();
    bool ok = true;
    if (op.write) {
      try {
        write_snapshot_file(op.im, op.path);
      } catch (const Error& err) {  // a full disk: the cache in memory goes on
        std::fprintf(stderr, "dsv4 serve: prefix cache: not saved: %s\n", err.what());
        ok = false;
      }
    } else {
      std::error_code ec;
      std::filesystem::remove(op.path, ec);
    }
    l.lock();
    busy_ = false;
    if (op.write) {
      queued_bytes_ -= static_cast<int64_t>(op.im.file_bytes());
      if (--pending_[op.path] == 0) pending_.erase(op.path);
      if (!ok) failed_.push_back(op.path);
    }
    if (ops_.empty()) idle_.notify_all();
  }
}

}  // namespace dsv4::server
