#pragma once
// Autoregressive generation over one sequence: prefill the prompt (reusing what the session
// already holds), then sample, stream text, and stop at EOS, a stop token, a stop string, the
// token budget or the context limit. With `draft` > 0 the MTP block drafts tokens that the main
// model verifies in one step (speculative decoding: the same output as without, for any sampler).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "engine/json_constraint.h"
#include "engine/sampler.h"

namespace dsv4 {

struct GenerateOptions {
  int64_t max_new_tokens = 256;
  std::vector<int32_t> stop_tokens;       // in addition to the model's EOS
  std::vector<std::string> stop_strings;  // generation ends before the first occurrence
  SamplingParams sampling;
  int64_t prefill_chunk = 0;              // 0 = the whole prompt in one chunk
  int64_t context_limit = 0;              // 0 = the engine's context
  int64_t draft = 0;                      // MTP drafts per step (0 = off)
  // The answer is one JSON object of this grammar (engine/json_constraint.h), after its reasoning
  // when json_after_reasoning (thinking mode); null: free text. Drafts are verified row by row
  // through the mask, so the answer is the one without drafts.
  std::shared_ptr<const JsonGrammar> json;
  bool json_after_reasoning = false;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, the stop token excluded
  std::string text;             // their text, cut before a stop string
  std::string stop_reason;      // "eos", "stop_token", "stop_string", "max_tokens", "context_limit"
  int64_t prompt_tokens = 0;    // tokens actually prefilled (after prefix reuse)
  int64_t reused_tokens = 0;    // prompt tokens whose state was reused
  double prefill_s = 0, decode_s = 0;
  // Speculative decoding: main-model decode steps, tokens drafted and accepted.
  int64_t steps = 0, drafted = 0, accepted = 0;
};

using TextSink = std::function<void(std::string_view)>;

// Speculative decoding's check, after a step that fed a token and `drafts` after it with every
// row's logits (V per row): pick(row) chooses from row 0, and goes on to each next row while its
// pick equals the draft fed there, so every pick is the one decoding token by token makes. The
// rows are picked in order, each after take() has seen the one before: a pick whose rules depend
// on the picks before it (penalties on the history take appends to, a JSON constraint that
// pick pushes its token into) sees exactly what it would without drafts. take(id, rows) receives
// each pick with the rows consumed so far and returns false to stop there. Returns the rows
// consumed: the sequence keeps its first (position before the step) + rows positions, and
// rows - 1 drafts were confirmed.
int64_t check_drafts(const std::function<int32_t(const float* row)>& pick, const float* logits, int64_t V,
                     const std::vector<int32_t>& drafts, const std::function<bool(int32_t id, int64_t rows)>& take);

// A conversation's sequence plus a snapshot at the end of the last prompt, so a follow-up
// prompt that shares a prefix with either prefills only the rest: a live sequence can rewind
// kCheapRewind tokens cheaply; in thinking mode the next prompt drops the reasoning, so it
// usually diverges right after the previous prompt, where the snapshot is.
struct Session {
  Sequence seq;
  Snapshot prompt_end;
};

Session new_session(Engine& e, const GenerateOptions& opt);

// Generates from `prompt` (all ids, including any prefix already in `s`). Text is streamed to
// `sink` as complete UTF-8 characters; text that could still become a stop string is held back
// until it cannot. Throws dsv4::Error when the prompt does not fit the context limit.
GenerateResult generate(Engine& e, Session& s, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                        const TextSink& sink);

}  // namespace dsv4
