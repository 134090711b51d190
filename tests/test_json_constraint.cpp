// JSON-constrained sampling: the byte automaton (text/json_grammar.h) for any object against
// nlohmann's parser, and the token mask (engine/json_constraint.h) over the real tokenizer.
// Schemas: tests/test_json_schema.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/json_constraint.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "json_mask_check.h"
#include "text/chat.h"
#include "text/json_grammar.h"
#include "text/tokenizer.h"
#include "test_util.h"

using namespace dsv4;

namespace {

using JsonPrefix = JsonGrammarState;
const JsonGrammar* object() { return JsonGrammar::any_object().get(); }

// Every proper prefix of s is accepted and incomplete; s itself complete.
void expect_object(const std::string& s) {
  JsonPrefix j(object());
  for (size_t i = 0; i < s.size(); ++i) {
    ASSERT_FALSE(j.complete()) << "complete before byte " << i << " of " << s;
    ASSERT_TRUE(j.push(static_cast<uint8_t>(s[i]))) << "byte " << i << " of " << s;
  }
  EXPECT_TRUE(j.complete()) << s;
}

// s is refused at byte `at` (every byte before it accepted).
void expect_refused_at(const std::string& s, size_t at) {
  JsonPrefix j(object());
  for (size_t i = 0; i < at; ++i) ASSERT_TRUE(j.push(static_cast<uint8_t>(s[i]))) << "byte " << i << " of " << s;
  EXPECT_FALSE(j.push(static_cast<uint8_t>(s[at]))) << "byte " << at << " of " << s;
}

bool accepts_whole(const std::string& s) {
  JsonPrefix j(object());
  return j.push(s) && j.complete();
}

bool nlohmann_object(const std::string& s) {
  try {
    return nlohmann::json::parse(s).is_object();
  } catch (const nlohmann::json::parse_error&) {
    return false;
  } catch (const nlohmann::json::out_of_range&) {
    return s.find_first_not_of(" \t\r\n") == s.find('{');  // valid, but a number beyond double's range
  }
}

// A random JSON value as text, with random whitespace between tokens (at most 3 bytes).
std::string random_value(std::mt19937& g, int depth, bool object) {
  auto ws = [&] {
    static const char* w[] = {"", "", " ", "\n", "\t", "\r\n", "  "};
    return std::string(w[g() % 7]);
  };
  auto str = [&] {
    static const char* parts[] = {"a", "key", " ", "\\n", "\\\"", "\\\\", "\\/", "\\u00e9", "\\uD83D\\uDE00", "é", "中文",
                                  "\xF0\x9F\x98\x80", "\\t", "0", "\\u0000"};
    std::string s = "\"";
    for (int n = static_cast<int>(g() % 4); n > 0; --n) s += parts[g() % 15];
    return s + "\"";
  };
  if (object || (depth < 4 && g() % 3 == 0)) {
    const bool obj = object || g() % 2;
    std::string s = obj ? "{" : "[";
    const int n = static_cast<int>(g() % 4);
    for (int i = 0; i < n; ++i) {
      if (i) s += ws() + ",";
      s += ws();
      if (obj) s += str() + ws() + ":" + ws();
      s += random_value(g, depth + 1, false) + ws();
    }
    if (n == 0) s += ws();
    return s + (obj ? "}" : "]");
  }
  static const char* scalars[] = {"0", "-0", "12", "-7.25", "1e5", "3E-2", "0.5e+10", "true", "false", "null"};
  return g() % 2 ? std::string(scalars[g() % 10]) : str();
}

Tokenizer& tokenizer() {
  static Tokenizer t = Tokenizer::load(dsv4::testing::tokenizer_dir());
  return t;
}

constexpr int32_t kEos = 1;  // the DeepSeek-V4 tokenizer's <｜end▁of▁sentence｜>

std::shared_ptr<const JsonVocab> vocab() {
  static auto v = std::make_shared<const JsonVocab>(tokenizer(), tokenizer().vocab_size(), kEos);
  return v;
}

// Samples a constrained answer from random logits; after `free_steps` picks, the tokens that
// close things ('"', '}', ']', ':', '0') and EOS are favoured so that the object ends.
std::vector<int32_t> sample_answer(uint64_t seed, bool reasoning_first, int free_steps, int max_steps = 600) {
  JsonConstraint c(vocab(), JsonGrammar::any_object(), reasoning_first);
  const int64_t V = vocab()->size();
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 40;  // (a partial sort: the full one is most of the test's time)
  sp.seed = seed;
  Sampler s(sp);
  std::mt19937 g(static_cast<uint32_t>(seed));
  std::normal_distribution<float> noise(0.0f, 2.0f);
  const int32_t think_end = *tokenizer().find_token("</think>");
  std::vector<int32_t> closers;
  for (const char* t : {"\"", "}", "]", ":", "0"}) closers.push_back(tokenizer().encode(t).at(0));
  std::vector<int32_t> out;
  std::vector<float> logits(static_cast<size_t>(V));
  for (int step = 0; step < max_steps; ++step) {
    for (auto& l : logits) l = noise(g);
    if (step >= free_steps) {
      for (int32_t id : closers) logits[id] += 30;
      logits[kEos] += 40;
      logits[think_end] += 40;
    }
    c.mask(logits.data());
    const int32_t id = s.sample(logits.data(), V, out);
    c.push(id);
    if (id == kEos) return out;
    out.push_back(id);
  }
  ADD_FAILURE() << "no end-of-sentence after " << max_steps << " tokens (seed " << seed << ")";
  return out;
}

}  // namespace

TEST(JsonGrammarObject, AcceptsObjectsByteByByte) {
  for (const char* s : {"{}", " \n{ }", "{\"a\":1}", "{\"a\" : [1, -2.5e+3, 0, 0.0, -0E1, true, false, null, {}, []]}",
                        "{\"\\u00e9\\uD83D\\uDE00\\\"\\\\\\/\\b\\f\\n\\r\\t\": \"\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF\"}",
                        "{\"nested\":{\"deeper\":[[[{\"x\":\"\"}]]]}}", "{\"a\":1,\"a\":2}"})
    expect_object(s);
}

TEST(JsonGrammarObject, RefusesWhereNoObjectCanFollow) {
  expect_refused_at("[]", 0);                        // the top level is an object
  expect_refused_at("\"a\"", 0);
  expect_refused_at("{} ", 2);                       // nothing after the object
  expect_refused_at("{}{}", 2);
  expect_refused_at("{\"a\":01}", 6);                // leading zero
  expect_refused_at("{\"a\":1.}", 7);                // a digit after the point
  expect_refused_at("{\"a\":-}", 6);
  expect_refused_at("{\"a\":1e}", 7);
  expect_refused_at("{\"a\":+1}", 5);
  expect_refused_at("{\"a\":1,}", 7);                // trailing comma
  expect_refused_at("{\"a\" 1}", 5);                 // missing colon
  expect_refused_at("{a:1}", 1);                     // unquoted key
  expect_refused_at("{\"a\":[1}", 7);                // closer mismatch
  expect_refused_at("{\"a\":tru }", 8);
  expect_refused_at("{\"a\":nux}", 7);
  expect_refused_at("{\"a\n\":1}", 3);               // a raw control character in a string
  expect_refused_at("{\"\\x\":1}", 3);               // unknown escape
  expect_refused_at("{\"\\u12G4\":1}", 6);
  expect_refused_at("{\"\\uDC00\":1}", 5);           // a low surrogate alone: refused at its 2nd digit
  expect_refused_at("{\"\\uD800\":1}", 8);           // a high surrogate not followed by a low one
  expect_refused_at("{\"\\uD800\\n\":1}", 9);
  expect_refused_at("{\"\\uD800\\uD800\":1}", 11);
  expect_refused_at("{\"\xC0\x80\":1}", 2);          // overlong
  expect_refused_at("{\"\xE0\x80\x80\":1}", 3);
  expect_refused_at("{\"\xED\xA0\x80\":1}", 3);      // an encoded surrogate
  expect_refused_at("{\"\xF4\x90\x80\x80\":1}", 3);  // above U+10FFFF
  expect_refused_at("{\"\xF5\":1}", 2);
  expect_refused_at("{\"\xC3\":1}", 3);              // a character cut short
}

TEST(JsonGrammarObject, LimitsDepthAndWhitespace) {
  std::string deep = "{\"a\":";
  for (int i = 1; i < JsonPrefix::kMaxDepth; ++i) deep += "[";
  JsonPrefix j(object());
  ASSERT_TRUE(j.push(deep));
  JsonPrefix k = j;
  EXPECT_FALSE(k.push('['));     // one more level
  EXPECT_TRUE(j.push("\"x\""));  // a scalar still fits
  std::string spaces(JsonPrefix::kMaxSpaces, ' ');
  JsonPrefix w(object());
  ASSERT_TRUE(w.push("{" + spaces));
  EXPECT_FALSE(w.push(' '));
  JsonPrefix w2(object());
  EXPECT_TRUE(w2.push("{" + spaces + "\"" + spaces + spaces + "\"" + spaces + ":" + spaces + "1" + spaces + "}"));
}

// Random objects, and random one-byte mutations of them: the automaton takes a whole text as a
// complete object exactly when nlohmann's strict parser reads it as an object.
TEST(JsonGrammarObject, AgreesWithAStrictParser) {
  std::mt19937 g(7);
  int objects = 0, rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string s = random_value(g, 0, true);
    ASSERT_TRUE(accepts_whole(s)) << s;
    ASSERT_TRUE(nlohmann_object(s)) << s;
    for (int m = 0; m < 4; ++m) {
      std::string t = s;
      static const char bytes[] = "{}[]\":,\\u0123456789.eE+-tfnl \n\x01\x80\xC3\xED\xF0x";
      const size_t at = g() % t.size();
      const char b = bytes[g() % (sizeof(bytes) - 1)];
      switch (g() % 3) {
        case 0: t[at] = b; break;
        case 1: t.insert(t.begin() + static_cast<long>(at), b); break;
        default: t.erase(at, 1);
      }
      const bool ours = accepts_whole(t), theirs = nlohmann_object(t);
      ASSERT_EQ(ours, theirs) << "text: " << t;
      ++(ours ? objects : rejected);
    }
  }
  EXPECT_GT(objects, 500);
  EXPECT_GT(rejected, 3000);
}

TEST(JsonConstraint, MaskIsEveryTokenThatFitsInKeysAndValues) {
  for (const char* text : {"{\"some key", "{\"a\": \"val", "{\"a\": [1, {\"b", "{\"\\u00", "{\"a\":\"x\\"}) {
    JsonConstraint c(vocab(), JsonGrammar::any_object(), false);
    for (int32_t id : tokenizer().encode(text)) c.push(id);
    dsv4::testing::expect_mask_is_allows(c, vocab()->size(), text);
  }
}

TEST(JsonConstraint, MaskIsEveryTokenThatFits) {
  // States along an answer: the mask (first-byte buckets) against each token pushed alone.
  const std::vector<int32_t> answer = sample_answer(11, false, 40);
  for (size_t step = 0; step <= answer.size(); step += std::max<size_t>(1, answer.size() / 5)) {
    JsonConstraint at(vocab(), JsonGrammar::any_object(), false);
    for (size_t i = 0; i < step; ++i) at.push(answer[i]);
    dsv4::testing::expect_mask_is_allows(at, vocab()->size(), std::to_string(step) + " tokens");
  }
}

// Answers sampled from random logits are JSON objects, whatever was sampled; with reasoning
// first, the reasoning ends with "</think>" and parse_completion reads the object as the content.
TEST(JsonConstraint, SampledAnswersAreObjects) {
  const Tokenizer& tok = tokenizer();
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const bool reasoning = seed % 2 == 0;
    const std::vector<int32_t> ids = sample_answer(seed, reasoning, 60);
    const std::string text = tok.decode(ids);
    std::string content = text;
    if (reasoning) {
      const ParsedCompletion p = parse_completion(text, ChatMode::Thinking);
      EXPECT_TRUE(p.tool_calls.empty());
      content = p.content;
      EXPECT_NE(text.find("</think>"), std::string::npos) << text;
    } else {
      const ParsedCompletion p = parse_completion(text, ChatMode::Chat);
      EXPECT_EQ(p.content, text);
    }
    EXPECT_TRUE(nlohmann_object(content)) << "seed " << seed << ": " << text;
  }
}

TEST(JsonConstraint, OnlyTheEndFollowsTheObject) {
  JsonConstraint c(vocab(), JsonGrammar::any_object(), false);
  for (int32_t id : tokenizer().encode("{\"a\": [1, \"x\"]}")) c.push(id);
  ASSERT_TRUE(c.complete());
  std::vector<float> logits(static_cast<size_t>(vocab()->size()), 0.0f);
  EXPECT_EQ(c.mask(logits.data()), 1);
  EXPECT_TRUE(std::isfinite(logits[kEos]));
  EXPECT_THROW(c.push(tokenizer().encode(" ").at(0)), Error);
  // Before the object closes, the end is masked; added tokens (chat markup) always are.
  JsonConstraint d(vocab(), JsonGrammar::any_object(), false);
  for (int32_t id : tokenizer().encode("{\"a\": ")) d.push(id);
  std::fill(logits.begin(), logits.end(), 0.0f);
  d.mask(logits.data());
  EXPECT_FALSE(std::isfinite(logits[kEos]));
  EXPECT_FALSE(std::isfinite(logits[*tokenizer().find_token("<｜User｜>")]));
  EXPECT_FALSE(std::isfinite(logits[*tokenizer().find_token("</think>")]));
}

TEST(JsonConstraint, ReasoningCannotEndTheAnswer) {
  JsonConstraint c(vocab(), JsonGrammar::any_object(), true);
  std::vector<float> logits(static_cast<size_t>(vocab()->size()), 0.0f);
  c.mask(logits.data());
  EXPECT_FALSE(std::isfinite(logits[kEos]));
  EXPECT_TRUE(std::isfinite(logits[*tokenizer().find_token("</think>")]));
  EXPECT_FALSE(std::isfinite(logits[*tokenizer().find_token("｜DSML｜")]));
  // The end-of-sentence text and a tool-call block written in pieces are refused at their last
  // piece; "</think>" written in pieces ends the reasoning.
  const std::string eos = kEosText;
  JsonConstraint e(vocab(), JsonGrammar::any_object(), true);
  for (int32_t id : tokenizer().encode("Let me think. " + eos.substr(0, eos.size() - 1))) e.push(id);
  EXPECT_THROW(e.push(tokenizer().encode(">").at(0)), Error);
  JsonConstraint b(vocab(), JsonGrammar::any_object(), true);
  // (｜DSML｜ in pieces: as one token it is an added token, masked anyway)
  for (const char* piece : {"Hmm\n\n<", "｜", "DSML", "｜", "tool_call"})
    for (int32_t id : tokenizer().encode(piece)) b.push(id);
  EXPECT_THROW(b.push(tokenizer().encode("s").at(0)), Error);
  JsonConstraint t(vocab(), JsonGrammar::any_object(), true);
  for (int32_t id : tokenizer().encode("done </think")) t.push(id);
  EXPECT_TRUE(t.reasoning());
  t.push(tokenizer().encode(">").at(0));
  EXPECT_FALSE(t.reasoning());
  EXPECT_THROW(t.push(tokenizer().encode("x").at(0)), Error);  // the object starts now
  t.push(tokenizer().encode("{").at(0));
}

// With tools, the answer may be a tool-call block instead of the object: its opening (markup
// tokens included) fits where only whitespace came before, and after it nothing is masked.
TEST(JsonConstraint, AToolCallBlockInsteadOfTheObject) {
  const Tokenizer& tok = tokenizer();
  const int64_t V = vocab()->size();
  const std::string opening = kToolCallsOpenText;
  for (const std::string& lead : {std::string(""), std::string(" "), std::string("\n\n"), opening.substr(0, 3), opening.substr(0, opening.size() - 2)}) {
    JsonConstraint c(vocab(), JsonGrammar::any_object(), false, true);
    for (int32_t id : tok.encode(lead)) c.push(id);
    dsv4::testing::expect_mask_is_allows(c, V, "lead '" + lead + "'");
    EXPECT_FALSE(c.tool_call());
  }
  const int32_t dsml = *tok.find_token("｜DSML｜"), user = *tok.find_token("<｜User｜>");
  JsonConstraint c(vocab(), JsonGrammar::any_object(), false, true);
  for (int32_t id : tok.encode("\n\n<")) c.push(id);
  EXPECT_TRUE(c.allows(dsml));
  EXPECT_FALSE(c.allows(user));
  EXPECT_FALSE(c.allows(tok.encode("{").at(0)));  // "<" left the object behind
  for (int32_t id : tok.encode(opening.substr(3))) c.push(id);
  ASSERT_TRUE(c.tool_call());
  std::vector<float> logits(static_cast<size_t>(V), 0.0f);
  EXPECT_EQ(c.mask(logits.data()), V);
  EXPECT_TRUE(c.allows(kEos) && c.allows(user));
  c.push(user);
  // Once the object has begun, or without tools, the block cannot open.
  JsonConstraint d(vocab(), JsonGrammar::any_object(), false, true);
  for (int32_t id : tok.encode("{\n\n")) d.push(id);
  EXPECT_FALSE(d.allows(tok.encode("<").at(0)));
  JsonConstraint e(vocab(), JsonGrammar::any_object(), false, false);
  for (int32_t id : tok.encode("\n\n")) e.push(id);
  EXPECT_FALSE(e.allows(tok.encode("<").at(0)));
  // After the reasoning; the reasoning itself still cannot open a block.
  JsonConstraint t(vocab(), JsonGrammar::any_object(), true, true);
  for (int32_t id : tok.encode("Call it.</think>" + opening)) t.push(id);
  EXPECT_TRUE(t.tool_call());
  JsonConstraint r(vocab(), JsonGrammar::any_object(), true, true);
  for (int32_t id : tok.encode("Hmm\n\n<")) r.push(id);
  EXPECT_FALSE(r.allows(dsml));
  // The object is still whole: a plain answer with tools reads back as before.
  JsonConstraint o(vocab(), JsonGrammar::any_object(), false, true);
  for (int32_t id : tok.encode(" \n{\"a\": 1}")) o.push(id);
  EXPECT_TRUE(o.complete());
  EXPECT_EQ(o.mask(logits.data()), 1);
}
