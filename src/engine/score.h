#pragma once
// Logits for every position of token sequences, fed as the CLI's `score` does: the first
// `prefill` tokens in chunks of `chunk` (0 = one chunk), the rest one decode step at a time.
// Several sequences advance together through shared batched steps (each step takes the next
// piece of every unfinished sequence), so one can still be prefilling while others decode.
#include <cstdint>
#include <vector>

#include "engine/engine.h"

namespace dsv4 {

struct ScoreJob {
  std::vector<int32_t> tokens;
  int64_t prefill = 0;  // tokens fed as prefill chunks; the rest one by one
  int64_t chunk = 0;    // prefill chunk size (0 = all at once)
  bool mtp = false;     // also the MTP block's logits
  // Results: [T, vocab]; with mtp, [T - 1, vocab], row t = the block at position t given token
  // t+1, predicting token t+2.
  std::vector<float> logits, mtp_logits;
};

// Runs every job through shared steps. Throws Error for an out-of-range prefill / chunk.
void score(Engine& e, std::vector<ScoreJob>& jobs);

// One sequence alone.
std::vector<float> score_tokens(Engine& e, const std::vector<int32_t>& tokens, int64_t prefill, int64_t chunk);

}  // namespace dsv4
