#pragma once
// The prefix cache's disk writes off the scheduler's thread: a thread that writes snapshot files
// (engine/snapshot_file.h) and deletes them, one at a time in the order asked. A state of a long
// agent prompt is hundreds of MB on a full-size model; framed, hashed and written on the
// scheduler's thread, it would stall every running stream for the write.
//
// The order makes the cache's bookkeeping simple: a delete asked after a write of the same path
// runs after it, so the cache may count a file as present from the moment it asks for it. What
// it must not do is read a file still pending (pending()); a write that failed is reported by
// failed() (the file is then not there). Queued images are bounded in bytes: past the bound a
// write is refused, not queued (a cache may skip a save; memory may not grow without bound).
// The destructor finishes what is queued, so a server that stops keeps its last saves.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/snapshot_file.h"

namespace dsv4::server {

class SnapshotWriter {
 public:
  explicit SnapshotWriter(int64_t max_queued_bytes);
  ~SnapshotWriter();
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  // Queues the write of `im` to `path`; false (nothing queued) when the images queued already
  // take max_queued_bytes (one image is always taken when none waits).
  bool write(const std::string& path, SnapshotImage im);
  // Queues the deletion of `path` (after any write of it queued before).
  void remove(const std::string& path);
  // Whether a write of `path` is queued or running.
  bool pending(const std::string& path) const;
  // The paths whose write failed since the last call (each also said on stderr).
  std::vector<std::string> failed();
  // Waits until everything queued is done.
  void flush();

 private:
  struct Op {
    std::string path;
    bool write;
    SnapshotImage im;
  };
  void loop();
  const int64_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<Op> ops_;
  std::map<std::string, int> pending_;  // path -> writes queued or running
  int64_t queued_bytes_ = 0;
  bool busy_ = false, stop_ = false;
  std::vector<std::string> failed_;
  std::thread thread_;
};

}  // namespace dsv4::server
