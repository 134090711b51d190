#pragma once
// The bounds a JSON schema puts on a number (minimum, maximum, exclusiveMinimum,
// exclusiveMaximum), decided on the number's text as it is written, byte by byte
// (text/json_grammar.h). Values are compared as exact decimals (the bounds as the schema writes
// them, the answer's digits as they come): no rounding to double on either side.
//
// A bounded number is written without an exponent: -?(0|[1-9][0-9]*)(\.[0-9]+)?, the fraction
// only for type number. feasible() has the grammar's prefix property: it is true exactly when
// some number of at most `max_len` bytes that starts with the prefix lies within the bounds.
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dsv4 {

class NumberRange {
 public:
  // From a schema object's bound keywords (absent ones leave that side open). Throws SchemaError
  // naming `path` + the keyword for a bound that is not a number (exclusiveMinimum /
  // exclusiveMaximum may also be draft 4's boolean, which makes minimum / maximum exclusive), or
  // a bound beyond 10^40 or below 10^-40 in magnitude.
  static NumberRange from_schema(const nlohmann::ordered_json& s, const std::string& path);
  // Whether the schema object has any of the bound keywords.
  static bool in_schema(const nlohmann::ordered_json& s);

  // Some number starting with `prefix` (a prefix of the grammar above, possibly empty) is within
  // the bounds, in at most max_len bytes; `integer`: no fraction.
  bool feasible(std::string_view prefix, bool integer, int max_len) const;
  // A whole number's text (the grammar above) lies within the bounds.
  bool contains(std::string_view number) const;

  // A decimal magnitude: digits (no leading or trailing zeros; empty for zero) times 10^exp.
  struct Dec {
    std::string digits;
    int exp = 0;
  };
  // Bounds on the magnitude m of numbers of one sign (value = m or -m).
  struct MagRange {
    bool empty = false;
    bool has_lo = false, lo_excl = false, has_hi = false, hi_excl = false;
    Dec lo, hi;
  };

 private:
  bool exists(const Dec& a, const Dec* b, int p, const MagRange& r) const;
  MagRange pos_, neg_;  // for "d..." and for "-d..."
};

}  // namespace dsv4
