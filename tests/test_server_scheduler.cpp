// The scheduler's per-step prompt budget (docs/server.md, Scheduling).
#include <gtest/gtest.h>

#include "server/scheduler.h"

using namespace dsv4::server;

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
