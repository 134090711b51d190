#pragma once
// Autoregressive generation over one sequence: prefill the prompt, then sample, stream text,
// and stop at EOS, a stop token, a stop string, the token budget or the context limit.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "gen/sampler.h"
#include "model/forward.h"
#include "text/tokenizer.h"

namespace dsv4 {

struct GenerateOptions {
  int64_t max_new_tokens = 256;
  std::vector<int32_t> stop_tokens;       // in addition to the model's EOS
  std::vector<std::string> stop_strings;  // generation ends before the first occurrence
  SamplingParams sampling;
  int64_t prefill_chunk = 0;              // 0 = the whole prompt in one chunk
  int64_t context_limit = 0;              // 0 = the model's max_position_embeddings
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, the stop token excluded
  std::string text;             // their text, cut before a stop string
  std::string stop_reason;      // "eos", "stop_token", "stop_string", "max_tokens", "context_limit"
  int64_t prompt_tokens = 0;    // tokens actually prefilled (after prefix reuse)
  double prefill_s = 0, decode_s = 0;
};

using TextSink = std::function<void(std::string_view)>;

// A sequence plus the tokens it has consumed, so a follow-up prompt that extends them only
// prefills the new suffix (multi-turn chat).
struct Session {
  SequenceState state;
  std::vector<int32_t> fed;
};

Session new_session(const Model& m);

// Generates from `prompt` (all ids, including any prefix already in `s`). Text is streamed to
// `sink` as complete UTF-8 characters; text that could still become a stop string is held back
// until it cannot. Throws dsv4::Error when the prompt does not fit the context limit.
GenerateResult generate(const Model& m, Session& s, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                        const GenerateOptions& opt, const TextSink& sink);

}  // namespace dsv4
