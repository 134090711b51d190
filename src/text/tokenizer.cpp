#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "text/unicode.h"

namespace dsv4 {

using nlohmann::json;
using unicode::CharClass;

namespace {

// ---------------------------------------------------------------------------------------------
// Byte-level alphabet (GPT-2): printable Latin-1 bytes stand for themselves, the other 68 bytes
// are mapped in order to U+0100.. so that every byte has a visible, non-space character.

struct ByteLevelMap {
  std::array<std::string, 256> byte_to_utf8;       // byte -> UTF-8 of its character
  std::array<int16_t, 0x144> char_to_byte;         // code point -> byte, or -1

  ByteLevelMap() {
    char_to_byte.fill(-1);
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : 0x100u + static_cast<uint32_t>(extra++);
      char_to_byte[cp] = static_cast<int16_t>(b);
      std::string& s = byte_to_utf8[b];
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
  }
};

const ByteLevelMap& byte_level() {
  static const ByteLevelMap m;
  return m;
}

// HF ByteLevel decoder, per token: the bytes its characters stand for when every character is
// in the alphabet, else the token's own UTF-8.
std::string token_bytes(const std::string& token) {
  const ByteLevelMap& m = byte_level();
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  const auto* end = p + token.size();
  while (p < end) {
    const unicode::Decoded d = unicode::decode_utf8(p, end);
    if (d.cp >= m.char_to_byte.size() || m.char_to_byte[d.cp] < 0) return token;
    out.push_back(static_cast<char>(m.char_to_byte[d.cp]));
    p += d.len;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Added tokens

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// Byte trie over the contents of a set of added tokens: longest match at a position.
class TokenTrie {
 public:
  TokenTrie() : node_token_(1, -1) {}

  void add(const std::string& s, int32_t token) {
    if (s.empty()) return;
    first_[static_cast<unsigned char>(s[0])] = true;
    int32_t node = 0;
    for (unsigned char c : s) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | c;
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        it = edges_.emplace(key, static_cast<int32_t>(node_token_.size())).first;
        node_token_.push_back(-1);
      }
      node = it->second;
    }
    if (node_token_[node] < 0) node_token_[node] = token;  // first of duplicate contents wins
  }

  bool empty() const { return node_token_.size() == 1; }

  // Longest token starting at s[pos]: {length, token}, or {0, -1}.
  std::pair<size_t, int32_t> longest(std::string_view s, size_t pos) const {
    std::pair<size_t, int32_t> best{0, -1};
    if (!first_[static_cast<unsigned char>(s[pos])]) return best;
    int32_t node = 0;
    for (size_t i = pos; i < s.size(); ++i) {
      auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(s[i]));
      if (it == edges_.end()) break;
      node = it->second;
      if (node_token_[node] >= 0) best = {i + 1 - pos, node_token_[node]};
    }
    return best;
  }

 private:
  std::vector<int32_t> node_token_;                // per node: token index ending here, or -1
  std::unordered_map<uint64_t, int32_t> edges_;    // (node << 8 | byte) -> child node
  std::array<bool, 256> first_{};
};

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer: each Split(Regex, Isolated) pattern we know is a hand-written scanner. They
// work on decoded characters and are linear (no backtracking, no recursion).

struct Ch {
  uint32_t off;  // byte offset in the segment
  uint32_t cp;   // code point, or unicode::kInvalid for a stray byte
  CharClass cls;
};

enum class Rule { Digits1to3, CjkRun, DeepSeekWords };

// The patterns exactly as they appear in tokenizer.json (after JSON unescaping).
const char* const kPatternDigits = "\\p{N}{1,3}";
const char* const kPatternCjk = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+";
const char* const kPatternWords =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*"
    "|\\s*[\r\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

inline bool is_cjk(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x30FF);
}
inline bool is_ascii_alpha(uint32_t cp) { return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z'; }
inline bool is_ascii_punct(uint32_t cp) {
  return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
         (cp >= 0x7B && cp <= 0x7E);
}
inline bool is_cr_lf(uint32_t cp) { return cp == '\r' || cp == '\n'; }
inline bool is_lm(CharClass k) { return k == CharClass::Letter || k == CharClass::Mark; }
inline bool is_ps(CharClass k) { return k == CharClass::Punct || k == CharClass::Symbol; }

// End (exclusive) of the match starting at char p of [p, b), or p when the pattern does not match
// there. `b` is the end of the piece: lookahead sees it as the end of the string, as in HF, which
// runs each Split on each piece separately.
size_t match_at(Rule rule, const Ch* c, size_t p, size_t b) {
  switch (rule) {
    case Rule::Digits1to3: {  // \p{N}{1,3}
      size_t e = p;
      while (e < b && e < p + 3 && c[e].cls == CharClass::Number) ++e;
      return e;
    }
    case Rule::CjkRun: {  // [一-龥぀-ゟ゠-ヿ]+
      size_t e = p;
      while (e < b && is_cjk(c[e].cp)) ++e;
      return e;
    }
    case Rule::DeepSeekWords:
      break;
  }
  const uint32_t cp = c[p].cp;
  const CharClass k = c[p].cls;
  // 1. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
  if (is_ascii_punct(cp) && p + 1 < b && is_ascii_alpha(c[p + 1].cp)) {
    size_t e = p + 2;
    while (e < b && is_ascii_alpha(c[e].cp)) ++e;
    return e;
  }
  // 2. [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : the optional char is taken when letters/marks
  //    follow it; otherwise (backtracking) the run must start at p itself.
  if (k == CharClass::Letter) {
    size_t e = p + 1;
    while (e < b && is_lm(c[e].cls)) ++e;
    return e;
  }
  if (!is_ps(k) && !is_cr_lf(cp)) {
    size_t e = p + 1;
    while (e < b && is_lm(c[e].cls)) ++e;
    if (e > p + 1) return e;
    if (k == CharClass::Mark) return p + 1;
  }
  // 3.  ?[\p{P}\p{S}]+[\r\n]*
  {
    size_t q = p;
    if (cp == ' ' && p + 1 < b && is_ps(c[p + 1].cls)) q = p + 1;
    if (is_ps(c[q].cls)) {
      size_t e = q + 1;
      while (e < b && is_ps(c[e].cls)) ++e;
      while (e < b && is_cr_lf(c[e].cp)) ++e;
      return e;
    }
  }
  if (k != CharClass::Space) return p;
  size_t e = p;
  size_t last_nl = b;
  while (e < b && c[e].cls == CharClass::Space) {
    if (is_cr_lf(c[e].cp)) last_nl = e;
    ++e;
  }
  // 4. \s*[\r\n]+ : \s* backs off to the last CR/LF of the run.
  if (last_nl != b) return last_nl + 1;
  // 5. \s+(?!\S) : the whole run at the end of the piece, else all but its last char.
  if (e == b) return e;
  if (e - p >= 2) return e - 1;
  // 6. \s+
  return e;
}

// Split(pattern, Isolated): every match and every gap between matches is a piece, in order.
template <class Emit>
void split_isolated(Rule rule, const Ch* c, size_t a, size_t b, Emit&& emit) {
  size_t gap = a;
  size_t p = a;
  while (p < b) {
    const size_t e = match_at(rule, c, p, b);
    if (e > p) {
      if (gap < p) emit(gap, p);
      emit(p, e);
      p = gap = e;
    } else {
      ++p;
    }
  }
  if (gap < b) emit(gap, b);
}

// Rust regex's \w, which HF uses for single_word: approximated by L, M, N and connector
// punctuation (Pc).
bool is_word_char(uint32_t cp) {
  const CharClass k = unicode::char_class(cp);
  if (k == CharClass::Letter || k == CharClass::Mark || k == CharClass::Number) return true;
  return cp == '_' || cp == 0x203F || cp == 0x2040 || cp == 0x2054 || cp == 0xFE33 || cp == 0xFE34 ||
         (cp >= 0xFE4D && cp <= 0xFE4F) || cp == 0xFF3F;
}

// Code point of the character that ends just before byte `pos`, and its length.
unicode::Decoded char_before(std::string_view s, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && pos - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  unicode::Decoded d = unicode::decode_utf8(p + start, p + pos);
  if (d.cp == unicode::kInvalid || start + d.len != pos) return {unicode::kInvalid, 1};
  return d;
}

unicode::Decoded char_at(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  return unicode::decode_utf8(p + pos, p + s.size());
}

// ---------------------------------------------------------------------------------------------
// JSON helpers

bool truthy(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

std::string str_or(const json& j, const char* key, const std::string& def = "") {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : def;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  std::string file;

  // BPE model
  std::unordered_map<std::string, int32_t> vocab;
  std::array<int32_t, 256> byte_id{};                  // id of each byte's one-char token, or -1
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, new id)
  bool ignore_merges = false;
  int32_t unk_id = -1;
  bool fuse_unk = false;

  // Added tokens, and the two tries of HF's two extraction passes.
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_by_content;
  TokenTrie trie_raw;         // normalized == false: matched on the original text first
  TokenTrie trie_normalized;  // normalized == true: matched on what is left

  std::vector<Rule> rules;

  // Per id: decoded bytes, whether the id exists, whether it is special, whether it is added.
  std::vector<std::string> id_bytes;
  std::vector<uint8_t> id_known;
  std::vector<uint8_t> id_special;
  std::vector<uint8_t> id_added;

  void fail(const std::string& what) const { throw Error(file + ": " + what); }

  void parse(const json& j);
  void parse_model(const json& m);
  void parse_pre_tokenizer(const json& p);

  void encode_added(std::string_view text, std::vector<int32_t>& out) const;
  void split_added(std::string_view s, const TokenTrie& trie, const std::function<void(int32_t)>& on_token,
                   const std::function<void(size_t, size_t)>& on_text) const;
  void encode_segment(std::string_view seg, std::vector<int32_t>& out) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
};

void Tokenizer::Impl::parse(const json& j) {
  if (!j.is_object()) fail("not a tokenizer.json (top level is not an object)");
  auto model = j.find("model");
  if (model == j.end() || !model->is_object()) fail("missing \"model\"");
  parse_model(*model);

  if (auto n = j.find("normalizer"); n != j.end() && !n->is_null()) {
    const std::string type = str_or(*n, "type");
    const bool empty_sequence = type == "Sequence" && n->contains("normalizers") &&
                                (*n)["normalizers"].is_array() && (*n)["normalizers"].empty();
    if (!empty_sequence) fail("unsupported normalizer " + n->dump().substr(0, 200));
  }
  if (auto d = j.find("decoder"); d != j.end() && !d->is_null() && str_or(*d, "type") != "ByteLevel")
    fail("unsupported decoder type '" + str_or(*d, "type") + "' (only ByteLevel)");
  auto pre = j.find("pre_tokenizer");
  if (pre == j.end() || pre->is_null()) fail("missing \"pre_tokenizer\" (a ByteLevel one is required)");
  parse_pre_tokenizer(*pre);

  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab) max_id = std::max(max_id, id);
  if (auto at = j.find("added_tokens"); at != j.end() && !at->is_null()) {
    if (!at->is_array()) fail("\"added_tokens\" is not an array");
    for (const json& t : *at) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
          !t["content"].is_string())
        fail("bad added token " + t.dump().substr(0, 200));
      AddedToken a;
      a.content = t["content"].get<std::string>();
      a.id = t["id"].get<int32_t>();
      if (a.id < 0) fail("negative added token id " + std::to_string(a.id));
      a.special = truthy(t, "special");
      a.lstrip = truthy(t, "lstrip");
      a.rstrip = truthy(t, "rstrip");
      a.single_word = truthy(t, "single_word");
      a.normalized = truthy(t, "normalized");
      max_id = std::max(max_id, a.id);
      if (a.content.empty()) continue;
      added_by_content.emplace(a.content, a.id);
      (a.normalized ? trie_normalized : trie_raw).add(a.content, static_cast<int32_t>(added.size()));
      added.push_back(std::move(a));
    }
  }

  if (max_id >= (1 << 24)) fail("implausible token id " + std::to_string(max_id));
  const size_t n = static_cast<size_t>(max_id + 1);
  id_bytes.assign(n, {});
  id_known.assign(n, 0);
  id_special.assign(n, 0);
  id_added.assign(n, 0);
  for (const auto& [tok, id] : vocab) {
    id_bytes[id] = token_bytes(tok);
    id_known[id] = 1;
  }
  for (const AddedToken& a : added) {  // an added token's text wins over a vocab entry of the same id
    id_bytes[a.id] = token_bytes(a.content);
    id_known[a.id] = 1;
    id_special[a.id] = a.special;
    id_added[a.id] = 1;
  }
}

void Tokenizer::Impl::parse_model(const json& m) {
  const std::string type = str_or(m, "type", "BPE");
  if (type != "BPE") fail("unsupported model type '" + type + "' (only BPE)");
  if (auto d = m.find("dropout"); d != m.end() && !d->is_null() && d->get<double>() != 0.0)
    fail("BPE dropout is not supported");
  if (!str_or(m, "continuing_subword_prefix").empty() || !str_or(m, "end_of_word_suffix").empty())
    fail("BPE continuing_subword_prefix / end_of_word_suffix are not supported");
  if (truthy(m, "byte_fallback")) fail("BPE byte_fallback is not supported");
  ignore_merges = truthy(m, "ignore_merges");
  fuse_unk = truthy(m, "fuse_unk");

  auto v = m.find("vocab");
  if (v == m.end() || !v->is_object()) fail("model.vocab is missing or not an object");
  vocab.reserve(v->size());
  for (const auto& [tok, id] : v->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      fail("bad id for vocab entry " + json(tok).dump());
    vocab.emplace(tok, id.get<int32_t>());
  }
  if (std::string unk = str_or(m, "unk_token"); !unk.empty()) {
    auto it = vocab.find(unk);
    if (it == vocab.end()) fail("unk_token " + json(unk).dump() + " is not in the vocab");
    unk_id = it->second;
  }
  const ByteLevelMap& bl = byte_level();
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(bl.byte_to_utf8[b]);
    byte_id[b] = it == vocab.end() ? -1 : it->second;
  }

  auto ms = m.find("merges");
  if (ms == m.end() || !ms->is_array()) fail("model.merges is missing or not an array");
  merges.reserve(ms->size() * 2);
  int32_t rank = 0;
  for (const json& e : *ms) {
    std::string a, b;
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail("bad merge #" + std::to_string(rank + 1) + ": " + json(s).dump());
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      fail("bad merge #" + std::to_string(rank + 1) + ": " + e.dump().substr(0, 200));
    }
    auto ia = vocab.find(a), ib = vocab.find(b), inew = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || inew == vocab.end())
      fail("merge #" + std::to_string(rank + 1) + " uses a token missing from the vocab: " + json(a + " " + b).dump());
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                         static_cast<uint32_t>(ib->second);
    merges[key] = {rank, inew->second};  // a repeated pair keeps its last rank, as in HF
    ++rank;
  }
}

void Tokenizer::Impl::parse_pre_tokenizer(const json& p) {
  std::vector<json> steps;
  if (str_or(p, "type") == "Sequence") {
    auto it = p.find("pretokenizers");
    if (it == p.end() || !it->is_array()) fail("pre_tokenizer Sequence without \"pretokenizers\"");
    steps.assign(it->begin(), it->end());
  } else {
    steps.push_back(p);
  }
  bool byte_level_seen = false;
  for (const json& s : steps) {
    const std::string type = str_or(s, "type");
    if (byte_level_seen) fail("unsupported pre_tokenizer: a step after ByteLevel (" + type + ")");
    if (type == "ByteLevel") {
      if (truthy(s, "add_prefix_space")) fail("unsupported pre_tokenizer: ByteLevel with add_prefix_space");
      auto ur = s.find("use_regex");
      if (ur == s.end() || !ur->is_boolean() || ur->get<bool>())
        fail("unsupported pre_tokenizer: ByteLevel with use_regex (only use_regex=false)");
      byte_level_seen = true;
    } else if (type == "Split") {
      const std::string behavior = str_or(s, "behavior");
      if (behavior != "Isolated" || truthy(s, "invert"))
        fail("unsupported pre_tokenizer: Split with behavior '" + behavior + "'" +
             (truthy(s, "invert") ? " and invert" : "") + " (only Isolated)");
      std::string pattern;
      if (auto pat = s.find("pattern"); pat != s.end() && pat->is_object()) pattern = str_or(*pat, "Regex");
      if (pattern == kPatternDigits) {
        rules.push_back(Rule::Digits1to3);
      } else if (pattern == kPatternCjk) {
        rules.push_back(Rule::CjkRun);
      } else if (pattern == kPatternWords) {
        rules.push_back(Rule::DeepSeekWords);
      } else {
        fail("unsupported pre_tokenizer Split pattern " + (s.contains("pattern") ? s["pattern"].dump() : "(none)") +
             " (only the DeepSeek-V4 patterns are implemented)");
      }
    } else {
      fail("unsupported pre_tokenizer type '" + type + "'");
    }
  }
  if (!byte_level_seen) fail("unsupported pre_tokenizer: no ByteLevel step");
}

// HF AddedVocabulary::find_matches: leftmost-longest matches, honouring single_word / lstrip /
// rstrip; the text between tokens goes to on_text.
void Tokenizer::Impl::split_added(std::string_view s, const TokenTrie& trie,
                                  const std::function<void(int32_t)>& on_token,
                                  const std::function<void(size_t, size_t)>& on_text) const {
  const size_t n = s.size();
  size_t done = 0;  // end of the last token taken
  size_t pos = 0;
  if (!trie.empty()) {
    while (pos < n) {
      const auto [len, index] = trie.longest(s, pos);
      if (len == 0) {
        ++pos;
        continue;
      }
      const AddedToken& t = added[index];
      size_t start = pos, stop = pos + len;
      pos = stop;
      if (t.single_word) {
        const bool word_before = start > 0 && is_word_char(char_before(s, start).cp);
        const bool word_after = stop < n && is_word_char(char_at(s, stop).cp);
        if (word_before || word_after) continue;
      }
      if (t.lstrip) {
        while (start > done) {
          const unicode::Decoded d = char_before(s, start);
          if (d.cp == unicode::kInvalid || unicode::char_class(d.cp) != CharClass::Space) break;
          start -= d.len;
        }
        start = std::max(start, done);
      }
      if (t.rstrip) {
        while (stop < n) {
          const unicode::Decoded d = char_at(s, stop);
          if (d.cp == unicode::kInvalid || unicode::char_class(d.cp) != CharClass::Space) break;
          stop += d.len;
        }
        pos = stop;  // (HF resumes at the match end; they differ only for tokens starting with whitespace)
      }
      if (done < start) on_text(done, start);
      on_token(t.id);
      done = stop;
    }
  }
  if (done < n) on_text(done, n);
}

void Tokenizer::Impl::encode_added(std::string_view text, std::vector<int32_t>& out) const {
  auto push_id = [&](int32_t id) { out.push_back(id); };
  split_added(text, trie_raw, push_id, [&](size_t a, size_t b) {
    const std::string_view part = text.substr(a, b - a);
    split_added(part, trie_normalized, push_id,
                [&](size_t x, size_t y) { encode_segment(part.substr(x, y - x), out); });
  });
}

void Tokenizer::Impl::encode_segment(std::string_view seg, std::vector<int32_t>& out) const {
  std::vector<Ch> chars;
  chars.reserve(seg.size() + 1);
  const auto* base = reinterpret_cast<const unsigned char*>(seg.data());
  const auto* end = base + seg.size();
  for (const unsigned char* p = base; p < end;) {
    const unicode::Decoded d = unicode::decode_utf8(p, end);
    const CharClass k = d.cp == unicode::kInvalid ? CharClass::Other : unicode::char_class(d.cp);
    chars.push_back({static_cast<uint32_t>(p - base), d.cp, k});
    p += d.len;
  }
  const size_t nchars = chars.size();
  chars.push_back({static_cast<uint32_t>(seg.size()), 0, CharClass::Other});  // sentinel: end offset
  const Ch* c = chars.data();

  // Stages run depth-first so pieces come out in text order; depth is the number of rules.
  std::function<void(size_t, size_t, size_t)> stage = [&](size_t r, size_t a, size_t b) {
    if (r == rules.size()) {
      bpe(seg.substr(c[a].off, c[b].off - c[a].off), out);
      return;
    }
    split_isolated(rules[r], c, a, b, [&](size_t x, size_t y) { stage(r + 1, x, y); });
  };
  if (nchars > 0) stage(0, 0, nchars);
}

// HF BPE (Word::merge_all): repeatedly merge the adjacent pair of lowest rank, leftmost first.
void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges) {
    std::string bl;
    for (unsigned char ch : piece) bl += byte_level().byte_to_utf8[ch];
    if (auto it = vocab.find(bl); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Sym {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Sym> sym;
  sym.reserve(piece.size());
  bool pending_unk = false;
  auto add = [&](int32_t id) {
    const int32_t i = static_cast<int32_t>(sym.size());
    sym.push_back({id, i - 1, i + 1, true});
  };
  for (unsigned char ch : piece) {
    const int32_t id = byte_id[ch];
    if (id >= 0) {
      if (pending_unk) add(unk_id), pending_unk = false;
      add(id);
    } else if (unk_id >= 0) {
      if (pending_unk && !fuse_unk) add(unk_id);
      pending_unk = true;
    }  // else: HF drops a character with no token and no unk
  }
  if (pending_unk) add(unk_id);
  if (sym.empty()) return;
  sym.back().next = -1;
  if (sym.size() == 1) {
    out.push_back(sym[0].id);
    return;
  }

  struct Cand {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
  };
  auto worse = [](const Cand& x, const Cand& y) { return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos; };
  std::vector<Cand> heap;
  auto lookup = [&](int32_t l, int32_t r) -> const std::pair<int32_t, int32_t>* {
    auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r));
    return it == merges.end() ? nullptr : &it->second;
  };
  auto push = [&](int32_t pos) {
    const Sym& s = sym[pos];
    if (s.next < 0) return;
    if (const auto* m = lookup(s.id, sym[s.next].id)) {
      heap.push_back({m->first, pos, m->second});
      std::push_heap(heap.begin(), heap.end(), worse);
    }
  };
  heap.reserve(sym.size());
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i)
    if (const auto* m = lookup(sym[i].id, sym[i + 1].id)) heap.push_back({m->first, i, m->second});
  std::make_heap(heap.begin(), heap.end(), worse);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Cand top = heap.back();
    heap.pop_back();
    Sym& s = sym[top.pos];
    if (!s.alive || s.next < 0) continue;
    // A stale entry: the pair at pos changed since it was queued.
    const auto* m = lookup(s.id, sym[s.next].id);
    if (m == nullptr || m->second != top.new_id) continue;
    Sym& right = sym[s.next];
    s.id = top.new_id;
    right.alive = false;
    s.next = right.next;
    if (s.next >= 0) sym[s.next].prev = top.pos;
    if (s.prev >= 0) push(s.prev);
    push(top.pos);
  }
  for (const Sym& s : sym)
    if (s.alive) out.push_back(s.id);
}

// ---------------------------------------------------------------------------------------------

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::string file = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "tokenizer.json").string();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error("tokenizer: cannot open " + file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse(text, file);
}

Tokenizer Tokenizer::parse(std::string_view json_text, const std::string& file) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(file + ": invalid JSON: " + e.what());
  }
  auto impl = std::make_shared<Impl>();
  impl->file = file;
  try {
    impl->parse(j);
  } catch (const json::exception& e) {  // a field of the wrong JSON type
    throw Error(file + ": malformed tokenizer.json: " + e.what());
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  impl_->encode_added(text, out);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids)
    if (id >= 0 && id < vocab_size() && impl_->id_known[id]) out += impl_->id_bytes[id];
  return out;
}

std::string Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !impl_->id_known[id])
    throw Error("tokenizer: unknown token id " + std::to_string(id) + " (vocab size " +
                std::to_string(vocab_size()) + ")");
  return impl_->id_bytes[id];
}

std::optional<int32_t> Tokenizer::find_token(std::string_view token) const {
  const std::string key(token);
  if (auto it = impl_->added_by_content.find(key); it != impl_->added_by_content.end()) return it->second;
  if (auto it = impl_->vocab.find(key); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_bytes.size()); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_special[id] != 0;
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_added[id] != 0;
}

const std::string& Tokenizer::file() const { return impl_->file; }

// ---------------------------------------------------------------------------------------------

static constexpr const char* kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

std::string StreamDecoder::push(int32_t id) {
  if (id >= 0 && id < tok_.vocab_size() && tok_.impl_->id_known[id]) held_ += tok_.impl_->id_bytes[id];
  std::string out;
  size_t pos = 0;
  while (pos < held_.size()) {
    const std::string_view rest = std::string_view(held_).substr(pos);
    const unicode::Utf8Head h = unicode::utf8_head(rest);
    if (h.incomplete) break;
    const std::string_view ch = rest.substr(0, h.len);
    // Streamed text is always valid UTF-8: a byte that can never start a character becomes U+FFFD.
    if (unicode::is_valid_utf8(ch))
      out += ch;
    else
      out += kReplacementChar;
    pos += h.len;
  }
  held_.erase(0, pos);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = held_.empty() ? std::string() : std::string(kReplacementChar);  // an unfinished character
  held_.clear();
  return out;
}

}  // namespace dsv4
