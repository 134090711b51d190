#include "engine/stop_filter.h"

#include <algorithm>

namespace dsv4 {

StopFilter::StopFilter(std::vector<std::string> stops, Sink sink) : stops_(std::move(stops)), sink_(std::move(sink)) {}

bool StopFilter::push(std::string_view text) {
  if (stopped_) return true;
  pending_ += text;
  size_t cut = std::string::npos;
  for (const auto& s : stops_) {
    size_t at = s.empty() ? std::string::npos : pending_.find(s);
    if (at != std::string::npos && at < cut) cut = at, matched_ = s;
  }
  if (cut != std::string::npos) {
    emit(std::string_view(pending_).substr(0, cut));
    pending_.clear();
    return stopped_ = true;
  }
  size_t hold = 0;  // longest suffix of pending that is a proper prefix of a stop string
  for (const auto& s : stops_)
    for (size_t n = std::min(s.empty() ? 0 : s.size() - 1, pending_.size()); n > hold; --n)
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  // Never split a UTF-8 character when holding back.
  size_t end = pending_.size() - hold;
  while (end > 0 && end < pending_.size() && (static_cast<unsigned char>(pending_[end]) & 0xC0) == 0x80) --end;
  emit(std::string_view(pending_).substr(0, end));
  pending_.erase(0, end);
  return false;
}

void StopFilter::finish() {
  if (stopped_) return;
  emit(pending_);
  pending_.clear();
}

void StopFilter::emit(std::string_view t) {
  if (t.empty()) return;
  out_ += t;
  if (sink_) sink_(t);
}

}  // namespace dsv4
