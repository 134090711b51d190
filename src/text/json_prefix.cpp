#include "text/json_prefix.h"

namespace dsv4 {

static int hex_value(uint8_t b) {
  if (b >= '0' && b <= '9') return b - '0';
  if (b >= 'a' && b <= 'f') return b - 'a' + 10;
  if (b >= 'A' && b <= 'F') return b - 'A' + 10;
  return -1;
}

bool JsonPrefix::open(bool object) {
  if (depth_ >= kMaxDepth) return false;
  if (object) stack_ |= uint64_t{1} << depth_;
  else stack_ &= ~(uint64_t{1} << depth_);
  ++depth_;
  mode_ = object ? Mode::ObjFirst : Mode::ArrFirst;
  return true;
}

bool JsonPrefix::close(bool object) {
  if (depth_ == 0 || (((stack_ >> (depth_ - 1)) & 1) != 0) != object) return false;
  --depth_;
  mode_ = depth_ == 0 ? Mode::Done : Mode::After;
  return true;
}

// A scalar ends inside a container: the top level is an object, so there always is one.
bool JsonPrefix::end_value() {
  mode_ = Mode::After;
  return true;
}

bool JsonPrefix::start_value(uint8_t b) {
  switch (b) {
    case '{': return open(true);
    case '[': return open(false);
    case '"': mode_ = Mode::Str, key_ = false; return true;
    case '-': mode_ = Mode::Minus; return true;
    case '0': mode_ = Mode::Zero; return true;
    case 't': lit_ = "true"; break;
    case 'f': lit_ = "false"; break;
    case 'n': lit_ = "null"; break;
    default:
      if (b >= '1' && b <= '9') {
        mode_ = Mode::Int;
        return true;
      }
      return false;
  }
  mode_ = Mode::Literal, left_ = 1;
  return true;
}

bool JsonPrefix::in_string(uint8_t b) {
  if (pair_ == Pair::WantBackslash) {
    if (b != '\\') return false;
    mode_ = Mode::Esc, pair_ = Pair::WantU;
    return true;
  }
  if (b == '"') {
    if (!key_) return end_value();
    mode_ = Mode::Colon;
    return true;
  }
  if (b == '\\') {
    mode_ = Mode::Esc;
    return true;
  }
  if (b < 0x20) return false;  // control characters must be escaped
  if (b < 0x80) return true;
  // UTF-8 (RFC 3629): the lead byte fixes the length and the range of the first continuation
  // byte, which rules out overlong forms, surrogates and code points above U+10FFFF.
  lo_ = 0x80, hi_ = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) left_ = 1;
  else if (b == 0xE0) left_ = 2, lo_ = 0xA0;
  else if (b == 0xED) left_ = 2, hi_ = 0x9F;
  else if (b >= 0xE1 && b <= 0xEF) left_ = 2;
  else if (b == 0xF0) left_ = 3, lo_ = 0x90;
  else if (b == 0xF4) left_ = 3, hi_ = 0x8F;
  else if (b >= 0xF1 && b <= 0xF3) left_ = 3;
  else return false;
  mode_ = Mode::Utf8;
  return true;
}

bool JsonPrefix::hex_digit(uint8_t b) {
  const int v = hex_value(b);
  if (v < 0) return false;
  code_ = static_cast<uint16_t>(code_ << 4 | v);
  const int seen = 4 - --left_;
  if (pair_ == Pair::InLow) {
    // The low half of a pair: \uDC00-\uDFFF.
    if (seen == 1 && code_ != 0xD) return false;
    if (seen == 2 && code_ < 0xDC) return false;
    if (left_ == 0) pair_ = Pair::None, mode_ = Mode::Str;
    return true;
  }
  if (seen == 2 && code_ >= 0xDC && code_ <= 0xDF) return false;  // a low half alone
  if (left_ == 0) {
    if (code_ >= 0xD800 && code_ <= 0xDBFF) pair_ = Pair::WantBackslash;
    mode_ = Mode::Str;
  }
  return true;
}

bool JsonPrefix::push(uint8_t b) {
  const bool ws = b == ' ' || b == '\t' || b == '\n' || b == '\r';
  if (!ws) spaces_ = 0;
  const bool digit = b >= '0' && b <= '9';
  switch (mode_) {
    case Mode::Str: return in_string(b);
    case Mode::Esc:
      if (pair_ == Pair::WantU || b == 'u') {
        if (b != 'u') return false;
        mode_ = Mode::Hex, left_ = 4, code_ = 0;
        if (pair_ == Pair::WantU) pair_ = Pair::InLow;
        return true;
      }
      switch (b) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
          mode_ = Mode::Str;
          return true;
        default: return false;
      }
    case Mode::Hex: return hex_digit(b);
    case Mode::Utf8:
      if (b < lo_ || b > hi_) return false;
      lo_ = 0x80, hi_ = 0xBF;
      if (--left_ == 0) mode_ = Mode::Str;
      return true;
    case Mode::Literal:
      if (b != static_cast<uint8_t>(lit_[left_])) return false;
      if (lit_[++left_] == '\0') return end_value();
      return true;
    case Mode::Minus:
      if (!digit) return false;
      mode_ = b == '0' ? Mode::Zero : Mode::Int;
      return true;
    case Mode::Dot:
      if (!digit) return false;
      mode_ = Mode::Frac;
      return true;
    case Mode::Exp:
      if (b == '+' || b == '-') mode_ = Mode::ExpSign;
      else if (digit) mode_ = Mode::ExpDigits;
      else return false;
      return true;
    case Mode::ExpSign:
      if (!digit) return false;
      mode_ = Mode::ExpDigits;
      return true;
    case Mode::Zero:
    case Mode::Int:
    case Mode::Frac:
    case Mode::ExpDigits:
      if (digit && mode_ != Mode::Zero) return true;
      if (b == '.' && mode_ != Mode::Frac && mode_ != Mode::ExpDigits) {
        mode_ = Mode::Dot;
        return true;
      }
      if ((b == 'e' || b == 'E') && mode_ != Mode::ExpDigits) {
        mode_ = Mode::Exp;
        return true;
      }
      mode_ = Mode::After;  // the number ended: b is read after it
      break;
    case Mode::Done: return false;
    default: break;
  }
  if (ws) return ++spaces_ <= kMaxSpaces;
  switch (mode_) {
    case Mode::Start: return b == '{' && open(true);
    case Mode::ObjFirst:
      if (b == '}') return close(true);
      [[fallthrough]];
    case Mode::ObjKey:
      if (b != '"') return false;
      mode_ = Mode::Str, key_ = true;
      return true;
    case Mode::Colon:
      if (b != ':') return false;
      mode_ = Mode::Value;
      return true;
    case Mode::ArrFirst:
      if (b == ']') return close(false);
      return start_value(b);
    case Mode::Value: return start_value(b);
    case Mode::After:
      if (b == ',') {
        mode_ = ((stack_ >> (depth_ - 1)) & 1) != 0 ? Mode::ObjKey : Mode::Value;
        return true;
      }
      if (b == '}' || b == ']') return close(b == '}');
      return false;
    default: return false;
  }
}

}  // namespace dsv4
