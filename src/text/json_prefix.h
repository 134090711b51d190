#pragma once
// Whether a byte string can still become a JSON object, decided byte by byte: the state of a
// pushdown automaton for RFC 8259 text whose top-level value is an object, in UTF-8. A sampler
// constrained to JSON (response_format json_object, engine/json_constraint.h) asks it, for every
// candidate token, whether the answer so far plus the token's bytes is still such a prefix; the
// state is a few machine words, so that test runs on a copy.
//
// Prefix property: push() refuses a byte exactly when no JSON object starts with the bytes
// accepted so far plus it. Accepted means strictly valid: no control characters, valid UTF-8 (no
// overlong forms, no surrogates), `\u` escapes with surrogates only as a high + low pair, numbers
// in JSON's grammar. Two limits, so that a model cannot stall the answer: at most kMaxDepth open
// arrays / objects (deeper ones are refused; strings, numbers and literals still fit) and at
// most kMaxSpaces whitespace bytes in a row between tokens. Nothing may follow the closing brace.
#include <cstdint>
#include <string_view>

namespace dsv4 {

class JsonPrefix {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxSpaces = 32;

  // Feeds one byte: false when it cannot follow (the state is then unusable: test on a copy).
  bool push(uint8_t b);
  // Feeds bytes in order; false as soon as one cannot follow.
  bool push(std::string_view s) {
    for (char c : s)
      if (!push(static_cast<uint8_t>(c))) return false;
    return true;
  }
  // The top-level object is closed: the text is a complete JSON object.
  bool complete() const { return mode_ == Mode::Done; }
  // Inside a string's text, where any characters but '"', '\\' and controls leave the state as
  // it is (the mask's fast path).
  bool in_string_text() const { return mode_ == Mode::Str && pair_ == Pair::None; }

 private:
  enum class Mode : uint8_t {
    Start,     // before the top-level '{'
    ObjFirst,  // after '{': a key or '}'
    ObjKey,    // after ',' in an object: a key
    Colon,     // after a key
    Value,     // after ':' or after ',' in an array
    ArrFirst,  // after '[': a value or ']'
    After,     // after a value in a container: ',' or its closer
    Str,       // in a string (key_ says whether it is a key)
    Esc,       // after '\' in a string
    Hex,       // in \uXXXX: left_ digits to go, code_ so far
    Utf8,      // in a multi-byte character: left_ bytes to go, the next in [lo_, hi_]
    Minus, Zero, Int, Dot, Frac, Exp, ExpSign, ExpDigits,  // number parts
    Literal,   // true / false / null: lit_[left_] next
    Done,      // the top-level object closed
  };
  // Surrogates: a high one (\uD800-\uDBFF) must be followed at once by an escaped low one.
  enum class Pair : uint8_t { None, WantBackslash, WantU, InLow };

  bool open(bool object);
  bool close(bool object);
  bool end_value();
  bool start_value(uint8_t b);  // in Value / ArrFirst
  bool in_string(uint8_t b);
  bool hex_digit(uint8_t b);

  uint64_t stack_ = 0;  // bit d: level d is an object (1) or an array (0)
  uint8_t depth_ = 0;
  Mode mode_ = Mode::Start;
  Pair pair_ = Pair::None;
  bool key_ = false;
  uint8_t left_ = 0;
  uint8_t lo_ = 0, hi_ = 0;
  uint8_t spaces_ = 0;
  uint16_t code_ = 0;
  const char* lit_ = nullptr;
};

}  // namespace dsv4
