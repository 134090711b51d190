#include "server/metrics.h"

#include <cstdio>

namespace dsv4::server {

void Histogram::observe(double v) {
  size_t b = 0;
  while (b < bounds_.size() && v > bounds_[b]) ++b;
  ++counts_[b];
  sum_ += v;
  ++count_;
}

static std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  int64_t acc = 0;
  for (size_t b = 0; b < bounds_.size(); ++b) {
    acc += counts_[b];
    out += name + "_bucket{le=\"" + num(bounds_[b]) + "\"} " + std::to_string(acc) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : batch_({1, 2, 4, 8, 16, 32, 64}),
      ttft_({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      tpot_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}),
      step_s_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}) {}

void Metrics::request_done(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> l(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::tokens(int64_t prompt, int64_t generated, int64_t cached) {
  std::lock_guard<std::mutex> l(mu_);
  prompt_ += prompt, generated_ += generated, cached_ += cached;
}

void Metrics::step(int64_t batch, int64_t prefill_tokens, double seconds) {
  std::lock_guard<std::mutex> l(mu_);
  ++steps_;
  prefilled_ += prefill_tokens;
  batch_.observe(static_cast<double>(batch));
  step_s_.observe(seconds);
}

void Metrics::drafts(int64_t drafted, int64_t accepted) {
  std::lock_guard<std::mutex> l(mu_);
  drafted_ += drafted, accepted_ += accepted;
}

void Metrics::stream_stalled() {
  std::lock_guard<std::mutex> l(mu_);
  ++stalled_;
}

void Metrics::connection_closed(RequestDeadline::Close why) {
  std::lock_guard<std::mutex> l(mu_);
  using C = RequestDeadline::Close;
  ++(why == C::kIdle ? idle_closed_ : why == C::kTooLarge ? too_large_ : timed_out_);
}

void Metrics::ttft(double seconds) {
  std::lock_guard<std::mutex> l(mu_);
  ttft_.observe(seconds);
}

void Metrics::token_latency(double seconds) {
  std::lock_guard<std::mutex> l(mu_);
  tpot_.observe(seconds);
}

std::string Metrics::render(const Gauges& g) const {
  std::lock_guard<std::mutex> l(mu_);
  std::string o;
  o += "# HELP dsv4_requests_total Requests answered, by endpoint and HTTP status.\n# TYPE dsv4_requests_total counter\n";
  for (const auto& [k, v] : requests_)
    o += "dsv4_requests_total{endpoint=\"" + k.first + "\",status=\"" + std::to_string(k.second) + "\"} " + std::to_string(v) + "\n";
  auto counter = [&](const char* name, const char* help, int64_t v) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " + std::to_string(v) + "\n";
  };
  auto gauge = [&](const char* name, const char* help, int64_t v) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " + std::to_string(v) + "\n";
  };
  counter("dsv4_prompt_tokens_total", "Prompt tokens of finished requests (cached ones included).", prompt_);
  counter("dsv4_generated_tokens_total", "Tokens generated.", generated_);
  counter("dsv4_cached_tokens_total", "Prompt tokens whose state came from the prefix cache.", cached_);
  counter("dsv4_steps_total", "Engine steps run.", steps_);
  counter("dsv4_prefill_tokens_total", "Prompt tokens fed to the model (those not restored from the cache).", prefilled_);
  counter("dsv4_draft_tokens_total", "Tokens the MTP block drafted (serve --draft).", drafted_);
  counter("dsv4_draft_accepted_tokens_total", "Drafted tokens the model confirmed.", accepted_);
  counter("dsv4_streams_stalled_total", "Streams dropped because their client took no data for --stall-timeout.", stalled_);
  counter("dsv4_connections_timed_out_total", "Connections closed for sending no complete request within --read-timeout.", timed_out_);
  counter("dsv4_idle_connections_closed_total", "Idle keep-alive connections closed because new connections waited for a thread.", idle_closed_);
  counter("dsv4_oversized_requests_total", "Connections answered 413 and closed: a request past the body limit plus 64 KiB of headers.", too_large_);
  gauge("dsv4_queue_depth", "Requests waiting for admission.", g.queue_depth);
  gauge("dsv4_running_sequences", "Requests being prefilled or decoded (the n choices of one count once).", g.running);
  gauge("dsv4_paused_requests", "Running requests left out of the steps: their client has not taken their output.", g.paused);
  gauge("dsv4_kv_reserved_bytes", "Cache bytes reserved by live sequences.", g.kv_reserved_bytes);
  gauge("dsv4_prefix_cache_bytes", "Bytes charged to prefix-cache snapshots.", g.prefix_cache_bytes);
  gauge("dsv4_kept_responses_bytes", "Bytes of /v1/responses kept for previous_response_id (JSON text).", g.kept_responses_bytes);
  gauge("dsv4_prefix_cache_entries", "Snapshots in the prefix cache.", g.prefix_cache_entries);
  gauge("dsv4_prefix_cache_disk_bytes", "Bytes of prefix-cache snapshot files in --cache-dir.", g.disk_cache_bytes);
  gauge("dsv4_prefix_cache_disk_entries", "Prefix-cache snapshot files in --cache-dir.", g.disk_cache_entries);
  counter("dsv4_prefix_cache_disk_loads_total", "Snapshots loaded from --cache-dir (each saved more prefill than memory had).", g.disk_cache_loads);
  batch_.render(o, "dsv4_step_batch_size", "Sequences per engine step.");
  step_s_.render(o, "dsv4_step_seconds", "Time of one engine step.");
  ttft_.render(o, "dsv4_time_to_first_token_seconds", "From request to its first generated token.");
  tpot_.render(o, "dsv4_time_per_output_token_seconds", "Between two generated tokens of one choice.");
  return o;
}

}  // namespace dsv4::server
