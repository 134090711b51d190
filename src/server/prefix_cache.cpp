#include "server/prefix_cache.h"

#include <algorithm>

namespace dsv4::server {

namespace {
int64_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  const size_t m = std::min(a.size(), b.size());
  while (n < m && a[n] == b[n]) ++n;
  return static_cast<int64_t>(n);
}
}  // namespace

std::optional<PrefixCache::Hit> PrefixCache::lookup(const std::vector<int32_t>& prompt) {
  if (prompt.empty()) return std::nullopt;
  const int64_t cap = static_cast<int64_t>(prompt.size()) - 1;
  auto best = entries_.end();
  int64_t best_len = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const int64_t len = std::min(common_prefix(it->snap.tokens(), prompt), cap);
    if (len > best_len && it->snap.pos() - len <= kCheapRewind) best = it, best_len = len;
  }
  if (best == entries_.end()) return std::nullopt;
  entries_.splice(entries_.begin(), entries_, best);  // most recently used
  return Hit{entries_.front().snap, best_len};
}

void PrefixCache::insert(const Snapshot& s) {
  if (budget_ <= 0 || s.pos() == 0) return;
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->snap.tokens() == s.tokens()) {
      bytes_ -= it->charged;
      entries_.erase(it);
      break;
    }
  const int64_t charged = static_cast<int64_t>(std::max(engine_.sequence_bytes(s.pos()), s.bytes()));
  if (charged > budget_) return;
  entries_.push_front({s, charged});
  bytes_ += charged;
  while (bytes_ > budget_) {
    bytes_ -= entries_.back().charged;
    entries_.pop_back();
  }
}

}  // namespace dsv4::server
