#include "server/response_store.h"

namespace dsv4::server {

void ResponseStore::put(const std::string& id, StoredResponse r) {
  const size_t bytes = id.size() + r.response.dump().size() + r.conversation.dump().size() + r.input_items.dump().size();
  std::lock_guard<std::mutex> l(mu_);
  erase_locked(id);
  if (bytes > max_bytes_) return;
  const uint64_t no = ++puts_;
  map_[id] = Entry{std::make_shared<const StoredResponse>(std::move(r)), bytes, no};
  order_.emplace_back(id, no);
  bytes_ += bytes;
  while (bytes_ > max_bytes_ && !order_.empty()) {
    const auto [old, old_no] = order_.front();
    order_.pop_front();
    if (auto it = map_.find(old); it != map_.end() && it->second.put_no == old_no) erase_locked(old);
  }
  // Names of entries erased or put again since stay queued until reached; drop them once they
  // are most of the queue.
  if (order_.size() > 2 * map_.size() + 64) {
    std::deque<std::pair<std::string, uint64_t>> live;
    for (const auto& [k, n] : order_)
      if (auto it = map_.find(k); it != map_.end() && it->second.put_no == n) live.emplace_back(k, n);
    order_.swap(live);
  }
}

std::shared_ptr<const StoredResponse> ResponseStore::get(const std::string& id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = map_.find(id);
  return it == map_.end() ? nullptr : it->second.r;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> l(mu_);
  const bool had = map_.count(id) > 0;
  erase_locked(id);
  return had;
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return bytes_;
}

void ResponseStore::erase_locked(const std::string& id) {
  auto it = map_.find(id);
  if (it == map_.end()) return;
  bytes_ -= it->second.bytes;
  map_.erase(it);
}

}  // namespace dsv4::server
