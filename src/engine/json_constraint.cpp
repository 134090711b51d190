#include "engine/json_constraint.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "core/error.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace dsv4 {

namespace {

// Texts that change how the server reads an answer (text/completion_stream.h), by bit.
enum Marker : uint8_t { kThinkEndBit = 1, kEosBit = 2, kBlockBit = 4 };
const std::string& marker(int k) {
  static const std::string m[3] = {kThinkEndText, kEosText, kToolCallsOpenText};
  return m[k];
}
constexpr int kMarkers = 3;

size_t longest_marker() {
  size_t n = 0;
  for (int k = 0; k < kMarkers; ++k) n = std::max(n, marker(k).size());
  return n;
}

// Whether marker m ends at bytes[i] in the text tail + bytes.
bool ends_at(const std::string& tail, std::string_view bytes, size_t i, const std::string& m) {
  const size_t end = tail.size() + i + 1;  // in the joined text
  if (end < m.size()) return false;
  for (size_t k = 0; k < m.size(); ++k) {
    const size_t p = end - m.size() + k;
    const char c = p < tail.size() ? tail[p] : bytes[p - tail.size()];
    if (c != m[k]) return false;
  }
  return true;
}

// The first marker in `bits` that ends inside `bytes` (after tail): its number and the index in
// bytes just past it; -1 when none does.
int first_marker(const std::string& tail, std::string_view bytes, uint8_t bits, size_t& past) {
  for (size_t i = 0; i < bytes.size(); ++i)
    for (int k = 0; k < kMarkers; ++k)
      if ((bits >> k & 1) && bytes[i] == marker(k).back() && ends_at(tail, bytes, i, marker(k))) {
        past = i + 1;
        return k;
      }
  return -1;
}

// The code point starting at b[i] (string text: valid UTF-8); i moves past it.
uint32_t next_code_point(const std::string& b, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  if (p[i] < 0x80) return p[i++];  // (most of it: the mask walks every token of text)
  const unicode::Decoded d = unicode::decode_utf8(p + i, p + b.size());
  i += d.len;
  return d.cp;
}

// Whether b, inside a JSON string, is text that leaves the string open and needs nothing after it.
bool plain_string_text(const std::string& b) {
  JsonGrammarState j(JsonGrammar::any_object().get());
  if (!j.push("{\"a\":\"")) return false;
  for (char c : b)
    if (c == '"' || c == '\\' || !j.push(static_cast<uint8_t>(c))) return false;
  return j.in_string_text();
}

}  // namespace

JsonVocab::JsonVocab(const Tokenizer& tok, int64_t vocab, int32_t eos)
    : bytes_(static_cast<size_t>(vocab)), kind_(static_cast<size_t>(vocab), Never), marker_end_(static_cast<size_t>(vocab), 0),
      string_text_(static_cast<size_t>(vocab), 0), text_chars_(static_cast<size_t>(vocab), 0), eos_(eos) {
  if (auto t = tok.find_token(kThinkEndText); t && *t < vocab) think_end_ = *t;
  const int64_t known = std::min<int64_t>(vocab, tok.vocab_size());
  for (int64_t id = 0; id < known; ++id) {
    const auto i = static_cast<int32_t>(id);
    std::string b;
    try {
      b = tok.token_text(i);
    } catch (const Error&) {
      continue;  // an id the tokenizer does not know
    }
    if (b.empty() || i == eos) continue;
    if (i == think_end_) kind_[id] = ThinkEnd;
    else if (!tok.is_added(i)) kind_[id] = Plain;  // (chat markup stays Never; its bytes are kept for the tool-call opening)
    for (int k = 0; k < kMarkers; ++k)
      if (b.find(marker(k).back()) != std::string::npos) marker_end_[id] |= static_cast<uint8_t>(1 << k);
    if (kind_[id] == Plain) by_first_[static_cast<uint8_t>(b[0])].push_back(i);
    string_text_[id] = kind_[id] == Plain && plain_string_text(b);
    if (string_text_[id]) {
      size_t n = 0;
      for (size_t k = 0; k < b.size(); ++n) next_code_point(b, k);
      text_chars_[id] = static_cast<uint16_t>(std::min<size_t>(n, UINT16_MAX));
    }
    bytes_[id] = std::move(b);
  }
  for (int64_t id = 0; id < vocab; ++id)
    if (kind_[static_cast<size_t>(id)] != Plain) not_plain_.push_back(static_cast<int32_t>(id));
}

JsonConstraint::JsonConstraint(std::shared_ptr<const JsonVocab> vocab, std::shared_ptr<const JsonGrammar> grammar,
                               bool reasoning_first, bool tool_calls)
    : vocab_(std::move(vocab)), grammar_(std::move(grammar)), reasoning_(reasoning_first), tools_(tool_calls),
      opener_ok_(tool_calls), json_(grammar_.get()) {}

namespace {

// Whether t is whitespace (at most kMaxSpaces bytes) and then the tool-call block's opening text:
// 2 when the opening is whole, 1 when t ends inside it (or before it), 0 when t is neither.
// t is a + b, read in place (the mask asks this of every token while undecided).
int opener_fits(std::string_view a, std::string_view b) {
  const std::string_view o = kToolCallsOpenText;
  const size_t n = a.size() + b.size();
  auto at = [&](size_t k) { return k < a.size() ? a[k] : b[k - a.size()]; };
  for (size_t p = 0; p <= n && p <= static_cast<size_t>(JsonGrammarState::kMaxSpaces); ++p) {
    const size_t m = std::min(n - p, o.size());
    size_t k = 0;
    while (k < m && at(p + k) == o[k]) ++k;
    if (k == m) return n - p >= o.size() ? 2 : 1;
    if (p == n || (at(p) != ' ' && at(p) != '\t' && at(p) != '\n' && at(p) != '\r')) break;
  }
  return 0;
}

}  // namespace

bool JsonConstraint::answer_allows(std::string_view bytes) const {
  if (free_) return true;
  if (undecided() && opener_fits(lead_, bytes) > 0) return true;
  if (!json_ok_) return false;
  JsonGrammarState j = json_;
  return j.push(bytes);
}

void JsonConstraint::answer_push(std::string_view bytes) {
  if (free_) return;
  if (undecided()) {
    lead_ += bytes;
    const int o = opener_fits(lead_, {});
    if (o == 2) {
      free_ = true;
      return;
    }
    opener_ok_ = o == 1;
  }
  if (json_ok_) json_ok_ = json_.push(bytes);
}

bool JsonConstraint::reasoning_allows(const std::string& bytes, size_t& json_from) const {
  json_from = std::string::npos;
  size_t past = 0;
  const int k = first_marker(tail_, bytes, kThinkEndBit | kEosBit | kBlockBit, past);
  if (k < 0) return true;
  if (k != 0) return false;  // the end-of-sentence text or a tool-call block: the answer would end
  json_from = past;
  const std::string_view rest = std::string_view(bytes).substr(past);
  return answer_allows(rest) && rest.find(kEosText) == std::string_view::npos;  // (the answer has not begun)
}

int32_t JsonConstraint::PatternDfa::id(const JsonPattern::Set& s) {
  if (auto it = ids.find(s); it != ids.end()) return it->second;
  if (sets.size() >= 4096) ids.clear(), sets.clear(), ascii.clear(), other.clear(), ++generation;  // a pathological pattern: start over
  const auto n = static_cast<int32_t>(sets.size());
  ids.emplace(s, n);
  sets.push_back(s);
  ascii.emplace_back().fill(-2);
  return n;
}

int32_t JsonConstraint::PatternDfa::next(const JsonPattern& p, int32_t from, uint32_t cp) {
  const uint64_t key = static_cast<uint64_t>(from) << 21 | cp;
  if (cp < 128) {
    if (ascii[static_cast<size_t>(from)][cp] != -2) return ascii[static_cast<size_t>(from)][cp];
  } else if (auto it = other.find(key); it != other.end()) {
    return it->second;
  }
  const JsonPattern::Set s = sets[static_cast<size_t>(from)];
  const uint32_t gen = generation;
  const int32_t to = p.any_in(s, cp, cp) ? id(p.step(s, cp)) : -1;
  if (gen != generation) return to;  // the numbering restarted: `from` is gone
  if (cp < 128) ascii[static_cast<size_t>(from)][cp] = to;
  else other.emplace(key, to);
  return to;
}

bool JsonConstraint::PatternDfa::fits(const JsonPattern& p, int32_t from, const std::string& text) {
  // (A restart of the numbering inside next() leaves `s` valid: it is the id just given.)
  int32_t s = from;
  for (size_t i = 0; i < text.size() && s >= 0;) s = next(p, s, next_code_point(text, i));
  return s >= 0;
}

JsonConstraint::PatternDfa& JsonConstraint::dfa(int pattern) const {
  for (PatternDfa& d : dfas_)
    if (d.pattern == pattern) return d;
  PatternDfa& d = dfas_.emplace_back();
  d.pattern = pattern;
  return d;
}

bool JsonConstraint::allows(int32_t id) const {
  const JsonVocab& v = *vocab_;
  if (id < 0 || id >= v.size()) return false;
  if (free_) return true;
  if (!reasoning_ && complete()) return id == v.eos_;
  const uint8_t kind = v.kind_[static_cast<size_t>(id)];
  const std::string& b = v.bytes_[static_cast<size_t>(id)];
  const uint8_t ends = v.marker_end_[static_cast<size_t>(id)];
  if (reasoning_) {
    if (kind == JsonVocab::Never) return false;
    size_t from;
    return ends == 0 || reasoning_allows(b, from);
  }
  if (id == v.eos_ || b.empty()) return false;
  if (undecided() && opener_fits(lead_, b) > 0) return true;  // the tool-call block's opening, markup included
  if (kind != JsonVocab::Plain || !json_ok_) return false;
  JsonGrammarState j = json_;
  if (!j.push(b)) return false;
  size_t past;
  // In the JSON only the end-of-sentence text can appear (inside a string); a tool-call block
  // starts with two raw newlines, which no JSON text holds before a '<'.
  return !(ends & kEosBit) || first_marker(tail_, b, kEosBit, past) < 0;
}

int64_t JsonConstraint::mask(float* logits) const {
  const JsonVocab& v = *vocab_;
  const int64_t V = v.size();
  int64_t left = 0;
  if (free_) return V;  // a tool-call block: free text
  if (reasoning_ || complete() || undecided()) {
    for (int64_t id = 0; id < V; ++id) {
      if (allows(static_cast<int32_t>(id))) ++left;
      else logits[id] = -INFINITY;
    }
  } else {
    // Most tokens are decided by their first byte alone (outside strings, few bytes can come).
    for (int32_t id : v.not_plain_) logits[id] = -INFINITY;
    // Inside a string's text, most tokens are text too, and fit whatever came before (as far as
    // the string's length bound and pattern allow).
    const JsonGrammarState::TextSpot spot = json_.text_spot();
    PatternDfa* dfa_at = spot.pattern >= 0 ? &dfa(spot.pattern) : nullptr;
    const JsonPattern* pattern = spot.pattern >= 0 ? &grammar_->pattern(spot.pattern) : nullptr;
    int32_t from = dfa_at ? dfa_at->id(spot.states) : -1;
    uint32_t generation = dfa_at ? dfa_at->generation : 0;
    const bool free_text = spot.room == UINT32_MAX && !dfa_at;  // (no per-token lookups then)
    for (int c = 0; c < 256; ++c) {
      const std::vector<int32_t>& ids = v.by_first_[static_cast<size_t>(c)];
      JsonGrammarState first = json_;
      if (!first.push(static_cast<uint8_t>(c))) {
        for (int32_t id : ids) logits[id] = -INFINITY;
        continue;
      }
      for (int32_t id : ids) {
        const std::string& b = v.bytes_[static_cast<size_t>(id)];
        bool ok;
        if (spot.text && v.string_text_[static_cast<size_t>(id)]) {
          if (dfa_at && dfa_at->generation != generation) from = dfa_at->id(spot.states), generation = dfa_at->generation;
          ok = free_text || (v.text_chars_[static_cast<size_t>(id)] <= spot.room && (!dfa_at || dfa_at->fits(*pattern, from, b)));
        } else {
          JsonGrammarState j = first;
          ok = j.push(std::string_view(b).substr(1));
        }
        size_t past;
        ok = ok && (!(v.marker_end_[static_cast<size_t>(id)] & kEosBit) || first_marker(tail_, b, kEosBit, past) < 0);
        if (ok) ++left;
        else logits[id] = -INFINITY;
      }
    }
  }
  if (left == 0) throw Error("JSON constraint: no token can continue the answer (end-of-sentence token " + std::to_string(v.eos_) + ")",
                              ErrorKind::Internal);
  return left;
}

void JsonConstraint::push(int32_t id) {
  if (!allows(id)) throw Error("JSON constraint: token " + std::to_string(id) + " cannot come next");
  const JsonVocab& v = *vocab_;
  if (id == v.eos_) return;
  const std::string& b = v.bytes_[static_cast<size_t>(id)];
  if (reasoning_) {
    size_t from;
    reasoning_allows(b, from);
    if (from != std::string::npos) {
      reasoning_ = false;
      answer_push(std::string_view(b).substr(from));
    }
  } else {
    answer_push(b);
  }
  static const size_t keep = longest_marker() - 1;
  tail_ += b;
  if (tail_.size() > keep) tail_.erase(0, tail_.size() - keep);
}

int32_t adjusted_pick(Sampler& sampler, const float* logits, int64_t V, const std::vector<int32_t>& history,
                      const std::vector<std::pair<int32_t, float>>& bias, JsonConstraint* json, std::vector<float>& scratch) {
  scratch.assign(logits, logits + V);
  for (const auto& [t, b] : bias) scratch[static_cast<size_t>(t)] += b;
  if (json) json->mask(scratch.data());
  int32_t id = sampler.sample(scratch.data(), V, history);
  if (json) {
    if (!json->allows(id)) id = static_cast<int32_t>(std::max_element(scratch.begin(), scratch.end()) - scratch.begin());
    json->push(id);
  }
  return id;
}

}  // namespace dsv4
