#include "text/json_number_range.h"

#include <algorithm>

#include "text/json_grammar.h"

namespace dsv4 {

using Dec = NumberRange::Dec;
using MagRange = NumberRange::MagRange;

namespace {

constexpr int kMaxBoundExp = 40;  // bounds within 10^-40 .. 10^40 in magnitude

Dec normalized(std::string digits, int exp) {
  const size_t lead = std::min(digits.find_first_not_of('0'), digits.size());
  digits.erase(0, lead);
  while (!digits.empty() && digits.back() == '0') digits.pop_back(), ++exp;
  if (digits.empty()) exp = 0;
  return {std::move(digits), exp};
}

bool zero(const Dec& a) { return a.digits.empty(); }

// The order of magnitude: the leading digit's place + 1.
int magnitude(const Dec& a) { return static_cast<int>(a.digits.size()) + a.exp; }

int cmp(const Dec& a, const Dec& b) {
  if (zero(a) || zero(b)) return zero(a) == zero(b) ? 0 : zero(a) ? -1 : 1;
  if (magnitude(a) != magnitude(b)) return magnitude(a) < magnitude(b) ? -1 : 1;
  const size_t n = std::max(a.digits.size(), b.digits.size());
  for (size_t i = 0; i < n; ++i) {
    const char x = i < a.digits.size() ? a.digits[i] : '0', y = i < b.digits.size() ? b.digits[i] : '0';
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}

Dec add(const Dec& a, const Dec& b) {
  if (zero(a)) return b;
  if (zero(b)) return a;
  const int e = std::min(a.exp, b.exp);
  std::string x = a.digits + std::string(static_cast<size_t>(a.exp - e), '0');
  std::string y = b.digits + std::string(static_cast<size_t>(b.exp - e), '0');
  if (x.size() < y.size()) std::swap(x, y);
  y.insert(0, x.size() - y.size(), '0');
  int carry = 0;
  for (size_t i = x.size(); i-- > 0;) {
    const int s = (x[i] - '0') + (y[i] - '0') + carry;
    x[i] = static_cast<char>('0' + s % 10);
    carry = s / 10;
  }
  if (carry) x.insert(x.begin(), '1');
  return normalized(std::move(x), e);
}

Dec pow10(int k) { return {"1", k}; }

Dec times_pow10(Dec a, int k) {
  if (!zero(a)) a.exp += k;
  return a;
}

// The smallest multiple of 10^-p that is >= x (> x when strict).
Dec ceil_grid(const Dec& x, int p, bool strict) {
  if (zero(x)) return strict ? pow10(-p) : x;
  if (x.exp >= -p) return strict ? add(x, pow10(-p)) : x;
  const size_t drop = static_cast<size_t>(-p - x.exp);
  const Dec floor = drop >= x.digits.size() ? Dec{} : normalized(x.digits.substr(0, x.digits.size() - drop), -p);
  return add(floor, pow10(-p));
}

// Digits "I" or "I.F" (no sign, no exponent).
Dec from_plain(std::string_view s) {
  const size_t dot = s.find('.');
  if (dot == std::string_view::npos) return normalized(std::string(s), 0);
  return normalized(std::string(s.substr(0, dot)) + std::string(s.substr(dot + 1)), -static_cast<int>(s.size() - dot - 1));
}

// A signed bound.
struct Bound {
  bool set = false, neg = false, excl = false;
  Dec mag;
};

// Signed comparison of two set bounds' values.
int scmp(const Bound& a, const Bound& b) {
  const bool an = a.neg && !zero(a.mag), bn = b.neg && !zero(b.mag);
  if (an != bn) return an ? -1 : 1;
  const int c = cmp(a.mag, b.mag);
  return an ? -c : c;
}

// A JSON number's text as nlohmann writes it (digits, fraction, exponent) as a bound.
Bound parse_bound(const nlohmann::ordered_json& v, bool excl, const std::string& where) {
  if (!v.is_number()) throw SchemaError(where, "must be a number");
  const std::string t = v.dump();
  Bound b;
  b.set = true, b.excl = excl;
  size_t i = 0;
  if (t[i] == '-') b.neg = true, ++i;
  const size_t e = t.find_first_of("eE");
  int exp = 0;
  if (e != std::string::npos) {
    try {
      exp = std::stoi(t.substr(e + 1));
    } catch (const std::exception&) {
      throw SchemaError(where, "is beyond 10^" + std::to_string(kMaxBoundExp) + " in magnitude");
    }
    if (exp > 1000 || exp < -1000) throw SchemaError(where, "is beyond 10^" + std::to_string(kMaxBoundExp) + " in magnitude");
  }
  b.mag = times_pow10(from_plain(std::string_view(t).substr(i, (e == std::string::npos ? t.size() : e) - i)), exp);
  if (!zero(b.mag) && (magnitude(b.mag) > kMaxBoundExp + 1 || b.mag.exp < -kMaxBoundExp))
    throw SchemaError(where, "bounds beyond 10^" + std::to_string(kMaxBoundExp) + " or with digits below 10^-" +
                                 std::to_string(kMaxBoundExp) + " are not supported");
  if (zero(b.mag)) b.neg = false;
  return b;
}

// The stricter of two lower (lower = true) or upper bounds.
void tighten(Bound& have, const Bound& b, bool lower) {
  if (!b.set) return;
  if (!have.set) {
    have = b;
    return;
  }
  const int c = scmp(b, have);
  if (c == 0) have.excl = have.excl || b.excl;
  else if ((c > 0) == lower) have = b;
}

}  // namespace

bool NumberRange::in_schema(const nlohmann::ordered_json& s) {
  for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
    if (s.contains(k)) return true;
  return false;
}

NumberRange NumberRange::from_schema(const nlohmann::ordered_json& s, const std::string& path) {
  Bound lo, hi;
  for (const bool lower : {true, false}) {
    const char* plain = lower ? "minimum" : "maximum";
    const char* ex = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    Bound& have = lower ? lo : hi;
    bool draft4 = false;  // exclusiveMinimum: true (draft 4) makes minimum exclusive
    if (s.contains(ex) && s[ex].is_boolean()) {
      draft4 = s[ex].get<bool>();
      if (draft4 && !s.contains(plain)) throw SchemaError(path + "." + ex, std::string("true needs ") + plain + " beside it");
    } else if (s.contains(ex)) {
      tighten(have, parse_bound(s[ex], true, path + "." + ex), lower);
    }
    if (s.contains(plain)) tighten(have, parse_bound(s[plain], draft4, path + "." + plain), lower);
  }
  NumberRange r;
  // Positive sign: lo <= m <= hi, clipped to m >= 0.
  if (lo.set && !lo.neg) r.pos_.has_lo = true, r.pos_.lo = lo.mag, r.pos_.lo_excl = lo.excl;
  if (hi.set) {
    if (hi.neg) r.pos_.empty = true;
    else r.pos_.has_hi = true, r.pos_.hi = hi.mag, r.pos_.hi_excl = hi.excl;
  }
  // Negative sign (value -m): -hi <= m <= -lo.
  if (hi.set && (hi.neg || zero(hi.mag))) r.neg_.has_lo = true, r.neg_.lo = hi.mag, r.neg_.lo_excl = hi.excl;
  if (lo.set) {
    if (!lo.neg && !zero(lo.mag)) r.neg_.empty = true;
    else r.neg_.has_hi = true, r.neg_.hi = lo.mag, r.neg_.hi_excl = lo.excl;
  }
  return r;
}

bool NumberRange::exists(const Dec& a, const Dec* b, int p, const MagRange& r) const {
  if (r.empty) return false;
  Dec lower = a;
  bool strict = false;
  if (r.has_lo) {
    const int c = cmp(r.lo, a);
    if (c > 0) lower = r.lo, strict = r.lo_excl;
    else if (c == 0) strict = r.lo_excl;
  }
  const Dec x = ceil_grid(lower, p, strict);
  if (b && cmp(x, *b) >= 0) return false;
  if (r.has_hi) {
    const int c = cmp(x, r.hi);
    if (c > 0 || (c == 0 && r.hi_excl)) return false;
  }
  return true;
}

bool NumberRange::feasible(std::string_view prefix, bool integer, int max_len) const {
  const bool neg = !prefix.empty() && prefix[0] == '-';
  const MagRange& r = neg ? neg_ : pos_;
  const std::string_view rest = prefix.substr(neg ? 1 : 0);
  const int room = max_len - static_cast<int>(prefix.size());
  if (room < 0) return false;
  if (rest.empty()) {  // the first digit is still to come (and the sign, if none yet)
    if (room < 1) return false;
    if (!neg && feasible("-", integer, max_len)) return true;
    std::string next(prefix);
    next += '0';
    for (char d = '0'; d <= '9'; ++d) {
      next.back() = d;
      if (feasible(next, integer, max_len)) return true;
    }
    return false;
  }
  const Dec one = pow10(0);
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos) {
    // More integer digits (k of them), then a fraction in what room is left ('.' and a digit at least).
    const auto frac_room = [&](int left) { return integer || left < 2 ? 0 : left - 1; };
    if (rest == "0") return exists(Dec{}, &one, frac_room(room), r);
    const Dec d = from_plain(rest), d1 = add(d, one);
    for (int k = 0; k <= room; ++k) {
      const Dec a = times_pow10(d, k), b = times_pow10(d1, k);
      if (exists(a, &b, frac_room(room - k), r)) return true;
      if (r.has_hi && cmp(a, r.hi) > 0) break;  // every longer number is larger still
    }
    return false;
  }
  const std::string_view frac = rest.substr(dot + 1);
  if (frac.empty()) {
    if (room < 1) return false;
    const Dec a = from_plain(rest.substr(0, dot)), b = add(a, one);
    return exists(a, &b, room, r);
  }
  const int f = static_cast<int>(frac.size());
  const Dec a = from_plain(rest), b = add(a, pow10(-f));
  return exists(a, &b, f + room, r);
}

bool NumberRange::contains(std::string_view number) const {
  const bool neg = !number.empty() && number[0] == '-';
  const MagRange& r = neg ? neg_ : pos_;
  if (r.empty) return false;
  const Dec m = from_plain(number.substr(neg ? 1 : 0));
  if (r.has_lo) {
    const int c = cmp(m, r.lo);
    if (c < 0 || (c == 0 && r.lo_excl)) return false;
  }
  if (r.has_hi) {
    const int c = cmp(m, r.hi);
    if (c > 0 || (c == 0 && r.hi_excl)) return false;
  }
  return true;
}

}  // namespace dsv4
