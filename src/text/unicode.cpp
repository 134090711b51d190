#include "text/unicode.h"

namespace dsv4::unicode {

Utf8Head utf8_head(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  const Decoded d = decode_utf8(p, end);
  if (d.cp != kInvalid) return {d.len, false};
  // Invalid at full length: is it merely cut short? Check the bytes present against the
  // same rules decode_utf8 uses.
  const uint32_t b0 = p[0];
  size_t need;
  uint32_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, false};
  }
  const size_t have = s.size() - 1;
  if (have >= need) return {1, false};  // all bytes there, so it is really invalid
  for (size_t i = 1; i <= have; ++i) {
    const uint32_t b = p[i];
    if (b < lo || b > hi) return {1, false};
    lo = 0x80, hi = 0xBF;
  }
  return {s.size(), true};
}

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const Decoded d = decode_utf8(p, end);
    if (d.cp == kInvalid) return false;
    p += d.len;
  }
  return true;
}

}  // namespace dsv4::unicode
