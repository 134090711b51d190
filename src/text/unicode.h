#pragma once
// The Unicode facts the tokenizer needs: UTF-8 decoding and the character classes of the
// pre-tokenizer regexes (\p{L} \p{M} \p{N} \p{P} \p{S} \s). The class table is generated
// (src/text/unicode_tables.cpp, by tests/tokenizer/gen_unicode_tables.py) from Python's
// unicodedata; \s is Oniguruma's, i.e. the Unicode White_Space property.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dsv4::unicode {

// General category (first letter) of a code point, with White_Space taking precedence:
// every White_Space character has category Zs/Zl/Zp/Cc, so Space never hides L/M/N/P/S.
enum class CharClass : uint8_t { Other = 0, Letter, Mark, Number, Punct, Symbol, Space };

// Table lookup (binary search over ~2,200 runs).
CharClass char_class_slow(uint32_t cp);
// The Unicode version the table was generated from (e.g. "14.0.0").
const char* unicode_data_version();

inline CharClass char_class(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::Letter;
    if (cp >= '0' && cp <= '9') return CharClass::Number;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return CharClass::Space;
    if (cp < 0x20 || cp == 0x7F) return CharClass::Other;
    // ASCII symbols (Sm/Sc/Sk): $ + < = > ^ ` | ~ ; every other printable is punctuation.
    switch (cp) {
      case '$': case '+': case '<': case '=': case '>': case '^': case '`': case '|': case '~':
        return CharClass::Symbol;
      default:
        return CharClass::Punct;
    }
  }
  return char_class_slow(cp);
}

// Marker for a byte that does not start a valid UTF-8 sequence (overlong forms, surrogates,
// stray continuation bytes, truncated sequences, > U+10FFFF).
inline constexpr uint32_t kInvalid = 0xFFFFFFFFu;

struct Decoded {
  uint32_t cp;   // the code point, or kInvalid (then len is 1: the byte stands alone)
  uint32_t len;  // bytes consumed, >= 1
};

// Decodes the UTF-8 sequence at p (p < end). Strict: the same rules as std::str / WHATWG.
inline Decoded decode_utf8(const unsigned char* p, const unsigned char* end) {
  const uint32_t b0 = p[0];
  if (b0 < 0x80) return {b0, 1};
  uint32_t need, cp, lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {kInvalid, 1};
  }
  if (static_cast<size_t>(end - p) <= need) return {kInvalid, 1};
  for (uint32_t i = 1; i <= need; ++i) {
    const uint32_t b = p[i];
    if (b < lo || b > hi) return {kInvalid, 1};
    lo = 0x80, hi = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, need + 1};
}

// How the bytes at the start of s begin: a complete character (or an invalid byte) of `len`
// bytes, or a valid but unfinished prefix of a multi-byte character (incomplete = true).
struct Utf8Head {
  size_t len;
  bool incomplete;
};
Utf8Head utf8_head(std::string_view s);

// True when s is entirely valid UTF-8.
bool is_valid_utf8(std::string_view s);

}  // namespace dsv4::unicode
