#pragma once
// A JSON schema's `pattern` (an ECMA-262 regular expression, unanchored unless it says ^ / $) as
// a small NFA over code points, run on a string value's characters as they are written
// (text/json_grammar.h). The state is a set of at most kMaxStates NFA states: two 64-bit words,
// kept in the string's frame, so copying a grammar state stays cheap.
//
// The subset: literals; escapes \d \D \w \W \s \S, \t \n \r \f \v \0, \xHH, \uHHHH, \u{H...}
// and an escaped syntax character; `.` (any character but a line terminator); classes [...] with
// ranges, negation and the escapes above; groups (...) and (?:...); alternation |; quantifiers
// * + ? {n} {n,} {n,m} (lazy ones too: same language); ^ at the very start and $ at the very end.
// Refused with the keyword's path: backreferences, lookaround, word boundaries, named groups,
// anchors elsewhere (or beside a top-level |), groups nested more than 32 deep, and patterns of
// more than kMaxStates states (counted repetitions are copies: \d{4} is four states).
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsv4 {

class JsonPattern {
 public:
  static constexpr int kMaxStates = 128;
  using Set = std::array<uint64_t, 2>;

  // Throws SchemaError(path, why) for what the subset does not hold.
  static JsonPattern compile(std::string_view re, const std::string& path);

  // The states before any character.
  Set start() const { return start_; }
  // After character cp (the empty set when it cannot come).
  Set step(const Set& s, uint32_t cp) const;
  // Some character in [lo, hi] can come next, leaving a set from which the pattern can still
  // match (the prefix property, for a character still being written).
  bool any_in(const Set& s, uint32_t lo, uint32_t hi) const;
  // The characters so far match: the string may end here.
  bool accepts(const Set& s) const;
  // The states its construction took, splits included (a schema's patterns share a budget).
  int built_states() const { return built_; }

 private:
  using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // sorted, disjoint, inclusive
  friend struct PatternCompiler;
  // Per state (character states, then the match state): the characters it takes and the states
  // it leads to (closed over the splits), and whether those can still reach the match.
  std::vector<Ranges> cls_;
  std::vector<Set> to_;
  std::vector<uint8_t> live_;
  Set start_{}, match_{};
  int built_ = 0;
};

}  // namespace dsv4
