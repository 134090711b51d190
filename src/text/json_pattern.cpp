#include "text/json_pattern.h"

#include <algorithm>

#include "text/json_grammar.h"
#include "text/unicode.h"

namespace dsv4 {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr int kMaxRaw = 2048;    // states while building, splits included
constexpr int kMaxGroups = 32;   // groups nested in one another

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [a, b] : r) {
    if (!out.empty() && a <= out.back().second + 1) out.back().second = std::max(out.back().second, b);
    else out.push_back({a, b});
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t from = 0;
  for (const auto& [a, b] : r) {
    if (a > from) out.push_back({from, a - 1});
    from = b + 1;
  }
  if (from <= kMaxCp) out.push_back({from, kMaxCp});
  return out;
}

const Ranges& digits() {
  static const Ranges r = {{'0', '9'}};
  return r;
}
const Ranges& word() {
  static const Ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
// ECMA-262 WhiteSpace and LineTerminator.
const Ranges& space() {
  static const Ranges r = normalized({{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                                      {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}});
  return r;
}

bool contains(const Ranges& r, uint32_t cp) {
  for (const auto& [a, b] : r)
    if (cp >= a && cp <= b) return true;
  return false;
}

bool overlaps(const Ranges& r, uint32_t lo, uint32_t hi) {
  for (const auto& [a, b] : r)
    if (a <= hi && lo <= b) return true;
  return false;
}

void add(JsonPattern::Set& s, int i) { s[static_cast<size_t>(i >> 6)] |= uint64_t{1} << (i & 63); }
bool has(const JsonPattern::Set& s, int i) { return s[static_cast<size_t>(i >> 6)] >> (i & 63) & 1; }
bool meets(const JsonPattern::Set& a, const JsonPattern::Set& b) { return (a[0] & b[0]) | (a[1] & b[1]); }

struct Ast {
  enum Kind { Cls, Seq, Alt, Rep } kind = Seq;
  Ranges cls;
  std::vector<Ast> kids;
  int min = 0, max = -1;  // Rep: max -1 = unbounded
};

}  // namespace

struct PatternCompiler {
  std::vector<uint32_t> cp;  // the pattern's code points
  size_t i = 0;
  const std::string& path;
  int groups = 0;  // groups open around the parser (its recursion, and the builder's, is bounded by it)

  [[noreturn]] void refuse(const std::string& why) const { throw SchemaError(path, why); }
  bool end() const { return i >= cp.size(); }
  uint32_t peek() const { return cp[i]; }
  bool eat(uint32_t c) {
    if (end() || cp[i] != c) return false;
    ++i;
    return true;
  }

  // ---- parsing ----
  Ast alt() {
    Ast a;
    a.kind = Ast::Alt;
    a.kids.push_back(seq());
    while (eat('|')) a.kids.push_back(seq());
    return a.kids.size() == 1 ? std::move(a.kids[0]) : a;
  }
  Ast seq() {
    Ast s;
    while (!end() && peek() != '|' && peek() != ')') s.kids.push_back(quantified());
    return s;
  }
  // A number in a {n,m} quantifier, or -1 when there is none.
  int number() {
    int n = -1;
    while (!end() && peek() >= '0' && peek() <= '9') {
      n = (n < 0 ? 0 : n) * 10 + static_cast<int>(peek() - '0');
      if (n > 100000) refuse("a repetition count above 100000");
      ++i;
    }
    return n;
  }
  Ast quantified() {
    Ast a = atom();
    int lo = -1, hi = -1;
    if (eat('*')) lo = 0;
    else if (eat('+')) lo = 1;
    else if (eat('?')) lo = 0, hi = 1;
    else if (!end() && peek() == '{') {
      const size_t at = i++;
      const int n = number();
      int m = n;
      if (n >= 0 && eat(',')) m = number();  // -1: unbounded
      if (n < 0 || !eat('}')) {
        i = at;  // not a quantifier: a literal '{' (ECMA-262 Annex B), read as the next atom
        return a;
      }
      if (m >= 0 && m < n) refuse("a repetition {n,m} with m below n");
      lo = n, hi = m;
    }
    if (lo < 0) return a;
    eat('?');  // lazy: the same language
    if (!end() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{')) {
      const size_t at = i;
      if (peek() != '{' || (++i, number() >= 0)) refuse("a quantifier after a quantifier");
      i = at;
    }
    Ast r;
    r.kind = Ast::Rep, r.min = lo, r.max = hi;
    r.kids.push_back(std::move(a));
    return r;
  }
  static Ast cls(Ranges r) {
    Ast a;
    a.kind = Ast::Cls;
    a.cls = normalized(std::move(r));
    return a;
  }
  Ast atom() {
    const uint32_t c = cp[i++];
    switch (c) {
      case '(': {
        if (eat('?') && !eat(':')) refuse("lookaround and named groups are not supported");
        if (++groups > kMaxGroups) refuse("groups nested more than " + std::to_string(kMaxGroups) + " deep");
        Ast a = alt();
        --groups;
        if (!eat(')')) refuse("a '(' without its ')'");
        return a;
      }
      case ')': refuse("a ')' without its '('");
      case '[': return bracket();
      case '.': return cls(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
      case '\\': {
        Ranges r;
        escape(r, false);
        return cls(r);
      }
      case '^':
      case '$': refuse("^ and $ are supported only at the very start and end of the pattern");
      case '*':
      case '+':
      case '?': refuse("a quantifier with nothing before it");
      default: return cls({{c, c}});
    }
  }
  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (end()) refuse("an escape cut short");
      const uint32_t c = cp[i++];
      const int d = c >= '0' && c <= '9' ? static_cast<int>(c - '0') : c >= 'a' && c <= 'f' ? static_cast<int>(c - 'a' + 10)
                    : c >= 'A' && c <= 'F' ? static_cast<int>(c - 'A' + 10) : -1;
      if (d < 0) refuse("a bad hexadecimal escape");
      v = v << 4 | static_cast<uint32_t>(d);
    }
    return v;
  }
  // After a '\': adds what it stands for to r; returns whether it is one character (a class
  // escape such as \d cannot end a range).
  bool escape(Ranges& r, bool in_class) {
    if (end()) refuse("a '\\' at the end");
    const uint32_t c = cp[i++];
    auto one = [&](uint32_t v) {
      r.push_back({v, v});
      return true;
    };
    auto set = [&](const Ranges& s, bool negate) {
      const Ranges x = negate ? complement(s) : s;
      r.insert(r.end(), x.begin(), x.end());
      return false;
    };
    switch (c) {
      case 'd': return set(digits(), false);
      case 'D': return set(digits(), true);
      case 'w': return set(word(), false);
      case 'W': return set(word(), true);
      case 's': return set(space(), false);
      case 'S': return set(space(), true);
      case 't': return one('\t');
      case 'n': return one('\n');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'x': return one(hex(2));
      case '0':
        if (!end() && peek() >= '0' && peek() <= '9') refuse("octal escapes are not supported");
        return one(0);
      case 'u': {
        if (eat('{')) {
          uint32_t v = 0;
          int n = 0;
          while (!end() && peek() != '}') v = v << 4 | hex(1), ++n;
          if (!eat('}') || n == 0 || n > 6 || v > kMaxCp) refuse("a bad \\u{...} escape");
          return one(v);
        }
        uint32_t v = hex(4);
        if (v >= 0xD800 && v <= 0xDBFF && i + 1 < cp.size() && cp[i] == '\\' && cp[i + 1] == 'u') {
          const size_t at = i;
          i += 2;
          const uint32_t lo = hex(4);
          if (lo >= 0xDC00 && lo <= 0xDFFF) return one(0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00));
          i = at;
        }
        if (v >= 0xD800 && v <= 0xDFFF) refuse("a lone surrogate escape");
        return one(v);
      }
      case 'b':
        if (in_class) return one('\b');
        refuse("word boundaries are not supported");
      case 'B': refuse("word boundaries are not supported");
      default: break;
    }
    if (c >= '1' && c <= '9') refuse("backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
      refuse(std::string("the escape \\") + static_cast<char>(c) + " is not supported");
    return one(c);  // an escaped syntax character
  }
  Ast bracket() {
    const bool negate = eat('^');
    Ranges r;
    for (;;) {
      if (end()) refuse("a '[' without its ']'");
      if (eat(']')) break;
      uint32_t a = cp[i++];
      bool single = true;
      if (a == '\\') {
        Ranges e;
        single = escape(e, true);
        if (!single) {
          r.insert(r.end(), e.begin(), e.end());
          continue;
        }
        a = e[0].first;
      }
      if (i + 1 < cp.size() && cp[i] == '-' && cp[i + 1] != ']') {
        ++i;
        uint32_t b = cp[i++];
        if (b == '\\') {
          Ranges e;
          if (!escape(e, true)) refuse("a class escape cannot end a range");
          b = e[0].first;
        }
        if (b < a) refuse("a range out of order in [...]");
        r.push_back({a, b});
      } else {
        r.push_back({a, a});
      }
    }
    const Ranges n = normalized(std::move(r));
    return cls(negate ? complement(n) : n);
  }

  // ---- the NFA, built backwards from the match state ----
  struct Raw {
    Ranges cls;
    int next = -1;
    std::vector<int> eps;
    bool split = false, match = false;
  };
  std::vector<Raw> raw;
  int add_raw(Raw r) {
    if (static_cast<int>(raw.size()) >= kMaxRaw) refuse("the pattern is too large to enforce");
    raw.push_back(std::move(r));
    return static_cast<int>(raw.size()) - 1;
  }
  int build(const Ast& a, int next) {
    switch (a.kind) {
      case Ast::Cls: return add_raw({a.cls, next, {}, false, false});
      case Ast::Seq:
        for (size_t k = a.kids.size(); k-- > 0;) next = build(a.kids[k], next);
        return next;
      case Ast::Alt: {
        std::vector<int> eps;
        for (const Ast& k : a.kids) eps.push_back(build(k, next));
        return add_raw({{}, -1, std::move(eps), true, false});
      }
      case Ast::Rep: {
        int tail = next;
        if (a.max < 0) {
          const int loop = add_raw({{}, -1, {}, true, false});
          const int body = build(a.kids[0], loop);
          raw[static_cast<size_t>(loop)].eps = {body, next};
          tail = loop;
        } else {
          for (int k = a.min; k < a.max; ++k) {
            const int body = build(a.kids[0], tail);
            tail = add_raw({{}, -1, {body, next}, true, false});
          }
        }
        for (int k = 0; k < a.min; ++k) tail = build(a.kids[0], tail);
        return tail;
      }
    }
    return next;
  }
};

JsonPattern JsonPattern::compile(std::string_view re, const std::string& path) {
  PatternCompiler c{{}, 0, path, 0, {}};
  const auto* at = reinterpret_cast<const unsigned char*>(re.data());
  for (const auto* end = at + re.size(); at < end;) {
    const unicode::Decoded d = unicode::decode_utf8(at, end);
    if (d.cp == unicode::kInvalid) c.refuse("is not valid UTF-8");
    c.cp.push_back(d.cp);
    at += d.len;
  }
  // ^ and $ only around the whole pattern; unanchored ends take anything.
  const bool head = !c.cp.empty() && c.cp.front() == '^';
  bool tail = false;
  if (!c.cp.empty() && c.cp.back() == '$') {
    size_t slashes = 0;
    for (size_t k = c.cp.size() - 1; k-- > 0 && c.cp[k] == '\\';) ++slashes;
    tail = slashes % 2 == 0;
  }
  if (tail) c.cp.pop_back();
  if (head) c.i = 1;
  Ast body = c.alt();
  if (!c.end()) c.refuse("a ')' without its '('");
  if ((head || tail) && body.kind == Ast::Alt)
    c.refuse("^ or $ beside a top-level | is not supported: put the alternatives in a group, as in ^(a|b)$");
  Ast any_run;
  any_run.kind = Ast::Rep, any_run.min = 0, any_run.max = -1;
  any_run.kids.push_back(PatternCompiler::cls({{0, kMaxCp}}));
  Ast whole;
  if (!head) whole.kids.push_back(any_run);
  whole.kids.push_back(std::move(body));
  if (!tail) whole.kids.push_back(any_run);
  const int match = c.add_raw({{}, -1, {}, false, true});
  const int entry = c.build(whole, match);

  // Number the character states and the match state; close each over the splits.
  std::vector<int> id(c.raw.size(), -1);
  JsonPattern p;
  p.built_ = static_cast<int>(c.raw.size());
  for (size_t k = 0; k < c.raw.size(); ++k)
    if (!c.raw[k].split) {
      if (static_cast<int>(p.cls_.size()) >= kMaxStates)
        c.refuse("the pattern needs more than " + std::to_string(kMaxStates) + " states (counted repetitions are copies)");
      id[k] = static_cast<int>(p.cls_.size());
      p.cls_.push_back(c.raw[k].cls);
    }
  std::vector<Set> closure(c.raw.size());
  std::vector<uint8_t> done(c.raw.size(), 0);
  auto close = [&](int start) {
    if (done[static_cast<size_t>(start)]) return closure[static_cast<size_t>(start)];
    Set s{};
    std::vector<int> stack = {start};
    std::vector<uint8_t> seen(c.raw.size(), 0);
    while (!stack.empty()) {
      const int k = stack.back();
      stack.pop_back();
      if (seen[static_cast<size_t>(k)]) continue;
      seen[static_cast<size_t>(k)] = 1;
      const auto& r = c.raw[static_cast<size_t>(k)];
      if (!r.split) add(s, id[static_cast<size_t>(k)]);
      else for (int e : r.eps) stack.push_back(e);
    }
    done[static_cast<size_t>(start)] = 1;
    closure[static_cast<size_t>(start)] = s;
    return s;
  };
  p.to_.assign(p.cls_.size(), Set{});
  for (size_t k = 0; k < c.raw.size(); ++k)
    if (!c.raw[k].split && !c.raw[k].match) p.to_[static_cast<size_t>(id[k])] = close(c.raw[k].next);
  p.start_ = close(entry);
  add(p.match_, id[static_cast<size_t>(match)]);
  // Live: the match state, and character states that take something into a live one.
  Set live = p.match_;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t k = 0; k < p.cls_.size(); ++k)
      if (!has(live, static_cast<int>(k)) && !p.cls_[k].empty() && meets(p.to_[k], live)) add(live, static_cast<int>(k)), changed = true;
  }
  if (!meets(p.start_, live)) c.refuse("no string can match the pattern");
  p.live_.assign(p.cls_.size(), 0);
  for (size_t k = 0; k < p.cls_.size(); ++k) p.live_[k] = !p.cls_[k].empty() && meets(p.to_[k], live);
  return p;
}

JsonPattern::Set JsonPattern::step(const Set& s, uint32_t cp) const {
  Set out{};
  for (int w = 0; w < 2; ++w)
    for (uint64_t bits = s[static_cast<size_t>(w)]; bits; bits &= bits - 1) {
      const size_t k = static_cast<size_t>(w * 64 + __builtin_ctzll(bits));
      if (k < cls_.size() && live_[k] && contains(cls_[k], cp)) out[0] |= to_[k][0], out[1] |= to_[k][1];
    }
  return out;
}

bool JsonPattern::any_in(const Set& s, uint32_t lo, uint32_t hi) const {
  for (int w = 0; w < 2; ++w)
    for (uint64_t bits = s[static_cast<size_t>(w)]; bits; bits &= bits - 1) {
      const size_t k = static_cast<size_t>(w * 64 + __builtin_ctzll(bits));
      if (k < cls_.size() && live_[k] && overlaps(cls_[k], lo, hi)) return true;
    }
  return false;
}

bool JsonPattern::accepts(const Set& s) const { return meets(s, match_); }

}  // namespace dsv4
