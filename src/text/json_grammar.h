#pragma once
// JSON a constrained answer must be, decided byte by byte (engine/json_constraint.h). A
// JsonGrammar is a JSON schema compiled to a few node kinds (response_format json_schema), or
// "any JSON object" (json_object); a JsonGrammarState is the state of the pushdown automaton
// reading an answer against it: small, and copied for every candidate token.
//
// Prefix property: push() refuses a byte exactly when no text accepted by the grammar starts with
// the bytes accepted so far plus it. Texts are strict RFC 8259 JSON in UTF-8 (no control
// characters in strings, valid UTF-8 without overlong forms or surrogates, `\u` surrogates only
// as a high + low pair, JSON's number grammar), whose top-level value is an object, with nothing
// after it. Two limits, so that a model cannot stall an answer: at most kMaxDepth open arrays /
// objects (deeper ones are refused; strings, numbers and literals still fit), at most
// kMaxSpaces whitespace bytes in a row between tokens and at most kMaxNumber bytes in a number.
//
// Schemas (compile()): the subset a grammar can hold exactly, the rest refused with the keyword's
// path, never ignored:
// - type: object, array, string, number, integer, boolean, null, or a list of them;
// - objects: properties, required (each one of the properties), additionalProperties (true by
//   default, false, or a schema); keys in any order, each declared one at most once; in an
//   object with declared properties every key is written without escapes (the automaton
//   compares keys byte by byte: a property name that needs one is refused); at most 64
//   properties;
// - arrays: items (one schema), prefixItems (or draft 4-2019's items as a list, then
//   additionalItems), items / additionalItems false (nothing past the prefix), minItems, maxItems;
// - strings: minLength, maxLength (in characters: code points, an escape counting as the one it
//   writes), pattern (text/json_pattern.h: a subset of ECMA-262, run on the characters);
// - integers are written without fraction or exponent;
// - numbers and integers: minimum, maximum, exclusiveMinimum, exclusiveMaximum (also draft 4's
//   boolean form), compared as exact decimals (text/json_number_range.h); a bounded number is
//   written without an exponent, and the bounds must leave some number of kMaxNumber bytes;
// - enum and const of strings, numbers, booleans and null (at most 64 values), written as
//   nlohmann writes them (strings with their characters as they are, no escapes but the needed);
// - anyOf (and type lists): where the first byte of a value picks no single branch (two object
//   branches, say), the automaton reads on in each of them (JsonGrammarState: at most kMaxThreads
//   readings at once) until the text tells them apart; oneOf likewise when such branches are
//   objects told apart by a required property with a different const in each (a discriminator,
//   as pydantic writes for tagged unions), so that at most one can match;
// - $ref to "#", "#/$defs/NAME" or "#/definitions/NAME" of the root, recursion included;
//   allOf of one schema (what pydantic writes around a $ref);
// - annotations are ignored: title, description, default, examples, $schema, $id, $comment,
//   deprecated, readOnly, writeOnly, discriminator (OpenAPI's hint beside a oneOf), and format,
//   contentEncoding, contentMediaType (annotations
//   in JSON Schema 2020-12 unless a schema asks for their assertion: a "date-time" string is
//   held to being a string).
// The root must be an object schema.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/json_number_range.h"
#include "text/json_pattern.h"

namespace dsv4 {

// What compile() refuses: `path` names the keyword (e.g. "...schema.properties.when.format").
struct SchemaError : Error {
  SchemaError(std::string p, std::string w) : Error(p + ": " + w), path(std::move(p)), why(std::move(w)) {}
  std::string path, why;
};

class JsonGrammar {
 public:
  // Any JSON object (response_format json_object).
  static std::shared_ptr<const JsonGrammar> any_object();
  // A schema; throws SchemaError for what it cannot enforce, its path starting with `path`, the
  // schema's own name in the request (e.g. "response_format.json_schema.schema").
  static std::shared_ptr<const JsonGrammar> compile(const nlohmann::ordered_json& schema, const std::string& path);

  enum Kind : uint8_t { Object, Array, String, Number, Integer, Enum, AnyOf };
  struct Node {
    Kind kind = AnyOf;
    // Object: the keys as written (with their quotes), their value nodes, the required ones (bits),
    // the node of other keys (-1: none).
    std::vector<std::string> keys;
    std::vector<int> values;
    uint64_t required = 0;
    int additional = -1;
    // Array: the first values' nodes by position, then `items` for the rest (-1: none allowed,
    // max_items then at most prefix.size()).
    std::vector<int> prefix;
    int items = -1;
    uint32_t min_items = 0, max_items = UINT32_MAX;
    // String: bounds on the length in characters; the pattern (pattern()), -1: none.
    uint32_t min_len = 0, max_len = UINT32_MAX;
    int pattern = -1;
    // Number, Integer: the bounds (range()), -1: none.
    int range = -1;
    // Enum: each value's JSON text; numeric ones end only at the byte after them.
    std::vector<std::string> texts;
    std::vector<uint8_t> numeric;
    // AnyOf: the branches. A value starting with byte b is of node by_first[b] (not an AnyOf:
    // nested ones are looked through), -1: of none; <= -2: of one of several, the list
    // alike[-2 - by_first[b]] (the automaton follows each).
    std::vector<int> branches;
    std::array<int16_t, 256> by_first{};
    std::vector<std::vector<int>> alike;
    bool one_of = false;  // oneOf: several alike only with a discriminating const property
  };
  const Node& node(int i) const { return nodes_[static_cast<size_t>(i)]; }
  const NumberRange& range(int i) const { return ranges_[static_cast<size_t>(i)]; }
  const JsonPattern& pattern(int i) const { return patterns_[static_cast<size_t>(i)]; }
  int root() const { return root_; }
  // Whether a value of node n can start with byte b.
  bool starts(int n, uint8_t b) const;

 private:
  friend struct GrammarCompiler;
  std::vector<Node> nodes_;
  std::vector<NumberRange> ranges_;
  std::vector<JsonPattern> patterns_;
  std::vector<std::array<uint64_t, 4>> first_;  // per node: the bytes a value can start with
  int root_ = -1;
};

// Inside a free string's text: a string value, or a key where any key is allowed (not an enum
// value). There whole characters but '"', '\\' and controls can come next, as far as the string's
// length bound (room, in characters) and pattern allow (the mask's fast path; what they leave
// behind, e.g. the declared keys a key may still become, is push()'s).
struct JsonTextSpot {
  bool text = false;
  uint32_t room = UINT32_MAX;
  int pattern = -1;  // JsonGrammar::pattern(), at states `states`
  JsonPattern::Set states{};
};

// One reading of the text so far: the pushdown automaton's stack and lexer. JsonGrammarState
// holds one per way the text can still be read (anyOf branches that start alike).
class JsonGrammarThread {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxSpaces = 32;
  static constexpr int kMaxNumber = 64;

  // (Trivial: a state's spare readings cost nothing until used; the copies it makes per
  // candidate token copy only the live ones.)
  JsonGrammarThread() = default;
  explicit JsonGrammarThread(const JsonGrammar* g)
      : g_(g), pick_(0), depth_(0), containers_(0), done_(false), spaces_(0), lex_(0), pair_(0), left_(0), lo_(0), hi_(0), code_(0),
        cp_(0) {}
  JsonGrammarThread(const JsonGrammarThread& o) { *this = o; }
  JsonGrammarThread& operator=(const JsonGrammarThread& o);  // copies the open frames only

  // Feeds one byte: false when it cannot follow (the thread is then unusable: test on a copy). A
  // value that can be of several nodes (ambiguity(b) > 1) is taken as the pick-th of them.
  bool push(uint8_t b, int pick = 0);
  // How many nodes a value starting with b here can be of (1 where no value starts or one node).
  int ambiguity(uint8_t b) const;
  bool complete() const { return done_; }
  JsonTextSpot text_spot() const;

 private:
  // Per open value: an object, an array, or the scalar being read.
  struct Frame {
    int16_t node;
    uint8_t phase;
    int16_t prop;    // object: the property whose key / value is read (-1: another key)
    uint16_t pos;    // object key / enum: bytes matched
    uint32_t count;  // array: values so far; string: characters so far
    uint64_t seen;   // object: properties given; string: the pattern's states (high word)
    uint64_t cand;   // object key / enum: candidates still matching; string: the pattern's states (low word)
  };
  enum class Step { Refused, Taken, Again };  // Again: a number ended; the byte is the parent's
  Step step(uint8_t b, bool ws);
  bool begin_value(int node, uint8_t b);
  int value_node() const;  // the node of a value that would start here, -1: none
  void end_value();
  bool string_byte(uint8_t b, bool key);
  bool pattern_byte(const JsonPattern& p, Frame& f, uint8_t b, uint8_t lex_before, uint8_t pair_before);
  bool key_possible(const Frame& f) const;
  bool number_byte(uint8_t b, const JsonGrammar::Node& n, bool& ended);

  const JsonGrammar* g_;
  int pick_;  // (push's, for begin_value)
  std::array<Frame, kMaxDepth + 2> frames_;
  int depth_;
  int containers_;
  bool done_;
  uint8_t spaces_;
  // The lexer of the innermost string or number.
  uint8_t lex_, pair_, left_, lo_, hi_;
  uint16_t code_;
  uint32_t cp_;  // the UTF-8 character being read (its bits so far); a \u pair's high half
  // The number being read (left_ bytes): bounds are decided on its text.
  std::array<char, kMaxNumber> num_;
};

// The state of an answer against a grammar: every reading of it still possible (one, unless
// anyOf branches that start alike are being told apart; at most kMaxThreads).
class JsonGrammarState {
 public:
  static constexpr int kMaxDepth = JsonGrammarThread::kMaxDepth;
  static constexpr int kMaxSpaces = JsonGrammarThread::kMaxSpaces;
  static constexpr int kMaxNumber = JsonGrammarThread::kMaxNumber;
  static constexpr int kMaxThreads = 8;
  using TextSpot = JsonTextSpot;

  // `g` must outlive the state (and its copies): the state holds a plain pointer, as it is copied
  // for every candidate token.
  explicit JsonGrammarState(const JsonGrammar* g) : n_(1) { threads_[0] = JsonGrammarThread(g); }
  JsonGrammarState(const JsonGrammarState& o) { *this = o; }
  JsonGrammarState& operator=(const JsonGrammarState& o);  // copies the live readings only

  // Feeds one byte: false when it cannot follow (the state is then unusable: test on a copy).
  bool push(uint8_t b);
  // Feeds bytes in order; false as soon as one cannot follow.
  bool push(std::string_view s) {
    for (char c : s)
      if (!push(static_cast<uint8_t>(c))) return false;
    return true;
  }
  // The top-level object is closed: the text is complete.
  bool complete() const;
  // One reading's spot; with several, free text where one of them is in free text (no length
  // bound or pattern: it takes any text, so the readings together do), else none (no fast path).
  TextSpot text_spot() const;
  bool in_string_text() const { return text_spot().text; }
  int readings() const { return n_; }

 private:
  std::array<JsonGrammarThread, kMaxThreads> threads_;
  int n_ = 0;
};

}  // namespace dsv4
