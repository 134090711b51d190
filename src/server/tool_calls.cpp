#include "server/tool_calls.h"

#include <random>

namespace dsv4::server {

void ToolCallStore::put(const std::string& id, const std::string& dsml) {
  std::lock_guard<std::mutex> l(mu_);
  if (map_.emplace(id, dsml).second) order_.push_back(id);
  while (order_.size() > capacity_) {
    map_.erase(order_.front());
    order_.pop_front();
  }
}

std::optional<std::string> ToolCallStore::get(const std::string& id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = map_.find(id);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

std::string ToolCallStore::new_id(const std::string& prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += hex[rng() & 15];
  return s;
}

}  // namespace dsv4::server
