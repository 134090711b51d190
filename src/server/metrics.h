#pragma once
// The server's counters and histograms, rendered as Prometheus text (GET /metrics). Shared by
// the HTTP threads and the scheduler thread, hence the mutex; gauges are sampled at render time.
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "server/connections.h"

namespace dsv4::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void request_done(const std::string& endpoint, int status);
  void tokens(int64_t prompt, int64_t generated, int64_t cached);
  void step(int64_t batch, int64_t prefill_tokens, double seconds);
  void ttft(double seconds);
  void token_latency(double seconds);  // time between two tokens of one choice
  void drafts(int64_t drafted, int64_t accepted);  // speculative decoding, per step
  void stream_stalled();      // a stream dropped: its client took no data for --stall-timeout
  // A connection closed by the server (connections.h: no complete request within --read-timeout,
  // idle keep-alive while its thread was wanted, or a request past the size limit).
  void connection_closed(RequestDeadline::Close why);

  struct Gauges {
    int64_t queue_depth = 0, running = 0, kv_reserved_bytes = 0, prefix_cache_bytes = 0, prefix_cache_entries = 0, paused = 0;
    int64_t disk_cache_bytes = 0, disk_cache_entries = 0, disk_cache_loads = 0;  // --cache-dir
    int64_t kept_responses_bytes = 0;  // /v1/responses kept for previous_response_id
  };
  std::string render(const Gauges& g) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_ = 0, generated_ = 0, cached_ = 0, steps_ = 0, prefilled_ = 0, drafted_ = 0, accepted_ = 0;
  int64_t stalled_ = 0, timed_out_ = 0, idle_closed_ = 0, too_large_ = 0;
  Histogram batch_, ttft_, tpot_, step_s_;
};

}  // namespace dsv4::server
