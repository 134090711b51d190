#pragma once
// Sampling constrained to JSON (the server's response_format json_object and json_schema). Before
// each pick, the tokens that cannot continue the answer are masked (their logits set to
// -infinity) and the sampler picks among the rest with its usual rules; the picked token is then
// pushed. The answer is one JSON object of the grammar (text/json_grammar.h: any object, or a
// schema's) followed by the end-of-sentence token, which is allowed only once the object is
// closed and is then the only token left.
//
// An answer that starts with reasoning (thinking mode) is free text up to "</think>", the JSON
// object after it. The reasoning may not end the answer: the end-of-sentence token and text, and
// the tool-call block's opening, which would end the reasoning without "</think>"
// (text/completion_stream.h), are masked there, and a token that writes "</think>" must be
// followed, within itself, by a JSON prefix. Added tokens (chat markup: "<｜User｜>", "｜DSML｜",
// ...) are masked everywhere, except the "</think>" token while reasoning: the answer's text then
// reads back exactly as the object the constraint checked.
//
// With tools (`tool_calls`), the answer after the reasoning may instead be a tool-call block: its
// opening text (kToolCallsOpenText, after whitespace) is allowed where the object has not begun,
// markup tokens included, and once it is written nothing more is masked (the block is the
// completion parser's, text/completion_stream.h). The reasoning still may not open a block.
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/sampler.h"
#include "text/json_grammar.h"

namespace dsv4 {

class Tokenizer;

// The vocabulary as the constraint reads it: every token's bytes and whether it may appear,
// grouped by first byte. Built once per tokenizer (~130k tokens, a few MB) and shared by every
// constrained answer.
class JsonVocab {
 public:
  // Ids in [0, vocab); ids the tokenizer does not know are masked always.
  JsonVocab(const Tokenizer& tok, int64_t vocab, int32_t eos);

  enum Kind : uint8_t { Never, Plain, ThinkEnd };
  int64_t size() const { return static_cast<int64_t>(kind_.size()); }

 private:
  friend class JsonConstraint;
  std::vector<std::string> bytes_;
  std::vector<uint8_t> kind_;
  std::vector<uint8_t> marker_end_;  // bit k: the token holds the last byte of marker k
  std::vector<uint8_t> string_text_;  // whole UTF-8 characters, none of them '"', '\\' or a control
  std::vector<uint16_t> text_chars_;  // such a token's characters
  std::array<std::vector<int32_t>, 256> by_first_;  // plain tokens by first byte
  std::vector<int32_t> not_plain_;                   // the others
  int32_t eos_ = -1, think_end_ = -1;
};

class JsonConstraint {
 public:
  // `reasoning_first`: the answer starts with reasoning (thinking mode); `tool_calls`: it may be a
  // tool-call block instead of the object.
  JsonConstraint(std::shared_ptr<const JsonVocab> vocab, std::shared_ptr<const JsonGrammar> grammar, bool reasoning_first,
                 bool tool_calls = false);
  // Masks logits[0, vocab size) in place; returns how many tokens are left (at least one).
  int64_t mask(float* logits) const;
  // The token picked (one mask() allowed). Throws dsv4::Error for a token it did not allow.
  void push(int32_t id);
  // Whether token `id` may come next (what mask() leaves).
  bool allows(int32_t id) const;
  bool reasoning() const { return reasoning_; }
  bool complete() const { return json_ok_ && json_.complete(); }
  // A tool-call block was opened: nothing is masked any more.
  bool tool_call() const { return free_; }

 private:
  // While reasoning: where "</think>" ends in tail_ + bytes (npos: it does not), or a forbidden
  // marker found (returns false).
  bool reasoning_allows(const std::string& bytes, size_t& json_from) const;
  // The answer after the reasoning: bytes can come next (the object's, or the tool-call block's
  // opening), and taking them.
  bool answer_allows(std::string_view bytes) const;
  void answer_push(std::string_view bytes);
  // Undecided between the object and a tool-call block (only whitespace written).
  bool undecided() const { return tools_ && opener_ok_ && !free_; }

  // A string pattern's NFA state sets met so far, numbered, with their successors on ASCII
  // characters filled in as they are met (a lazy DFA): the mask walks each token of text through
  // it instead of the NFA. Per answer, so nothing is shared between threads.
  struct PatternDfa {
    int pattern = -1;
    std::map<JsonPattern::Set, int32_t> ids;
    std::vector<JsonPattern::Set> sets;
    std::vector<std::array<int32_t, 128>> ascii;  // -2: not yet known, -1: refused
    std::unordered_map<uint64_t, int32_t> other;  // (set << 21 | code point) past ASCII
    uint32_t generation = 0;                      // numbering restarts (past 4096 sets)
    int32_t id(const JsonPattern::Set& s);
    int32_t next(const JsonPattern& p, int32_t from, uint32_t cp);
    // Whether text (whole UTF-8 characters) can follow from state `from`.
    bool fits(const JsonPattern& p, int32_t from, const std::string& text);
  };
  PatternDfa& dfa(int pattern) const;
  mutable std::vector<PatternDfa> dfas_;

  std::shared_ptr<const JsonVocab> vocab_;
  std::shared_ptr<const JsonGrammar> grammar_;
  bool reasoning_;
  bool tools_;
  bool json_ok_ = true;    // the object is still possible
  bool opener_ok_;         // a tool-call block is still possible (tools_, lead_ its beginning)
  bool free_ = false;      // the block was opened
  std::string lead_;       // the answer so far while a block is possible: whitespace, then its opening
  JsonGrammarState json_;
  std::string tail_;  // the answer's last bytes, as long as the longest marker less one
};

// A pick from adjusted logits, the server's and `generate`'s one way: `bias` (token, amount) added,
// then the tokens `json` does not allow masked (when given), then `sampler`'s usual rules; the
// pick is pushed into `json`. `scratch` holds the adjusted logits (V floats, reused by the
// caller). A masked token has probability 0, but the pick's running sum can round past the last
// allowed one: then the best allowed token is taken.
int32_t adjusted_pick(Sampler& sampler, const float* logits, int64_t V, const std::vector<int32_t>& history,
                      const std::vector<std::pair<int32_t, float>>& bias, JsonConstraint* json, std::vector<float>& scratch);

}  // namespace dsv4
