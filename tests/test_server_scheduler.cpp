// The scheduler's per-step prompt budget (docs/server.md, Scheduling), its pausing of a job
// whose client does not take its output, and its host-side picks of several rows at once.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <thread>

#include "server/scheduler.h"
#include "test_util.h"
#include "text/json_grammar.h"

using namespace dsv4;
using namespace dsv4::server;
using namespace dsv4::testing;

// token_logprobs' top list against a full sort in the one top-k order (value descending, ties to
// the lower id, -0 == +0, NaN last), on logits with many ties, signed zeros and NaN; and the
// sampled token's log-probability against a plain logsumexp.
TEST(TokenLogprobs, TopEqualsAFullSortAndLogprobIsLogSoftmax) {
  const int64_t V = 5000;
  std::vector<float> l(static_cast<size_t>(V));
  uint64_t st = 12345;
  for (auto& x : l) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int>((st >> 33) % 64) - 40) * 0.25f;  // few values: ties
  }
  l[7] = -0.0f, l[8] = 0.0f, l[9] = std::nanf(""), l[4999] = 11.75f, l[3] = 11.75f;
  for (int64_t top : {1, 5, 20}) {
    const TokenLogprobs r = token_logprobs(l.data(), V, 42, top);
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int32_t v = 0; v < V; ++v) idx[static_cast<size_t>(v)] = v;
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
      const float x = l[static_cast<size_t>(a)], y = l[static_cast<size_t>(b)];
      return !std::isnan(x) && (std::isnan(y) || x > y);
    });
    ASSERT_EQ(r.top.size(), static_cast<size_t>(top));
    for (int64_t i = 0; i < top; ++i) EXPECT_EQ(r.top[static_cast<size_t>(i)].id, idx[static_cast<size_t>(i)]) << "top " << top << " rank " << i;
    EXPECT_EQ(r.top[0].id, 3);  // 11.75 at ids 3 and 4999: the lower id first
  }
  std::vector<float> f(l.begin(), l.end());
  f[9] = 0.0f;  // no NaN: a finite logsumexp
  double mx = -INFINITY, sum = 0;
  for (float x : f) mx = std::max<double>(mx, x);
  for (float x : f) sum += std::exp(x - mx);
  const TokenLogprobs r = token_logprobs(f.data(), V, 42, 0);
  EXPECT_EQ(r.logprob, static_cast<float>(f[42] - (mx + std::log(sum))));
  EXPECT_TRUE(r.top.empty());
}

TEST(SchedulerBudget, SmallerWhileDecoding) {
  SchedulerOptions o;
  o.step_tokens = 256;
  o.step_tokens_decoding = 64;
  EXPECT_EQ(prefill_budget(o, 0), 256);   // nothing decoding: the whole step for prompts
  EXPECT_EQ(prefill_budget(o, 1), 63);    // one stream waits on the step: a small chunk
  EXPECT_EQ(prefill_budget(o, 16), 48);
  EXPECT_EQ(prefill_budget(o, 40), 32);   // never below 32, so prompts progress
  o.step_tokens_decoding = 1000;
  EXPECT_EQ(prefill_budget(o, 8), 992);
  o.step_tokens = 10;
  EXPECT_EQ(prefill_budget(o, 0), 32);
}

// A scheduler over the tiny golden model with the real tokenizer (skipped without it).
class SchedulerOnTinyModel : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string t = tokenizer_dir() + "/tokenizer.json";
    if (!std::filesystem::exists(t)) GTEST_SKIP() << "no " << t << " (scripts/test.sh fetches it)";
    engine_ = std::make_unique<Engine>(EngineOptions{.model_dir = golden_dir("tiny-native") + "/model", .tokenizer = t});
    sched_ = std::make_unique<Scheduler>(*engine_, SchedulerOptions{}, metrics_);
  }
  Metrics metrics_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Scheduler> sched_;
};

// stop(): a running job and a queued one end with Failed (the running one well before its
// max_tokens), and a submit after it is refused. Before, only the destructor stopped, so the
// server's stop waited for every answer in progress to run out.
TEST_F(SchedulerOnTinyModel, StopFailsRunningAndQueuedJobsAndRefusesNewOnes) {
  SchedulerOptions o;
  o.max_batch = 1;  // the second job waits in the queue
  sched_.reset();
  sched_ = std::make_unique<Scheduler>(*engine_, o, metrics_);
  GenParams p;
  p.prompt = {5, 17, 99, 3, 42};
  p.max_tokens = 4000;
  p.sampling.temperature = 0;
  auto running = std::make_shared<Job>(p), queued = std::make_shared<Job>(p);
  sched_->submit(running);
  sched_->submit(queued);
  Event e;
  ASSERT_TRUE(running->next(e, std::chrono::seconds(30)));  // it has started
  sched_->stop();
  auto ends_failed = [&](Job& job, int64_t& texts) {
    texts = 0;
    while (job.next(e, std::chrono::seconds(10))) {
      if (e.kind == Event::Failed) return std::string(e.error.what());
      if (e.kind == Event::Done) return std::string("done");
      texts += e.kind == Event::Text;
    }
    return std::string("no end");
  };
  int64_t texts = 0;
  EXPECT_EQ(ends_failed(*running, texts), "server shutting down");
  EXPECT_LT(texts, 3000);
  EXPECT_EQ(ends_failed(*queued, texts), "server shutting down");
  EXPECT_EQ(texts, 0);
  EXPECT_EQ(sched_->queue_depth(), 0);
  try {
    sched_->submit(std::make_shared<Job>(p));
    FAIL() << "a submit after stop() was accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind, ErrorKind::ResourceExhausted);
    EXPECT_NE(std::string(err.what()).find("shutting down"), std::string::npos) << err.what();
  }
}

// Pausing a job whose client does not take its output (Scheduler, kPauseBacklog and
// kPauseBlocked): a paused job makes no events, and once its client takes them it resumes with
// the answer an eagerly read job gets, token for token (greedy).
class SchedulerPause : public SchedulerOnTinyModel {
 protected:
  void SetUp() override {
    SchedulerOnTinyModel::SetUp();
    if (IsSkipped()) return;
    p_.prompt = {5, 17, 99, 3, 42};
    p_.max_tokens = 3 * static_cast<int64_t>(kPauseBacklog);
    p_.sampling.temperature = 0;
    auto eager = std::make_shared<Job>(p_);
    sched_->submit(eager);
    ASSERT_TRUE(drain(*eager, want_, want_finish_));
    ASSERT_GT(want_.size(), kPauseBacklog) << "the answer must be long enough to pause (" << want_finish_ << ")";
  }
  // Every Text event's ids, up to Done; false when Failed came or nothing did.
  static bool drain(Job& job, std::vector<int32_t>& ids, std::string& finish) {
    Event e;
    while (job.next(e, std::chrono::seconds(30))) {
      if (e.kind == Event::Failed) return false;
      if (e.kind == Event::Text) ids.insert(ids.end(), e.ids.begin(), e.ids.end());
      if (e.kind == Event::Finish) finish = e.finish_reason;
      if (e.kind == Event::Done) return true;
    }
    return false;
  }
  // Waits (while `meanwhile` runs) until the scheduler reports a paused job.
  bool wait_paused(const std::function<void()>& meanwhile = [] {}) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (sched_->stats().paused == 0 && std::chrono::steady_clock::now() < deadline) {
      meanwhile();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return sched_->stats().paused == 1;
  }
  GenParams p_;
  std::vector<int32_t> want_;
  std::string want_finish_;
};

// Nobody takes the events: paused once kPauseBacklog of them wait.
TEST_F(SchedulerPause, UntakenEventsPauseTheJobAndTakingThemResumesIt) {
  auto idle = std::make_shared<Job>(p_);
  sched_->submit(idle);
  ASSERT_TRUE(wait_paused());
  EXPECT_EQ(sched_->running(), 1);  // paused, not freed
  const size_t backlog = idle->backlog();
  EXPECT_GE(backlog, kPauseBacklog);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(idle->backlog(), backlog) << "a paused job made events";

  // Taking some of them does not resume it: it waits until its client has caught up (else a
  // stopped reader whose socket takes a few more bytes now and then gets a step each time).
  std::vector<int32_t> got;
  std::string got_finish;
  Event e;
  ASSERT_TRUE(idle->next(e, std::chrono::seconds(1)));
  got.insert(got.end(), e.ids.begin(), e.ids.end());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(idle->backlog(), backlog - 1) << "resumed before its client caught up";
  EXPECT_EQ(sched_->stats().paused, 1);
  ASSERT_TRUE(drain(*idle, got, got_finish));
  EXPECT_EQ(got, want_);
  EXPECT_EQ(got_finish, want_finish_);
  EXPECT_EQ(sched_->stats().paused, 0);
}

// A write to the client is blocked (its buffers full) while the events are taken as they come:
// paused once the write has been blocked for kPauseBlocked, with no backlog, however slowly the
// model decodes. (The tiny model decodes the whole answer in less than kPauseBlocked, so the
// write is blocked before the job starts: it pauses right after its prompt.)
TEST_F(SchedulerPause, ABlockedWritePausesTheJob) {
  auto job = std::make_shared<Job>(p_);
  job->write_begin();
  std::this_thread::sleep_for(kPauseBlocked + std::chrono::milliseconds(50));
  sched_->submit(job);
  std::vector<int32_t> got;
  std::string got_finish;
  Event e;
  auto take = [&] {
    while (job->next(e, std::chrono::milliseconds(0))) got.insert(got.end(), e.ids.begin(), e.ids.end());
  };
  ASSERT_TRUE(wait_paused(take));
  take();
  const size_t before = got.size();
  EXPECT_LT(before, kPauseBacklog) << "paused for the blocked write, not for a backlog";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  take();
  EXPECT_EQ(got.size(), before) << "a paused job made events";

  job->write_end();
  ASSERT_TRUE(drain(*job, got, got_finish));
  EXPECT_EQ(got, want_);
  EXPECT_EQ(got_finish, want_finish_);
}

// parallel_tool_calls false (GenParams::end_at_first_call): the answer ends right after its first
// call's "</｜DSML｜invoke>", the text read as the response reads it. The forced prefix leaves the
// call one '>' short and a bias makes every pick ">\n" (id 1018 of the real tokenizer): the answer
// is that one token, its text cut to ">" and finished "tool_call" (text held back for a stop
// string is dropped too). Markup that breaks the call (a pick of "f", id 72) does not end it:
// the answer runs to max_tokens.
class SchedulerFirstCall : public SchedulerOnTinyModel {
 protected:
  struct Answer {
    std::string text, finish;
    std::vector<int32_t> ids;
  };
  Answer run(int32_t biased, bool first_call, const std::string& prefix_end = "</｜DSML｜invoke",
             std::vector<std::string> stop = {}) {
    GenParams p;
    p.stop = std::move(stop);
    p.prompt = {5, 17, 99, 3, 42};
    p.max_tokens = 6;
    p.sampling.temperature = 0;
    p.logit_bias = {{biased, 100.0f}};
    const std::string prefix = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n" + prefix_end;
    if (first_call) p.end_at_first_call = std::make_shared<const GenParams::FirstCall>(GenParams::FirstCall{ChatMode::Chat, nullptr, prefix});
    auto job = std::make_shared<Job>(p);
    sched_->submit(job);
    Answer a;
    Event e;
    while (job->next(e, std::chrono::seconds(30)) && e.kind != Event::Done) {
      EXPECT_NE(e.kind, Event::Failed) << e.error.what();
      if (e.kind == Event::Text) a.text += e.text, a.ids.insert(a.ids.end(), e.ids.begin(), e.ids.end());
      if (e.kind == Event::Finish) a.finish = e.finish_reason;
    }
    return a;
  }
};

TEST_F(SchedulerFirstCall, TheAnswerEndsAfterTheFirstCall) {
  const Answer a = run(1018, true);
  EXPECT_EQ(a.text, ">");
  EXPECT_EQ(a.ids, std::vector<int32_t>{1018});
  EXPECT_EQ(a.finish, "tool_call");
  // The "\n" held back for a stop string it may start is after the call: it never goes out.
  const Answer held = run(1018, true, "</｜DSML｜invoke", {"\nQ"});
  EXPECT_EQ(held.text, ">");
  EXPECT_EQ(held.finish, "tool_call");
  // Without the flag the same picks run on.
  const Answer free = run(1018, false);
  EXPECT_EQ(free.text, ">\n>\n>\n>\n>\n>\n");
  EXPECT_EQ(free.finish, "length");
  // A call broken by its markup, or not yet at its end, does not end the answer.
  const Answer broken = run(72, true);
  EXPECT_EQ(broken.text, "ffffff");
  EXPECT_EQ(broken.finish, "length");
  const Answer inside = run(1018, true, "<｜DSML｜parameter name=\"x\" string=\"true\">");
  EXPECT_EQ(inside.text, ">\n>\n>\n>\n>\n>\n");
  EXPECT_EQ(inside.finish, "length");
}

// Rows picked on the host (penalties, a logit bias, log-probabilities, a JSON constraint): when a
// step has several, Scheduler::step picks them on the thread pool, then emits them in order.
// Jobs running together must get, choice for choice, the tokens, log-probabilities and finish
// each gets alone.
class SchedulerHostPicks : public SchedulerOnTinyModel {
 protected:
  struct Answer {
    std::map<int, std::vector<int32_t>> ids;
    std::map<int, std::vector<float>> logprobs;
    std::map<int, std::vector<std::vector<std::pair<int32_t, float>>>> top;
    std::map<int, std::string> finish;
    bool operator==(const Answer&) const = default;
  };
  static Answer drain(Job& job) {
    Answer a;
    Event e;
    while (job.next(e, std::chrono::seconds(60)) && e.kind != Event::Done) {
      EXPECT_NE(e.kind, Event::Failed) << e.error.what();
      if (e.kind == Event::Text) {
        a.ids[e.choice].insert(a.ids[e.choice].end(), e.ids.begin(), e.ids.end());
        a.logprobs[e.choice].insert(a.logprobs[e.choice].end(), e.logprobs.begin(), e.logprobs.end());
        for (const auto& t : e.top) {
          a.top[e.choice].emplace_back();
          for (const TopLogprob& x : t) a.top[e.choice].back().push_back({x.id, x.logprob});
        }
      }
      if (e.kind == Event::Finish) a.finish[e.choice] = e.finish_reason;
    }
    return a;
  }
  static std::vector<GenParams> params() {
    std::vector<GenParams> ps;
    for (int k = 0; k < 6; ++k) {
      GenParams p;
      p.prompt = {5, 17, 99, 3, 42, 100 + k};
      p.max_tokens = 20;
      p.sampling.temperature = 1.0f;
      p.sampling.seed = 11 + static_cast<uint64_t>(k);
      if (k == 0) p.sampling.presence_penalty = 1.5f, p.sampling.frequency_penalty = 0.5f;
      if (k == 1) p.logit_bias = {{72, 3.0f}, {1018, 2.0f}};
      if (k == 2) p.top_logprobs = 3;
      if (k == 3) p.json = JsonGrammar::any_object();
      if (k == 4) p.sampling.repetition_penalty = 1.3f, p.n = 3;  // three choices, one prefill
      if (k == 5) p.top_logprobs = 0, p.logit_bias = {{5, -100.0f}};
      ps.push_back(p);
    }
    return ps;
  }
};

TEST_F(SchedulerHostPicks, JobsTogetherEqualEachAlone) {
  const std::vector<GenParams> ps = params();
  std::vector<Answer> alone;
  for (const GenParams& p : ps) {
    auto job = std::make_shared<Job>(p);
    sched_->submit(job);
    alone.push_back(drain(*job));
    ASSERT_EQ(alone.back().finish.size(), static_cast<size_t>(p.n));
  }
  std::vector<std::shared_ptr<Job>> jobs;
  for (const GenParams& p : ps) jobs.push_back(std::make_shared<Job>(p));
  for (auto& j : jobs) sched_->submit(j);
  std::vector<Answer> together(jobs.size());
  std::vector<std::thread> readers;
  for (size_t i = 0; i < jobs.size(); ++i) readers.emplace_back([&, i] { together[i] = drain(*jobs[i]); });
  for (auto& t : readers) t.join();
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(together[i], alone[i]) << "job " << i;
    EXPECT_FALSE(alone[i].ids.empty()) << "job " << i;
  }
  EXPECT_EQ(alone[2].top.at(0).size(), alone[2].ids.at(0).size());
  EXPECT_EQ(alone[2].top.at(0).at(0).size(), 3u);
}
