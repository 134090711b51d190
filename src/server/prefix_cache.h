#pragma once
// Prefix cache: snapshots of sequence states keyed by the tokens they consumed, least recently
// used evicted first under a byte budget. A prompt reuses the entry that saves the most prefill:
// the longest common prefix L (capped one short of the prompt, whose last token must be fed to
// get logits) among entries whose state can be cut back to L cheaply (at most kCheapRewind
// tokens beyond it; a deeper truncate would replay the prefix, saving nothing).
//
// Charged bytes: Engine::sequence_bytes(pos) per entry, an upper bound of what a snapshot can keep
// alive (its compressed-entry pages are shared copy-on-write with the live sequence and other
// snapshots, so Snapshot::bytes() alone would undercount once those are gone).
//
// On disk (DiskOptions::dir, optional): the snapshots at the end of prompts and answers are also
// saved as files (Engine::save_snapshot), least recently used deleted first under their own
// budget, so a restarted server does not read its long prompts again (an agent's 20k-token
// system prompt and tools take minutes on a CPU). A snapshot taken inside a long prompt (every
// 1024 positions) is saved once another prompt restores it, i.e. once its tokens proved to be a
// prefix prompts share (an agent's system prompt and tools, before each conversation's first
// message). A file is loaded when it saves more prefill than the best snapshot in memory. Files
// of another model, build or ISA are left alone (and never read); damaged ones are deleted. cpu,
// one process (Engine::save_snapshot). The caller's thread only copies a state out
// (Engine::snapshot_image); a SnapshotWriter thread frames, writes and deletes the files.
#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/snapshot_writer.h"

namespace dsv4::server {

struct DiskCacheOptions {
  std::string dir;           // "" = no disk tier
  int64_t budget_bytes = 0;  // bytes of files kept
  int64_t min_tokens = 64;   // shorter states are cheap to recompute: not written
  int64_t max_queued_bytes = int64_t{1} << 30;  // images waiting for the writer; past it a save is skipped
};

class PrefixCache {
 public:
  // With a disk tier, reads the directory's files (throws Error when the directory cannot be
  // made or the engine cannot keep snapshot files).
  PrefixCache(Engine& engine, int64_t budget_bytes, const DiskCacheOptions& disk = DiskCacheOptions());

  struct Hit {
    Snapshot snap;
    int64_t common = 0;  // tokens to keep from it (truncate to this)
  };
  std::optional<Hit> lookup(const std::vector<int32_t>& prompt);
  // Adds a state (replacing an entry of the same tokens), then evicts over budget; `durable`
  // states (the end of a prompt or of an answer) also go to the disk tier.
  void insert(const Snapshot& s, bool durable = false);
  int64_t bytes() const { return bytes_; }
  size_t entries() const { return entries_.size(); }
  int64_t disk_bytes() const { return disk_bytes_; }
  size_t disk_entries() const { return files_.size(); }
  int64_t disk_loads() const { return disk_loads_; }
  // Waits until the files asked for are written (tests; the destructor does it too).
  void flush() { writer_.flush(); }

 private:
  struct Entry {
    Snapshot snap;
    int64_t charged;
    bool on_disk;  // saved (or not to be saved: the disk tier is off)
  };
  struct File {
    std::string path;
    std::vector<int32_t> tokens;
    int64_t bytes;
  };
  void remember(const Snapshot& s, bool on_disk);  // into memory only
  void save(const Snapshot& s);
  void drop_file(std::list<File>::iterator it, const char* why);
  void forget_failed_writes();
  Engine& engine_;
  const int64_t budget_;
  const DiskCacheOptions disk_;
  std::list<Entry> entries_;  // most recently used first
  int64_t bytes_ = 0;
  std::list<File> files_;     // most recently used first
  int64_t disk_bytes_ = 0, disk_loads_ = 0;
  SnapshotWriter writer_;  // last: finishes its queue before the rest goes
};

}  // namespace dsv4::server
