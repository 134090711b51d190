#pragma once
// The responses `/v1/responses` keeps (OpenAI's `store`, its default): each response object as
// returned, with the conversation that led to it and its answer, as chat messages, and the
// input items it came from. A request naming it in `previous_response_id` continues that
// conversation; `GET /v1/responses/{id}` returns it, `GET /v1/responses/{id}/input_items` its
// input items, and `DELETE` forgets it. Kept in memory only, bounded by bytes: the oldest go
// first (a request naming a forgotten one gets a 404 and can send the whole conversation
// instead).
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

namespace dsv4::server {

struct StoredResponse {
  nlohmann::ordered_json response;      // the response object, as returned
  nlohmann::ordered_json conversation;  // chat messages: earlier turns, this input, this answer
  nlohmann::ordered_json input_items;   // the items it was generated from (ParsedRequest::input_items)
};

class ResponseStore {
 public:
  explicit ResponseStore(size_t max_bytes = size_t{64} << 20) : max_bytes_(max_bytes) {}
  // Replaces one of the same id. One larger than the whole budget is not kept.
  void put(const std::string& id, StoredResponse r);
  std::shared_ptr<const StoredResponse> get(const std::string& id) const;
  bool erase(const std::string& id);
  size_t bytes() const;

 private:
  struct Entry {
    std::shared_ptr<const StoredResponse> r;
    size_t bytes;
    uint64_t put_no;  // which put made it: an id put again is queued again
  };
  void erase_locked(const std::string& id);
  mutable std::mutex mu_;
  size_t max_bytes_, bytes_ = 0;
  std::unordered_map<std::string, Entry> map_;
  uint64_t puts_ = 0;
  // Oldest first, as (id, put_no): names of entries erased or put again since are skipped.
  std::deque<std::pair<std::string, uint64_t>> order_;
};

}  // namespace dsv4::server
