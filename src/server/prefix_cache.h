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
#include <cstdint>
#include <list>
#include <optional>
#include <vector>

#include "engine/engine.h"

namespace dsv4::server {

class PrefixCache {
 public:
  PrefixCache(const Engine& engine, int64_t budget_bytes) : engine_(engine), budget_(budget_bytes) {}

  struct Hit {
    Snapshot snap;
    int64_t common = 0;  // tokens to keep from it (truncate to this)
  };
  std::optional<Hit> lookup(const std::vector<int32_t>& prompt);
  // Adds a state (replacing an entry of the same tokens), then evicts over budget.
  void insert(const Snapshot& s);
  int64_t bytes() const { return bytes_; }
  size_t entries() const { return entries_.size(); }

 private:
  struct Entry {
    Snapshot snap;
    int64_t charged;
  };
  const Engine& engine_;
  const int64_t budget_;
  std::list<Entry> entries_;  // most recently used first
  int64_t bytes_ = 0;
};

}  // namespace dsv4::server
