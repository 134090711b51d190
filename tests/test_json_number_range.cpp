// Number bounds (text/json_number_range.h) against brute force: every number text of the bounded
// grammar up to a few bytes is enumerated, its value compared with the bounds in scaled integers,
// and every prefix's feasibility is what the enumeration says it is.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/json_grammar.h"
#include "text/json_number_range.h"

using namespace dsv4;
using ojson = nlohmann::ordered_json;

namespace {

constexpr int kLen = 5;          // texts of at most 5 bytes: at most 3 fraction digits
constexpr int64_t kScale = 1000;  // values and bounds in thousandths, exactly

// Every text of -?(0|[1-9][0-9]*)(\.[0-9]+)? up to kLen bytes (no fraction for integers).
std::vector<std::string> all_numbers(bool integer) {
  std::vector<std::string> out;
  // state 0: in the integer digits, 1: just after '.', 2: in the fraction
  std::function<void(const std::string&, int)> grow = [&](const std::string& t, int state) {
    if (state != 1) out.push_back(t);
    if (static_cast<int>(t.size()) >= kLen) return;
    if (state == 0) {
      if (t != "0" && t != "-0")
        for (char d = '0'; d <= '9'; ++d) grow(t + d, 0);
      if (!integer) grow(t + '.', 1);
    } else {
      for (char d = '0'; d <= '9'; ++d) grow(t + d, 2);
    }
  };
  for (const std::string& start : {std::string(""), std::string("-")})
    for (char d = '0'; d <= '9'; ++d)
      if (static_cast<int>(start.size()) + 1 <= kLen) grow(start + d, 0);
  return out;
}

int64_t scaled(const std::string& t) {
  const bool neg = t[0] == '-';
  const std::string s = t.substr(neg ? 1 : 0);
  const size_t dot = s.find('.');
  std::string ip = s.substr(0, dot), fp = dot == std::string::npos ? "" : s.substr(dot + 1);
  while (fp.size() < 3) fp += '0';
  const int64_t v = std::stoll(ip) * kScale + std::stoll(fp);
  return neg ? -v : v;
}

struct Bounds {
  bool has_lo = false, lo_excl = false, has_hi = false, hi_excl = false;
  int64_t lo = 0, hi = 0;  // thousandths
  bool holds(int64_t v) const {
    if (has_lo && (lo_excl ? v <= lo : v < lo)) return false;
    if (has_hi && (hi_excl ? v >= hi : v > hi)) return false;
    return true;
  }
};

std::string text_of(int64_t thousandths) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%lld.%03lld", thousandths < 0 ? "-" : "", static_cast<long long>(std::llabs(thousandths) / 1000),
                static_cast<long long>(std::llabs(thousandths) % 1000));
  return buf;
}

}  // namespace

TEST(JsonNumberRange, EveryPrefixAsBruteForceSays) {
  // No fraction digit lost: 3 digits, so the leading-zero case "0." still has 3 after it in 5 bytes.
  const std::vector<int64_t> points = {-12500, -3000, -250, -1, 0, 1, 500, 1000, 7000, 9990, 10000, 99900, 123000};
  std::mt19937 g(7);
  int checked = 0;
  for (const bool integer : {false, true}) {
    const std::vector<std::string> texts = all_numbers(integer);
    std::set<std::string> prefixes;
    for (const std::string& t : texts)
      for (size_t n = 0; n <= t.size(); ++n) prefixes.insert(t.substr(0, n));
    for (int round = 0; round < 24; ++round) {
      Bounds b;
      ojson s = {{"type", integer ? "integer" : "number"}};
      if (g() % 4) {
        b.has_lo = true, b.lo = points[g() % points.size()], b.lo_excl = g() % 2;
        s[b.lo_excl ? "exclusiveMinimum" : "minimum"] = ojson::parse(text_of(b.lo));
      }
      if (g() % 4) {
        b.has_hi = true, b.hi = points[g() % points.size()], b.hi_excl = g() % 2;
        if (g() % 2 && b.hi_excl) s["maximum"] = ojson::parse(text_of(b.hi)), s["exclusiveMaximum"] = true;  // draft 4
        else s[b.hi_excl ? "exclusiveMaximum" : "maximum"] = ojson::parse(text_of(b.hi));
      }
      const NumberRange r = NumberRange::from_schema(s, "s");
      std::set<std::string> feasible;
      for (const std::string& t : texts) {
        const bool in = b.holds(scaled(t));
        ASSERT_EQ(r.contains(t), in) << t << " in " << s.dump();
        if (in)
          for (size_t n = 0; n <= t.size(); ++n) feasible.insert(t.substr(0, n));
      }
      for (const std::string& p : prefixes) {
        ASSERT_EQ(r.feasible(p, integer, kLen), feasible.count(p) > 0) << "'" << p << "' with " << s.dump();
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

// Bounds as written in the schema, compared exactly: no rounding through double.
TEST(JsonNumberRange, ExactDecimals) {
  const NumberRange r = NumberRange::from_schema(ojson::parse(R"({"exclusiveMinimum":0.1})"), "s");
  EXPECT_FALSE(r.contains("0.1"));
  EXPECT_TRUE(r.contains("0.10000000000000000000000000001"));
  EXPECT_TRUE(r.contains("12345678901234567890123456789"));
  EXPECT_TRUE(r.feasible("0.1", false, 64));  // more digits
  EXPECT_FALSE(r.feasible("0.1", false, 3));  // no room for them
  const NumberRange big = NumberRange::from_schema(ojson::parse(R"({"minimum":-9007199254740993,"maximum":1e30})"), "s");
  EXPECT_TRUE(big.contains("-9007199254740993"));
  EXPECT_FALSE(big.contains("-9007199254740994"));
  EXPECT_TRUE(big.contains("1000000000000000000000000000000"));
  EXPECT_FALSE(big.contains("1000000000000000000000000000000.5"));
  EXPECT_TRUE(big.feasible("1000000000000000000000000000000", true, 31));   // 1e30
  EXPECT_FALSE(big.feasible("10000000000000000000000000000000", true, 64));  // 1e31 and up
  const NumberRange huge = NumberRange::from_schema(ojson::parse(R"({"minimum":1e30})"), "s");
  EXPECT_TRUE(huge.feasible("1", true, 31));
  EXPECT_FALSE(huge.feasible("1", true, 30));  // 30 digits stay below 1e30
  EXPECT_FALSE(huge.feasible("-", true, 64));
  EXPECT_THROW(NumberRange::from_schema(ojson::parse(R"({"minimum":1e-41})"), "s"), SchemaError);
  EXPECT_THROW(NumberRange::from_schema(ojson::parse(R"({"maximum":[]})"), "s"), SchemaError);
}

// In the grammar: where a bounded number or a bounded string is refused.
TEST(JsonNumberRange, InTheGrammar) {
  const auto g = JsonGrammar::compile(ojson::parse(R"({"type":"object","properties":{"n":{"type":"integer","minimum":10,"maximum":20},
      "x":{"type":"number","exclusiveMinimum":0},"s":{"type":"string","minLength":1,"maxLength":2}}})"),
                                      "s");
  auto accepts = [&](const std::string& t) {
    JsonGrammarState st(g.get());
    return st.push(t) && st.complete();
  };
  auto refused_at = [&](const std::string& t) {
    JsonGrammarState st(g.get());
    for (size_t i = 0; i < t.size(); ++i)
      if (!st.push(static_cast<uint8_t>(t[i]))) return static_cast<int>(i);
    return -1;
  };
  EXPECT_TRUE(accepts(R"({"n":10,"x":0.001,"s":"ab"})"));
  EXPECT_TRUE(accepts(R"({"n":20,"s":"\uD83D\uDE00"})"));  // one character
  EXPECT_EQ(refused_at(R"({"n":3})"), 5);    // 3 cannot become 10-20 ...
  EXPECT_EQ(refused_at(R"({"n":1})"), 6);    // ... 1 can, but not end
  EXPECT_EQ(refused_at(R"({"n":21})"), 6);
  EXPECT_EQ(refused_at(R"({"n":-1})"), 5);
  EXPECT_EQ(refused_at(R"({"x":0})"), 6);    // 0 itself is out, 0.x is in
  EXPECT_EQ(refused_at(R"({"x":-0.5})"), 5);
  EXPECT_EQ(refused_at(R"({"x":1e3})"), 6);  // no exponent
  EXPECT_EQ(refused_at(R"({"s":""})"), 6);
  EXPECT_EQ(refused_at(R"({"s":"abc"})"), 8);
  EXPECT_EQ(refused_at(R"({"s":"a\n\t"})"), 9);
  EXPECT_EQ(refused_at(R"({"s":"é中ü"})"), 11);  // three characters, in UTF-8
  // Which bytes a value can start with, as anyOf branches see them.
  const auto pos = JsonGrammar::compile(ojson::parse(R"({"type":"object","properties":{"v":{"anyOf":[{"type":"integer","exclusiveMinimum":0},
      {"type":"string"}]}}})"), "s");
  const JsonGrammar::Node& v = pos->node(pos->node(pos->root()).values[0]);
  EXPECT_FALSE(pos->starts(v.branches[0], '-'));
  EXPECT_FALSE(pos->starts(v.branches[0], '0'));
  EXPECT_TRUE(pos->starts(v.branches[0], '1'));
}
