// String patterns (text/json_pattern.h) against std::regex's ECMAScript grammar: every string of a
// small alphabet up to 5 characters is matched (unanchored, as JSON Schema reads `pattern`) as
// std::regex_search matches it, a prefix of a matching string is never refused, and a refused one
// begins no matching string of that length. Then the pattern inside a grammar, where characters
// arrive as UTF-8 bytes and escapes.
#include <gtest/gtest.h>

#include <functional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/json_grammar.h"
#include "text/json_pattern.h"

using namespace dsv4;
using ojson = nlohmann::ordered_json;

namespace {

// Steps the pattern through s: the index of the first character refused, or -1.
int refused_at(const JsonPattern& p, const std::string& s, JsonPattern::Set& st) {
  st = p.start();
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<uint8_t>(s[i]);
    if (!p.any_in(st, c, c)) return static_cast<int>(i);
    st = p.step(st, c);
  }
  return -1;
}

}  // namespace

TEST(JsonPattern, MatchesAsStdRegexSearch) {
  const std::vector<std::string> patterns = {
      R"(^\d{2}-\d$)", "a+b?", "^(a|b0)*$", "[^a-]1", "^.$", R"(\s)", R"(^[\w.]{2,3}$)", "b{2,}",
      "^(?:ab|a)(1|-)?$", R"(0\.1)", "^$", R"(\D\d)", "^a*?b+?$", R"([a\-0]{2}$)", "^[0-1]{1,2}(a|b){0,2}$", R"(^\x61\u0062$)",
      "^(a|)b$", "^(a*)*b$",
  };
  const std::string alphabet = "ab01-.\n";
  std::vector<std::string> strings = {""};
  for (size_t k = 0; k < strings.size(); ++k)
    if (strings[k].size() < 5)
      for (char c : alphabet) strings.push_back(strings[k] + c);
  for (const std::string& re : patterns) {
    const JsonPattern p = JsonPattern::compile(re, "p");
    const std::regex rx(re, std::regex::ECMAScript);
    std::set<std::string> good;  // prefixes of matching strings
    for (const std::string& s : strings)
      if (std::regex_search(s, rx))
        for (size_t n = 0; n <= s.size(); ++n) good.insert(s.substr(0, n));
    int matched = 0;
    for (const std::string& s : strings) {
      JsonPattern::Set st;
      const int at = refused_at(p, s, st);
      const bool match = std::regex_search(s, rx);
      matched += match;
      if (at < 0) {
        ASSERT_EQ(p.accepts(st), match) << re << " on '" << s << "'";
      } else {
        ASSERT_FALSE(match) << re << " refused '" << s << "' at " << at;
        ASSERT_EQ(good.count(s.substr(0, static_cast<size_t>(at) + 1)), 0u) << re << " refused '" << s << "' at " << at;
      }
    }
    EXPECT_GT(matched, 0) << re;
  }
}

TEST(JsonPattern, RefusesWhatItCannotHold) {
  for (const char* re : {"(?=a)", "(?<n>a)", R"((a)\1)", R"(\bword)", "a|^b", "^a|b$", "(a", "a)", "*a", "a**", "a{2}{3}", "[z-a]",
                         R"(\p{L})", R"(\d{200})", "[]", "^[]$", R"(a\)", R"(\uD800)", "a{3,2}"}) {
    EXPECT_THROW(JsonPattern::compile(re, "p"), SchemaError) << re;
  }
  // A literal '{' that is no quantifier, and an anchor group.
  EXPECT_NO_THROW(JsonPattern::compile("x{", "p"));
  EXPECT_NO_THROW(JsonPattern::compile("^(a|b)$", "p"));
  EXPECT_NO_THROW(JsonPattern::compile(R"(^\$\^$)", "p"));
  // Groups nest at most 32 deep (the parser recurses through them; a fuzzer's 5000 overflowed it).
  EXPECT_NO_THROW(JsonPattern::compile(std::string(32, '(') + "a" + std::string(32, ')'), "p"));
  EXPECT_THROW(JsonPattern::compile(std::string(33, '(') + "a" + std::string(33, ')'), "p"), SchemaError);
  EXPECT_THROW(JsonPattern::compile(std::string(5000, '('), "p"), SchemaError);
}

// A branch that can never match (an empty class ahead) is refused at its first character.
TEST(JsonPattern, DeadBranchesAreRefused) {
  const JsonPattern p = JsonPattern::compile(R"(^(a[^\s\S]|b)$)", "p");
  EXPECT_FALSE(p.any_in(p.start(), 'a', 'a'));
  EXPECT_TRUE(p.any_in(p.start(), 'b', 'b'));
  EXPECT_FALSE(p.any_in(p.start(), 0, 'a'));
}

// In a grammar: characters arrive as UTF-8 bytes and as escapes, and a character is refused at its
// first byte when no character it can still become fits.
TEST(JsonPattern, InTheGrammar) {
  const auto g = JsonGrammar::compile(ojson::parse(R"({"type":"object","properties":{
      "d":{"type":"string","pattern":"^\\d{4}-\\d{2}-\\d{2}$"},
      "e":{"type":"string","pattern":"^[é-ê]+$"},
      "f":{"type":"string","pattern":"^😀$","maxLength":1},
      "n":{"type":"string","pattern":"^a\\nb$"}}})"),
                                      "s");
  auto refused = [&](const std::string& t) {
    JsonGrammarState st(g.get());
    for (size_t i = 0; i < t.size(); ++i)
      if (!st.push(static_cast<uint8_t>(t[i]))) return static_cast<int>(i);
    return st.complete() ? -1 : -2;
  };
  EXPECT_EQ(refused(R"({"d":"2024-01-31"})"), -1);
  EXPECT_EQ(refused(R"({"d":"2024-1"})"), 12);
  EXPECT_EQ(refused(R"({"d":"2024-01-311"})"), 16);
  EXPECT_EQ(refused(R"({"d":"2024"})"), 10);  // cannot close yet
  EXPECT_EQ(refused(R"({"d":"\u0032024-01-31"})"), -1);
  EXPECT_EQ(refused(R"({"d":"\u0061"})"), 10);  // \u00 can still be a digit, \u006 cannot
  EXPECT_EQ(refused(R"({"d":"\u1"})"), 8);      // \u1... is no digit
  EXPECT_EQ(refused(R"({"e":"éê\u00e9"})"), -1);
  EXPECT_EQ(refused("{\"e\":\"\xE4\xB8\xAD\"}"), 6);  // 中: no character from 0xE4 fits
  EXPECT_EQ(refused("{\"e\":\"\xC3\xA0\"}"), 7);      // à: 0xC3 can still be é, 0xA0 makes à
  EXPECT_EQ(refused(R"({"e":"\n"})"), 7);
  EXPECT_EQ(refused(R"({"f":"\uD83D\uDE00"})"), -1);
  EXPECT_EQ(refused("{\"f\":\"\xF0\x9F\x98\x80\"}"), -1);
  EXPECT_EQ(refused(R"({"f":"\uD83C"})"), 11);    // a pair into U+1F000-1F3FF
  EXPECT_EQ(refused(R"({"f":"\u0"})"), 8);        // no pair
  EXPECT_EQ(refused(R"({"f":"\uD83D\uDE01"})"), 17);
  EXPECT_EQ(refused("{\"f\":\"\xF0\x9F\x98\x81\"}"), 9);
  EXPECT_EQ(refused(R"({"n":"a\nb"})"), -1);
  EXPECT_EQ(refused(R"({"n":"a\tb"})"), 8);
}
