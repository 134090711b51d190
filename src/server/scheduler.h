#pragma once
// The server's scheduler: one thread owns the Engine and runs continuous batching. Requests
// (Jobs) are queued by the HTTP threads; every step carries each running choice's decode token
// plus prefill chunks of admitted prompts under a per-step token budget, so a long prompt never
// stalls the running streams for longer than one chunk. Requests join and leave between steps.
//
// Admission is by memory: a job's sequence reserves the cache of prompt + max_tokens positions
// against the engine's memory budget (Engine::new_sequence throws ResourceExhausted when it does
// not fit); such a job waits, in arrival order, until running ones finish. The wait queue is
// bounded: submit() refuses when more jobs wait than max_queue plus the batch places free right
// now (those are about to start, not waiting) — the server answers 503 + Retry-After.
//
// Prefix cache: at the end of every prompt, and when a single-choice job finishes, the
// sequence's state is snapshotted into an LRU cache (PrefixCache); a new job restores the
// snapshot sharing its longest prefix and prefills only the rest.
//
// Speculative decoding (SchedulerOptions::draft): every sequence keeps the MTP block in step; a
// decoding choice feeds its token plus the block's drafts after it and keeps each draft while
// its sampler, run on the verified rows in order, picks it (the rest are rewound). The picks are
// the ones decoding without drafts makes, greedy or seeded: the same output, more per step when
// the drafts are right.
//
// Results stream back through the Job: the HTTP thread waits on it for events. A job whose
// client is not taking its output (a write blocked for kPauseBlocked, or kPauseBacklog events
// per choice untaken) is paused: left out of the steps, holding its sequences, until the client
// takes it or is dropped (the HTTP layer's stall timeout) and the job cancelled. A slow reader
// is thereby paced, not cut off, and costs the other streams nothing.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/json_constraint.h"
#include "engine/sampler.h"
#include "server/metrics.h"
#include "server/prefix_cache.h"
#include "text/chat.h"

namespace dsv4::server {

// What one request asks the model to do (already tokenized and validated by the API layer).
struct GenParams {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 256;
  SamplingParams sampling;                // seed used for choice 0; choice i uses seed + i
  std::vector<std::string> stop;          // stop strings (cut from the text, never emitted)
  std::vector<int32_t> stop_tokens;       // besides the model's EOS
  int n = 1;                              // choices, sharing one prefill (fork)
  int top_logprobs = -1;                  // -1: no logprobs; 0..20: the sampled token's + that many
  // logit_bias: added to the logits before each pick (log-probabilities stay the model's). Such
  // choices pick on the host (drafts are verified row by row, each after the picks before it).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // response_format json_object / json_schema: each choice is one JSON object of this grammar,
  // after its reasoning when it starts with one (engine/json_constraint.h); null: free text.
  // Such choices pick on the host (drafting as above).
  std::shared_ptr<const JsonGrammar> json;
  bool json_or_tool_call = false;         // with tools: the answer may be a tool-call block instead
  bool reasoning_first = false;           // the answer starts with reasoning (thinking mode)
  // Whether the next turn's prompt can start with the state after this answer: not in thinking
  // mode without tools, whose next prompt drops the reasoning. Then that state is kept in
  // memory only, not written to --cache-dir.
  bool answer_reused = true;
  // parallel_tool_calls false with tools: the answer ends with its first tool call, right after
  // that call's "</｜DSML｜invoke>" as the response reads the text (this mode and these tools,
  // after the forced prefix), so the calls the model would write after it are never generated.
  // Null: no such end. A first call cut short by malformed markup does not end the answer.
  struct FirstCall {
    ChatMode mode = ChatMode::Chat;
    nlohmann::ordered_json tools;
    std::string forced_prefix;
  };
  std::shared_ptr<const FirstCall> end_at_first_call;
};

struct TopLogprob {
  int32_t id;
  float logprob;
};
// A sampled token's log-probability and the top alternatives' (the scheduler's, per token).
struct TokenLogprobs {
  float logprob = 0;
  std::vector<TopLogprob> top;
};
TokenLogprobs token_logprobs(const float* logits, int64_t V, int32_t id, int64_t top);

// One event of a job, in order. A choice's Text events end with one Finish; Done ends the job.
struct Event {
  enum Kind { Text, Finish, Done, Failed } kind = Text;
  int choice = 0;
  std::string text;                 // Text: the choice's next piece (complete UTF-8 characters)
  // Text: the tokens behind this piece, with their logprobs when asked (a piece may have no
  // tokens while a stop string is being ruled out, or several when it is released).
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<std::vector<TopLogprob>> top;
  // Finish: "eos" | "stop_token" | "stop_string" (then stop_string says which) | "length" |
  // "tool_call" (the first call ended the answer: GenParams::end_at_first_call)
  std::string finish_reason;
  std::string stop_string;
  Error error{""};                  // Failed

  static Event of(Kind k, int choice = 0) {
    Event e;
    e.kind = k, e.choice = choice;
    return e;
  }
  static Event failed(const Error& err) {
    Event e = of(Failed);
    e.error = err;  // its own copy of the text (core/error.h): the event crosses to an HTTP thread
    return e;
  }
};

// A job is paused when its client has had a write blocked for kPauseBlocked (its buffers are
// full: more decoding would only queue), or when kPauseBacklog untaken events per choice wait
// (a step makes at most one Text event per choice and token; a client that reads keeps its
// backlog near zero). The first catches a stopped reader within a step or so however slowly the
// model decodes; the second paces an HTTP thread that falls behind for any reason. A paused job
// resumes when its client has taken every queued event and no write is under way.
constexpr size_t kPauseBacklog = 32;
constexpr std::chrono::milliseconds kPauseBlocked{250};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

class Job {
 public:
  explicit Job(GenParams p) : params(std::move(p)) {}
  const GenParams params;

  // Waits up to `timeout` for the next event; false on timeout.
  bool next(Event& e, std::chrono::milliseconds timeout);
  // The client went away (or gave up): the scheduler frees the job's sequences at the next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  // Events pushed and not yet taken by next(): grows while the HTTP thread is blocked writing to
  // a client that does not read.
  size_t backlog() const;
  // Around each write of the job's output to its client (streams): a write that does not
  // return at once means the socket buffers are full, the client is not reading.
  void write_begin() { write_begin_ns_ = std::chrono::steady_clock::now().time_since_epoch().count(); }
  void write_end() { write_begin_ns_ = 0; }
  // How long the current write has been blocked (0 when none is under way).
  std::chrono::nanoseconds blocked_for() const;
  Usage usage() const;  // complete once Done was received
  // Seconds from submission to the first generated token (0 until then).
  double ttft() const;

 private:
  friend class Scheduler;
  void push(Event e);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> write_begin_ns_{0};
  Usage usage_;
  std::chrono::steady_clock::time_point submitted_ = std::chrono::steady_clock::now();
  double ttft_ = 0;
};

struct SchedulerOptions {
  int max_batch = 16;              // choices decoding at once
  int64_t step_tokens = 256;       // tokens per step (decode tokens + prefill chunks)
  // The same while some sequence is decoding: a step's time is mostly its prefill tokens, and
  // every decoding stream waits for it, so a smaller budget bounds the time per output token
  // (prompts then take more, shorter steps).
  int64_t step_tokens_decoding = 64;
  int max_queue = 64;              // jobs waiting for admission before submit() refuses
  int64_t cache_budget = 256 << 20;  // bytes of prefix-cache snapshots (0 = no cache)
  std::string cache_dir;             // prefix-cache snapshots also on disk ("" = not)
  int64_t cache_dir_budget = int64_t{10} << 30;  // bytes of files there
  int draft = 0;                   // MTP drafts per decode step and choice (0 = off; <= kCheapRewind)
};

// Prompt tokens a step may carry beside `decode_tokens` decode tokens: what is left of
// step_tokens (step_tokens_decoding when decode_tokens > 0), at least 32 so prompts progress.
int64_t prefill_budget(const SchedulerOptions& o, int64_t decode_tokens);

class Scheduler {
 public:
  Scheduler(Engine& engine, const SchedulerOptions& o, Metrics& metrics);
  ~Scheduler();  // stop()
  // Ends the scheduler thread within a step: every running and queued job ends with Failed
  // ("server shutting down"), and later submits throw Error(ResourceExhausted). The server calls
  // it first when it stops, so that a stop does not wait for answers in progress to run out.
  void stop();

  // Queues a job. Throws Error(ResourceExhausted) when the queue is full or the scheduler has
  // stopped, Error(BadInput) when the job can never run (its reservation exceeds the whole memory
  // budget).
  void submit(const std::shared_ptr<Job>& job);
  int queue_depth() const;
  int running() const;  // jobs being prefilled or decoded
  struct Stats {
    int64_t kv_reserved_bytes, cache_bytes, cache_entries, paused, disk_bytes, disk_entries, disk_loads;
  };
  Stats stats() const;  // as of the last step (the engine is only read by the scheduler thread)

 private:
  struct Choice;
  struct Active;
  void loop();
  bool admit(const std::shared_ptr<Job>& job);
  bool step();  // false when it ran nothing (every running job paused)
  // `held`: whether text held back (a possible stop string, a partial character) goes out.
  void finish_choice(Active& a, Choice& c, const std::string& reason, bool held = true);
  bool first_call_ended(Choice& c);
  void retire(Active& a);
  bool picks_in_step(const Active& a, const Choice& c) const;
  int32_t pick_id(const Active& a, Choice& c, const float* logits) const;
  int32_t pick(Active& a, Choice& c, const float* logits);
  void fail_pick(Active& a, const Error& e);
  void emit(Active& a, Choice& c, const float* logits);
  void emit_id(Active& a, Choice& c, int32_t id, const float* logits, TokenLogprobs* lp = nullptr);
  int64_t drafts_for(const Active& a, const Choice& c) const;
  void verify(Active& a, Choice& c, const std::vector<float>& logits);
  std::shared_ptr<const JsonVocab> json_vocab(const GenParams& p);  // null unless p.json

  Engine& engine_;
  const SchedulerOptions opt_;
  Metrics& metrics_;
  PrefixCache cache_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> waiting_;
  std::vector<std::unique_ptr<Active>> active_;  // owned by the scheduler thread
  std::atomic<int> running_{0};
  std::atomic<int64_t> kv_bytes_{0}, cache_bytes_{0}, cache_entries_{0}, paused_{0};
  std::atomic<int64_t> disk_bytes_{0}, disk_entries_{0}, disk_loads_{0};
  std::atomic<int> live_choices_{0};  // batch places taken (choices, forks to come included)
  void update_stats();
  std::shared_ptr<const JsonVocab> json_vocab_;  // built at the first JSON-constrained job
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dsv4::server
