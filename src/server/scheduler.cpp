#include "server/scheduler.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/rank_key.h"
#include "core/threads.h"
#include "engine/generate.h"
#include "engine/stop_filter.h"
#include "text/completion_stream.h"

namespace dsv4::server {

using Clock = std::chrono::steady_clock;

// Positions between the prefix-cache snapshots taken inside a long prompt.
constexpr int64_t kSnapshotEvery = 1024;

// ---- Job ----

void Job::push(Event e) {
  {
    std::lock_guard<std::mutex> l(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

bool Job::next(Event& e, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  if (!cv_.wait_for(l, timeout, [&] { return !events_.empty(); })) return false;
  e = std::move(events_.front());
  events_.pop_front();
  return true;
}

size_t Job::backlog() const {
  std::lock_guard<std::mutex> l(mu_);
  return events_.size();
}

std::chrono::nanoseconds Job::blocked_for() const {
  const int64_t t = write_begin_ns_;
  if (t == 0) return std::chrono::nanoseconds(0);
  return std::chrono::nanoseconds(std::chrono::steady_clock::now().time_since_epoch().count() - t);
}

Usage Job::usage() const {
  std::lock_guard<std::mutex> l(mu_);
  return usage_;
}

double Job::ttft() const {
  std::lock_guard<std::mutex> l(mu_);
  return ttft_;
}

// ---- the scheduler's per-job state ----

// One choice of a job: its sequence and its text pipeline (ids -> UTF-8 -> stop strings).
struct Scheduler::Choice {
  Choice(int i, Sequence s, const GenParams& p, const Tokenizer& tok, std::shared_ptr<const JsonVocab> json_vocab)
      : index(i), seq(std::move(s)), sampler(seeded(p.sampling, i)), dec(tok), filter(p.stop, [this](std::string_view t) {
          released += t;
        }) {
    if (json_vocab) json.emplace(std::move(json_vocab), p.json, p.reasoning_first, p.json_or_tool_call);
    if (const auto& f = p.end_at_first_call) {
      calls.emplace(f->mode, f->tools);
      calls->feed(f->forced_prefix);
    }
  }
  static SamplingParams seeded(SamplingParams sp, int i) {
    sp.seed += static_cast<uint64_t>(i);
    return sp;
  }
  int index;
  Sequence seq;
  Sampler sampler;
  std::optional<JsonConstraint> json;  // response_format json_object / json_schema
  std::optional<CompletionStream> calls;  // GenParams::end_at_first_call: the text read for its first call
  StreamDecoder dec;
  StopFilter filter;
  std::string released;               // text the filter let through, not yet sent
  std::vector<int32_t> generated;     // sampled ids (the stop token excluded)
  std::vector<int32_t> ids;           // ids not yet sent with a Text event
  std::vector<float> logprobs;
  std::vector<std::vector<TopLogprob>> top;
  int32_t next = -1;                  // sampled, to be fed by the next step
  std::vector<int32_t> drafts;        // the MTP block's drafts after `next`, fed with it
  int64_t keep = -1;                  // while verifying drafts: positions to keep if it ends here
  bool done = false;
  Clock::time_point last = Clock::now();
};

struct Scheduler::Active {
  std::shared_ptr<Job> job;
  std::vector<std::unique_ptr<Choice>> choices;  // [0] prefills; the others fork from it
  std::vector<int32_t> pending;                  // prompt tokens choice 0 has still to feed
  int64_t cached = 0;                            // prompt tokens restored from the prefix cache
  int64_t max_positions = 0;
  int64_t promised = 0;                          // bytes reserved ahead for the forks
  bool prefilled = false;
  bool paused = false;                           // this step: left out, its client not reading
  bool gone = false;                             // retired or failed: leaves after this step
};

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& o, Metrics& metrics)
    : engine_(engine),
      opt_(o),
      metrics_(metrics),
      // Files of states with and without the MTP block (--draft) apart: each kind restores only as itself.
      cache_(engine, o.cache_budget,
             {.dir = o.cache_dir.empty() ? "" : o.cache_dir + (o.draft > 0 ? "/mtp" : "/plain"),
              .budget_bytes = o.cache_dir_budget}) {
  if (o.draft < 0 || o.draft > kCheapRewind)
    throw Error("draft must be in [0, " + std::to_string(kCheapRewind) + "], got " + std::to_string(o.draft));
  if (o.draft > 0 && !engine.info().has_mtp)
    throw Error(engine.info().dir + " has no MTP block to draft with", ErrorKind::Unsupported);
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();  // the loop fails the running jobs as it ends
  std::lock_guard<std::mutex> l(mu_);
  for (auto& j : waiting_) j->push(Event::failed(Error("server shutting down", ErrorKind::ResourceExhausted)));
  waiting_.clear();
}

int Scheduler::queue_depth() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(waiting_.size());
}

int Scheduler::running() const { return running_; }

Scheduler::Stats Scheduler::stats() const {
  return {kv_bytes_, cache_bytes_, cache_entries_, paused_, disk_bytes_, disk_entries_, disk_loads_};
}

void Scheduler::update_stats() {
  running_ = static_cast<int>(active_.size());
  int live = 0;
  for (auto& a : active_) live += a->prefilled ? static_cast<int>(a->choices.size()) : a->job->params.n;
  live_choices_ = live;
  kv_bytes_ = engine_.reserved_bytes();
  cache_bytes_ = cache_.bytes();
  cache_entries_ = static_cast<int64_t>(cache_.entries());
  disk_bytes_ = cache_.disk_bytes();
  disk_entries_ = static_cast<int64_t>(cache_.disk_entries());
  disk_loads_ = cache_.disk_loads();
}

static int64_t positions_for(const Engine& e, const GenParams& p) {
  return std::min<int64_t>(static_cast<int64_t>(p.prompt.size()) + p.max_tokens, e.info().context);
}

void Scheduler::submit(const std::shared_ptr<Job>& job) {
  const GenParams& p = job->params;
  const int64_t budget = engine_.info().memory_budget;
  const int64_t need = static_cast<int64_t>(engine_.sequence_bytes(positions_for(engine_, p), opt_.draft > 0)) * p.n;
  if (budget > 0 && need > budget)
    throw Error("this request's cache (" + std::to_string(need >> 20) + " MiB for " + std::to_string(p.n) + " x " +
                    std::to_string(positions_for(engine_, p)) + " positions) exceeds the server's KV budget (" +
                    std::to_string(budget >> 20) + " MiB): lower max_tokens, n or the prompt");
  if (p.n > opt_.max_batch)
    throw Error("n = " + std::to_string(p.n) + " exceeds the server's batch size (" + std::to_string(opt_.max_batch) + ")");
  {
    std::lock_guard<std::mutex> l(mu_);
    // Nothing would answer it: the thread has ended or is ending.
    if (stop_) throw Error("the server is shutting down", ErrorKind::ResourceExhausted);
    const int free = std::max(0, opt_.max_batch - live_choices_.load());
    if (static_cast<int>(waiting_.size()) >= opt_.max_queue + free)
      throw Error("the server is busy: " + std::to_string(waiting_.size()) + " requests are waiting", ErrorKind::ResourceExhausted);
    waiting_.push_back(job);
  }
  cv_.notify_all();
}

void Scheduler::loop() {
  for (;;) {
    std::vector<std::shared_ptr<Job>> arrived;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !waiting_.empty() || !active_.empty(); });
      if (stop_) break;
    }
    // Admission in arrival order: a job that does not fit yet blocks the ones behind it, so a
    // large request is not starved by a stream of small ones.
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::lock_guard<std::mutex> l(mu_);
        while (!waiting_.empty() && waiting_.front()->cancelled()) {
          waiting_.front()->push(Event::failed(Error("cancelled", ErrorKind::ResourceExhausted)));
          waiting_.pop_front();
        }
        if (waiting_.empty()) break;
        job = waiting_.front();
      }
      if (!admit(job)) break;
      std::lock_guard<std::mutex> l(mu_);
      waiting_.pop_front();
    }
    // Every running job paused: nothing to step until a client reads (or leaves) or a job comes.
    if (!active_.empty() && !step()) {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, std::chrono::milliseconds(5), [&] { return stop_ || !waiting_.empty(); });
    }
  }
  for (auto& a : active_) a->job->push(Event::failed(Error("server shutting down", ErrorKind::ResourceExhausted)));
  active_.clear();
}

bool Scheduler::admit(const std::shared_ptr<Job>& job) {
  const GenParams& p = job->params;
  int live = 0;
  int64_t promised = 0;
  for (auto& a : active_) {
    live += static_cast<int>(a->choices.size()) + (a->prefilled ? 0 : a->job->params.n - 1);
    promised += a->promised;
  }
  if (live > 0 && live + p.n > opt_.max_batch) return false;
  auto a = std::make_unique<Active>();
  a->job = job;
  a->max_positions = positions_for(engine_, p);
  const int64_t per_seq = static_cast<int64_t>(engine_.sequence_bytes(a->max_positions, opt_.draft > 0));
  const int64_t budget = engine_.info().memory_budget;
  if (budget > 0 && engine_.reserved_bytes() + promised + per_seq * p.n > budget) {
    if (!active_.empty()) return false;  // wait for running jobs to free their reservations
    // Nothing else holds memory (snapshots are not reserved): it can never fit.
    job->push(Event::failed(Error("the request does not fit the KV budget", ErrorKind::ResourceExhausted)));
    return true;
  }
  try {
    Sequence seq;
    if (auto hit = cache_.lookup(p.prompt)) {
      // Restoring needs room for the snapshot's positions (it may reach past this job's end).
      seq = engine_.restore(hit->snap, std::max(a->max_positions, hit->snap.pos()));
      engine_.truncate(seq, hit->common);
      a->cached = hit->common;
    } else {
      seq = engine_.new_sequence({.mtp = opt_.draft > 0, .max_positions = a->max_positions});
    }
    a->pending.assign(p.prompt.begin() + a->cached, p.prompt.end());
    a->promised = per_seq * (p.n - 1);
    a->choices.push_back(std::make_unique<Choice>(0, std::move(seq), p, engine_.tokenizer(), json_vocab(p)));
  } catch (const Error& e) {
    if (e.kind == ErrorKind::ResourceExhausted && !active_.empty()) return false;
    job->push(Event::failed(e));
    return true;
  }
  active_.push_back(std::move(a));
  update_stats();
  return true;
}

// Whether choice c's next pick can run inside the step (StepRequest::sampler: on cuda on the
// device, only the id coming back): no penalties (they need the history), candidates the
// backend takes, no log-probabilities asked (they need the logits), no logit bias and no JSON
// constraint (host work on the logits).
bool Scheduler::picks_in_step(const Active& a, const Choice& c) const {
  const ModelInfo& info = engine_.info();
  return a.job->params.top_logprobs < 0 && !c.sampler.penalised() && !c.json && a.job->params.logit_bias.empty() &&
         c.sampler.candidates(info.vocab) <= info.sample_candidates;
}

std::shared_ptr<const JsonVocab> Scheduler::json_vocab(const GenParams& p) {
  if (!p.json) return nullptr;
  if (!json_vocab_) json_vocab_ = std::make_shared<const JsonVocab>(engine_.tokenizer(), engine_.info().vocab, engine_.info().eos);
  return json_vocab_;
}

// Choice c's next token from its logits. With a logit bias or a JSON constraint the pick is from
// the adjusted logits (the log-probabilities stay the model's), and pushed into the constraint.
// Reads and changes choice c's state only (its sampler, constraint and history), so the picks of
// different choices may run at once. Throws dsv4::Error when the constraint fails its own
// invariants.
int32_t Scheduler::pick_id(const Active& a, Choice& c, const float* logits) const {
  const int64_t V = engine_.info().vocab;
  const auto& bias = a.job->params.logit_bias;
  if (!c.json && bias.empty()) return c.sampler.sample(logits, V, c.generated);
  thread_local std::vector<float> masked;  // the adjusted logits, V floats per picking thread
  return adjusted_pick(c.sampler, logits, V, c.generated, bias, c.json ? &*c.json : nullptr, masked);
}

// pick_id, or -1 with the job failed.
int32_t Scheduler::pick(Active& a, Choice& c, const float* logits) {
  try {
    return pick_id(a, c, logits);
  } catch (const Error& e) {
    fail_pick(a, e);
    return -1;
  }
}

void Scheduler::fail_pick(Active& a, const Error& e) {
  a.gone = true;
  a.job->push(Event::failed(Error(e.what(), ErrorKind::Internal)));
}

// Samples choice c's next token from its logits and sends what it releases.
void Scheduler::emit(Active& a, Choice& c, const float* logits) {
  if (a.gone) return;  // an earlier choice of the job failed
  if (const int32_t id = pick(a, c, logits); id >= 0) emit_id(a, c, id, logits);
}

// The log-probabilities of token `id` and of the `top` most likely tokens in the model's
// distribution (before penalties and temperature). Reads only its arguments: the pooled picks
// compute them beside the pick (a double logsumexp over V, ~1 ms, plus a partial sort).
TokenLogprobs token_logprobs(const float* logits, int64_t V, int32_t id, int64_t top) {
  double mx = -INFINITY, sum = 0;
  for (int64_t v = 0; v < V; ++v) mx = std::max<double>(mx, logits[v]);
  for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[v] - mx);
  const double lse = mx + std::log(sum);
  TokenLogprobs r;
  r.logprob = static_cast<float>(logits[id] - lse);
  if (top > 0) {
    // In the one top-k order (core/rank_key.h): a float comparator is no order once a NaN is in
    // the row, and std::partial_sort's result is then unspecified.
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) idx[static_cast<size_t>(v)] = static_cast<int32_t>(v);
    const auto k = std::min<int64_t>(top, V);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t x, int32_t y) {
      const uint32_t a = rank_key(logits[x]), b = rank_key(logits[y]);
      return a < b || (a == b && x < y);
    });
    for (int64_t i = 0; i < k; ++i) r.top.push_back({idx[i], static_cast<float>(logits[idx[i]] - lse)});
  }
  return r;
}

// Sends what choice c's next token `id` releases; logits (for the log-probabilities) may be null
// when none are asked, or when `lp` brings them already computed.
void Scheduler::emit_id(Active& a, Choice& c, int32_t id, const float* logits, TokenLogprobs* lp) {
  const GenParams& p = a.job->params;
  const ModelInfo& info = engine_.info();
  const int64_t V = info.vocab;
  const auto now = Clock::now();
  if (c.generated.empty() && c.index == 0) {
    const double t = std::chrono::duration<double>(now - a.job->submitted_).count();
    {
      std::lock_guard<std::mutex> l(a.job->mu_);
      a.job->ttft_ = t;
    }
    metrics_.ttft(t);
  } else if (!c.generated.empty()) {
    metrics_.token_latency(std::chrono::duration<double>(now - c.last).count());
  }
  c.last = now;
  if (id == info.eos) return finish_choice(a, c, "eos");
  if (std::find(p.stop_tokens.begin(), p.stop_tokens.end(), id) != p.stop_tokens.end()) return finish_choice(a, c, "stop_token");
  c.generated.push_back(id);
  c.ids.push_back(id);
  if (p.top_logprobs >= 0) {
    TokenLogprobs here;
    if (lp == nullptr) here = token_logprobs(logits, V, id, p.top_logprobs), lp = &here;
    c.logprobs.push_back(lp->logprob);
    c.top.push_back(std::move(lp->top));
  }
  const bool stopped = c.filter.push(c.dec.push(id));
  if (c.calls && first_call_ended(c)) return finish_choice(a, c, "tool_call", false);
  if (stopped) return finish_choice(a, c, "stop_string");
  if (!c.released.empty()) {
    Event e = Event::of(Event::Text, c.index);
    e.text = std::move(c.released);
    e.ids = std::move(c.ids);
    e.logprobs = std::move(c.logprobs);
    e.top = std::move(c.top);
    c.released.clear(), c.ids.clear(), c.logprobs.clear(), c.top.clear();
    a.job->push(std::move(e));
  }
  if (static_cast<int64_t>(c.generated.size()) >= p.max_tokens) return finish_choice(a, c, "length");
  // The token would be fed at position pos() (keep, while drafts are verified): the sequence
  // holds at most max_positions.
  if ((c.keep >= 0 ? c.keep : c.seq.pos()) >= a.max_positions) return finish_choice(a, c, "length");
  c.next = id;
}

// How many drafts choice c feeds after its next token: at most opt_.draft, leaving each verified
// row a place (the sequence's max_positions) and a use (max_tokens: n drafts yield up to n + 1
// tokens).
int64_t Scheduler::drafts_for(const Active& a, const Choice& c) const {
  const int64_t left = a.job->params.max_tokens - static_cast<int64_t>(c.generated.size());
  return std::max<int64_t>(0, std::min<int64_t>({opt_.draft, a.max_positions - c.seq.pos() - 1, left - 1}));
}

// After a step that fed c.next and c.drafts with the logits of every row: the picks of
// check_drafts (engine/generate.h) go out one by one; what follows the last valid row is rewound.
void Scheduler::verify(Active& a, Choice& c, const std::vector<float>& logits) {
  if (a.gone) return;  // an earlier choice of the job failed
  const int64_t V = engine_.info().vocab, n = static_cast<int64_t>(c.drafts.size());
  const int64_t base = c.seq.pos() - n - 1;  // before next
  // Rows are picked in order, each after the one before was emitted: a biased or constrained pick
  // (whose mask depends on the picks before it) is the one decoding without drafts makes.
  const int64_t used = check_drafts([&](const float* row) { return pick(a, c, row); }, logits.data(), V, c.drafts,
                                    [&](int32_t id, int64_t rows) {
                                      if (id < 0) return false;  // the job failed
                                      c.keep = base + rows;      // next and the drafts confirmed so far
                                      emit_id(a, c, id, logits.data() + (rows - 1) * V);
                                      return !c.done;
                                    });
  c.keep = -1;
  if (!c.done && c.seq.pos() > base + used) engine_.truncate(c.seq, base + used);
  metrics_.drafts(n, used - 1);
}

// Feeds the text choice c's token released (c.released) to its reading of calls. When the first
// call ended there whole, the text is cut right after its "</｜DSML｜invoke>" and true returned.
// A whole call ends at a '>', so the text is fed in pieces that end at each '>' to find the place.
bool Scheduler::first_call_ended(Choice& c) {
  const std::string_view text = c.released;
  for (size_t at = 0; at < text.size();) {
    const size_t gt = text.find('>', at);
    const size_t end = gt == std::string_view::npos ? text.size() : gt + 1;
    for (const auto& e : c.calls->feed(text.substr(at, end - at))) {
      if (e.kind != CompletionEvent::Kind::ToolCallEnd) continue;
      if (!c.calls->call_whole(e.index)) {  // cut short by malformed markup: read no further
        c.calls.reset();
        return false;
      }
      c.released.resize(end);
      return true;
    }
    at = end;
  }
  return false;
}

void Scheduler::finish_choice(Active& a, Choice& c, const std::string& reason, bool held) {
  // Drafts past the end are not part of the answer's state.
  if (c.keep >= 0 && c.seq.pos() > c.keep && !c.seq.broken()) engine_.truncate(c.seq, c.keep);
  if (held && !c.filter.stopped()) {
    c.filter.push(c.dec.flush());
    c.filter.finish();
  }
  if (!c.released.empty() || !c.ids.empty()) {
    Event e = Event::of(Event::Text, c.index);
    e.text = std::move(c.released);
    e.ids = std::move(c.ids);
    e.logprobs = std::move(c.logprobs);
    e.top = std::move(c.top);
    c.released.clear();
    a.job->push(std::move(e));
  }
  Event f = Event::of(Event::Finish, c.index);
  f.finish_reason = reason;
  f.stop_string = c.filter.matched();
  a.job->push(std::move(f));
  c.done = true;
  // The state after the answer: a follow-up turn that quotes it verbatim (chat mode) reuses it.
  if (a.job->params.n == 1 && !c.seq.broken()) cache_.insert(engine_.snapshot(c.seq), a.job->params.answer_reused);
}

// Records a finished job's usage; its Done event goes out once it has left (step()).
void Scheduler::retire(Active& a) {
  Usage u;
  u.prompt_tokens = static_cast<int64_t>(a.job->params.prompt.size());
  u.cached_tokens = a.cached;
  for (auto& c : a.choices) u.completion_tokens += static_cast<int64_t>(c->generated.size());
  {
    std::lock_guard<std::mutex> l(a.job->mu_);
    a.job->usage_ = u;
  }
  metrics_.tokens(u.prompt_tokens, u.completion_tokens, u.cached_tokens);
}

int64_t prefill_budget(const SchedulerOptions& o, int64_t decode_tokens) {
  const int64_t limit = decode_tokens > 0 ? o.step_tokens_decoding : o.step_tokens;
  return std::max<int64_t>(limit - decode_tokens, 32);
}

bool Scheduler::step() {
  // Cancelled jobs leave before the step: their sequences (and reservations) are freed now.
  std::erase_if(active_, [](const std::unique_ptr<Active>& a) { return a->job->cancelled(); });
  // Decided once per step, so a job is drafted for exactly when it is decoded. A paused job
  // resumes once its client has caught up: every queued event taken and no write under way.
  // (Resuming as soon as a blocked write went through let a stopped reader's job run a step
  // each time its socket took a few more bytes: TCP opens a receive window in steps even while
  // the reader sleeps.)
  int64_t paused = 0;
  for (auto& a : active_) {
    const auto blocked = a->job->blocked_for();
    const size_t backlog = a->job->backlog();
    const bool stop = blocked >= kPauseBlocked || backlog >= kPauseBacklog * a->choices.size();
    const bool caught_up = blocked.count() == 0 && backlog == 0;
    a->paused = a->prefilled && (stop || (a->paused && !caught_up));
    paused += a->paused;
  }
  paused_ = paused;
  update_stats();

  std::vector<StepRequest> reqs;
  struct Slot {
    Active* a;
    Choice* c;       // decode: the choice; prefill: choice 0
    bool prefill_end;
  };
  std::vector<Slot> slots;
  if (opt_.draft > 0) {
    // The MTP block's drafts for every decoding choice, in one batched call.
    std::vector<DraftRequest> dr;
    std::vector<Choice*> drafting;
    for (auto& a : active_)
      if (a->prefilled && !a->gone && !a->paused)
        for (auto& c : a->choices) {
          c->drafts.clear();
          if (c->done) continue;
          if (const int64_t n = drafts_for(*a, *c); n > 0) dr.push_back({&c->seq, c->next, n}), drafting.push_back(c.get());
        }
    if (!dr.empty()) {
      try {
        std::vector<std::vector<int32_t>> d = engine_.draft(dr);
        for (size_t i = 0; i < drafting.size(); ++i) drafting[i]->drafts = std::move(d[i]);
      } catch (const Error& e) {
        // Like a failed step: the drafting jobs fail, the others go on.
        for (auto& a : active_)
          for (auto& c : a->choices)
            if (!a->gone && std::find(drafting.begin(), drafting.end(), c.get()) != drafting.end())
              a->gone = true, a->job->push(Event::failed(e));
        std::erase_if(active_, [](const std::unique_ptr<Active>& a) { return a->gone; });
        update_stats();
        return true;
      }
    }
  }
  int64_t decode_tokens = 0;
  for (auto& a : active_)
    if (a->prefilled && !a->paused)
      for (auto& c : a->choices)
        if (!c->done) {
          reqs.push_back({&c->seq, {c->next}, Rows::Last});
          if (!c->drafts.empty()) {
            reqs.back().tokens.insert(reqs.back().tokens.end(), c->drafts.begin(), c->drafts.end());
            reqs.back().logits = Rows::All;
          } else if (picks_in_step(*a, *c)) {
            reqs.back().sampler = &c->sampler;
          }
          decode_tokens += static_cast<int64_t>(reqs.back().tokens.size());
          slots.push_back({a.get(), c.get(), false});
        }
  int64_t budget = prefill_budget(opt_, decode_tokens);
  for (auto& a : active_) {
    if (a->prefilled || budget <= 0) continue;
    const int64_t n = std::min<int64_t>(budget, static_cast<int64_t>(a->pending.size()));
    const bool end = n == static_cast<int64_t>(a->pending.size());
    reqs.push_back({&a->choices[0]->seq, {a->pending.begin(), a->pending.begin() + n}, end ? Rows::Last : Rows::None});
    a->pending.erase(a->pending.begin(), a->pending.begin() + n);
    slots.push_back({a.get(), a->choices[0].get(), end});
    budget -= n;
  }
  if (reqs.empty()) return false;

  const auto t0 = Clock::now();
  std::vector<StepResult> out;
  int64_t prefill = 0;
  for (size_t i = 0; i < reqs.size(); ++i)
    if (!slots[i].a->prefilled) prefill += static_cast<int64_t>(reqs[i].tokens.size());
  try {
    out = engine_.step(reqs);
  } catch (const Error& e) {
    // The step's sequences may be half-written: every job in it fails; the others go on.
    for (auto& s : slots)
      if (!s.a->gone) s.a->gone = true, s.a->job->push(Event::failed(e));
    std::erase_if(active_, [](const std::unique_ptr<Active>& a) { return a->gone; });
    update_stats();
    return true;
  }
  metrics_.step(static_cast<int64_t>(reqs.size()), prefill, std::chrono::duration<double>(Clock::now() - t0).count());

  // The decoding rows picked on the host (penalties, a logit bias, a JSON constraint or
  // log-probabilities asked; no drafts): 3.5-6 ms a row over V = 129,280 (docs/perf.md "Session
  // 38"), one after another they added up. Each pick reads and changes only its own choice, so
  // the rows are picked on the pool first, then emitted in slot order as before: the same
  // tokens and events as picking them one at a time.
  // A single such row is picked in the loop below.
  std::vector<size_t> host;
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i].a->prefilled && !slots[i].prefill_end && slots[i].c->drafts.empty() && !reqs[i].sampler) host.push_back(i);
  std::vector<char> pooled(slots.size(), 0);
  std::vector<int32_t> picked(slots.size(), -1);
  std::vector<TokenLogprobs> logprobs(slots.size());  // pooled rows whose job asks for them
  std::vector<std::optional<Error>> pick_error(slots.size());
  if (host.size() > 1) {
    for (size_t i : host) pooled[i] = 1;
    const int64_t V = engine_.info().vocab;
    thread_pool().parallel_for(static_cast<int64_t>(host.size()), [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) {
        const size_t i = host[static_cast<size_t>(j)];
        try {
          picked[i] = pick_id(*slots[i].a, *slots[i].c, out[i].logits.data());
          if (const int64_t top = slots[i].a->job->params.top_logprobs; top >= 0)
            logprobs[i] = token_logprobs(out[i].logits.data(), V, picked[i], top);
        } catch (const Error& x) {
          pick_error[i] = x;
        }
      }
    });
  }

  for (size_t i = 0; i < slots.size(); ++i) {
    Active& a = *slots[i].a;
    if (a.gone) continue;
    if (!slots[i].prefill_end && !a.prefilled) {
      // A middle chunk of a long prompt: a snapshot every kSnapshotEvery positions, so a prompt
      // that shares only its beginning with this one (a long system prompt or document, then
      // something else) still reuses most of it.
      const int64_t pos = a.choices[0]->seq.pos(), before = pos - static_cast<int64_t>(reqs[i].tokens.size());
      if (pos / kSnapshotEvery > before / kSnapshotEvery) cache_.insert(engine_.snapshot(a.choices[0]->seq));
      continue;
    }
    if (slots[i].prefill_end) {
      a.prefilled = true;
      cache_.insert(engine_.snapshot(a.choices[0]->seq), true);
      const GenParams& p = a.job->params;
      try {
        a.promised = 0;
        for (int k = 1; k < p.n; ++k)
          a.choices.push_back(std::make_unique<Choice>(k, engine_.fork(a.choices[0]->seq), p, engine_.tokenizer(), json_vocab(p)));
      } catch (const Error& e) {
        a.gone = true;
        a.job->push(Event::failed(e));
        continue;
      }
      // Every choice starts from the prompt's last logits.
      for (auto& c : a.choices) emit(a, *c, out[i].logits.data());
      continue;
    }
    if (!slots[i].c->drafts.empty()) {
      verify(a, *slots[i].c, out[i].logits);
    } else if (reqs[i].sampler) {
      emit_id(a, *slots[i].c, out[i].ids.at(0), nullptr);
    } else if (pooled[i]) {
      if (pick_error[i]) {
        fail_pick(a, *pick_error[i]);
      } else {
        emit_id(a, *slots[i].c, picked[i], out[i].logits.data(), &logprobs[i]);
      }
    } else {
      emit(a, *slots[i].c, out[i].logits.data());
    }
  }
  std::vector<std::shared_ptr<Job>> finished;
  for (auto& a : active_)
    if (!a->gone && a->prefilled &&
        std::all_of(a->choices.begin(), a->choices.end(), [](const std::unique_ptr<Choice>& c) { return c->done; }))
      retire(*a), a->gone = true, finished.push_back(a->job);
  std::erase_if(active_, [](const std::unique_ptr<Active>& a) { return a->gone || a->job->cancelled(); });
  update_stats();
  // Done only now, its sequences freed and the counts updated: a client that has its answer
  // finds /metrics without it (before, it could still count as running for a moment).
  for (auto& j : finished) j->push(Event::of(Event::Done));
  return true;
}

}  // namespace dsv4::server
