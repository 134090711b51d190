#pragma once
// The exact DSML text the model sampled for each tool call the server returned, by call id.
// When a client sends the call back in the conversation, the prompt is rendered with that text
// (the "dsml" field render_chat takes), so it is byte-identical to what the model consumed and
// the prefix cache hits. Bounded: the oldest ids are forgotten first (the call then renders from
// its arguments, which is correct, only possibly not byte-identical).
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace dsv4::server {

class ToolCallStore {
 public:
  explicit ToolCallStore(size_t capacity = 4096) : capacity_(capacity) {}
  void put(const std::string& id, const std::string& dsml);
  std::optional<std::string> get(const std::string& id) const;
  // A fresh call id with the given prefix ("call_" for OpenAI, "toolu_" for Anthropic).
  static std::string new_id(const std::string& prefix);

 private:
  mutable std::mutex mu_;
  size_t capacity_;
  std::unordered_map<std::string, std::string> map_;
  std::deque<std::string> order_;
};

}  // namespace dsv4::server
