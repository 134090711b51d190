// The scheduler's per-step prompt budget (docs/server.md, Scheduling) and its pausing of a job
// whose client does not take its output.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "server/scheduler.h"
#include "test_util.h"

using namespace dsv4;
using namespace dsv4::server;
using namespace dsv4::testing;

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

// A job whose events nobody takes is paused (left out of the steps, its sequence kept) once
// kPauseBacklog of them wait, and resumes when they are taken: the answer is the one an eagerly
// read job gets, token for token (greedy), and no step runs while it is paused.
TEST(SchedulerPause, UntakenEventsPauseTheJobAndTakingThemResumesIt) {
  const std::string t = tokenizer_dir() + "/tokenizer.json";
  if (!std::filesystem::exists(t)) GTEST_SKIP() << "no " << t << " (scripts/test.sh fetches it)";
  Engine engine({.model_dir = golden_dir("tiny-native") + "/model", .tokenizer = t});
  Metrics metrics;
  Scheduler sched(engine, SchedulerOptions{}, metrics);
  GenParams p;
  p.prompt = {5, 17, 99, 3, 42};
  p.max_tokens = 3 * static_cast<int64_t>(kPauseBacklog);
  p.sampling.temperature = 0;
  // Every Text event's ids, up to Finish; false when Done or Failed came first or nothing came.
  auto drain = [](Job& job, std::vector<int32_t>& ids, std::string& finish) {
    Event e;
    while (job.next(e, std::chrono::seconds(30))) {
      if (e.kind == Event::Failed) return false;
      if (e.kind == Event::Text) ids.insert(ids.end(), e.ids.begin(), e.ids.end());
      if (e.kind == Event::Finish) finish = e.finish_reason;
      if (e.kind == Event::Done) return true;
    }
    return false;
  };
  auto eager = std::make_shared<Job>(p);
  sched.submit(eager);
  std::vector<int32_t> want;
  std::string want_finish;
  ASSERT_TRUE(drain(*eager, want, want_finish));
  ASSERT_GT(want.size(), kPauseBacklog) << "the answer must be long enough to pause (" << want_finish << ")";

  auto idle = std::make_shared<Job>(p);
  sched.submit(idle);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (sched.stats().paused == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(sched.stats().paused, 1);
  EXPECT_EQ(sched.running(), 1);  // paused, not freed
  const size_t backlog = idle->backlog();
  EXPECT_GE(backlog, kPauseBacklog);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(idle->backlog(), backlog) << "a paused job made events";

  std::vector<int32_t> got;
  std::string got_finish;
  ASSERT_TRUE(drain(*idle, got, got_finish));
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_finish, want_finish);
  EXPECT_EQ(sched.stats().paused, 0);
}
