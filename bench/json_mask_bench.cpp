// What the JSON mask (engine/json_constraint.h) costs per pick, over the real tokenizer's
// vocabulary, at states of an answer: before the object, between tokens, inside a key and a
// string value (the plain-text fast path), while reasoning, and inside a schema's bounded values
// (strings with a maxLength or a pattern, which have no fast path; a number with bounds), and
// before the object where a tool-call block may come instead (every token tested). Not a
// test; docs/perf.md "Session 31" and "Session 32" have its figures.
// Usage: json_mask_bench TOKENIZER_DIR [REPEATS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/json_constraint.h"
#include "text/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: json_mask_bench TOKENIZER_DIR [REPEATS]\n");
    return 2;
  }
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 20;
  const dsv4::Tokenizer tok = dsv4::Tokenizer::load(argv[1]);
  const auto vocab = std::make_shared<const dsv4::JsonVocab>(tok, tok.vocab_size(), 1);
  struct State {
    const char* name;
    const char* text;
    bool reasoning;
    const char* schema = nullptr;  // none: any object
    bool tools = false;            // the answer may be a tool-call block instead
  };
  const char* bounded = R"({"type":"object","properties":{"s":{"type":"string","maxLength":100},
      "t":{"type":"string","pattern":"b|-"},"d":{"type":"string","pattern":"^\\d{4}-\\d{2}-\\d{2}$"},
      "n":{"type":"integer","minimum":0,"maximum":1000000}}})";
  const State states[] = {
      {"reasoning", "Let me think", true},
      {"before the object", "  ", false},
      {"after a key", "{\"key\"", false},
      {"before a value", "{\"key\": ", false},
      {"in a number", "{\"a\":1", false},
      {"in a key", "{\"some key", false},
      {"in a string value", "{\"key\": \"abc", false},
      {"maxLength string", "{\"s\": \"abc", false, bounded},
      {"pattern b|-", "{\"t\": \"abc", false, bounded},
      {"pattern date", "{\"d\": \"20", false, bounded},
      {"bounded integer", "{\"n\": 12", false, bounded},
      {"beside tools", " ", false, nullptr, true},
  };
  std::vector<float> logits(static_cast<size_t>(vocab->size()));
  for (const State& s : states) {
    dsv4::JsonConstraint c(vocab, s.schema ? dsv4::JsonGrammar::compile(nlohmann::ordered_json::parse(s.schema), "schema")
                                           : dsv4::JsonGrammar::any_object(),
                           s.reasoning, s.tools);
    for (int32_t id : tok.encode(s.text)) c.push(id);
    int64_t left = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats; ++r) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      left = c.mask(logits.data());
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / repeats;
    std::printf("%-20s %7lld tokens left  %.2f ms/mask\n", s.name, static_cast<long long>(left), ms);
  }
  return 0;
}
