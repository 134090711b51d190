// Fuzz target: JSON grammars (src/text/json_grammar.*), the automaton constrained sampling runs
// on. The input is a schema, a newline, then an answer's bytes (no newline: the answer alone,
// against any object). compile() may only throw SchemaError (a server's 400). The answer is fed
// byte by byte; a copy taken halfway must take the rest exactly as the original does (the mask
// tests candidates on copies), and a text taken whole and complete must be JSON whose top
// value is an object: the grammar never lets through what a client cannot parse.
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "text/json_grammar.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

// Bracket nesting of a text, as the server bounds a body's (128) before parsing it.
int nesting(const std::string& s) {
  int depth = 0, most = 0;
  for (char c : s) {
    if (c == '{' || c == '[') most = std::max(most, ++depth);
    if (c == '}' || c == ']') --depth;
  }
  return most;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  std::shared_ptr<const dsv4::JsonGrammar> g = dsv4::JsonGrammar::any_object();
  std::string answer = in;
  if (nl != std::string::npos) {
    answer = in.substr(nl + 1);
    const std::string schema_text = in.substr(0, nl);
    if (nesting(schema_text) <= 128) {
      nlohmann::ordered_json schema;
      bool parsed = true;
      try {
        schema = nlohmann::ordered_json::parse(schema_text);
      } catch (const nlohmann::json::exception&) {
        parsed = false;
      }
      if (parsed) {
        try {
          g = dsv4::JsonGrammar::compile(schema, "schema");
        } catch (const dsv4::SchemaError&) {
          // refused: a 400 in a server
        }
      }
    }
  }
  dsv4::JsonGrammarState st(g.get());
  // A copy taken halfway must take the rest as the original does (the mask tests candidates on
  // copies).
  const size_t half = answer.size() / 2;
  dsv4::JsonGrammarState copy(g.get());
  bool copied = false;
  size_t taken = 0;
  for (; taken < answer.size(); ++taken) {
    if (taken == half) copy = st, copied = true;
    if (!st.push(static_cast<uint8_t>(answer[taken]))) break;
  }
  if (copied) {
    require(copy.push(answer.substr(half)) == (taken == answer.size()));
    if (taken == answer.size()) require(copy.complete() == st.complete());
  }
  if (taken == answer.size() && st.complete()) {
    try {
      require(nlohmann::json::parse(answer).is_object());
    } catch (const nlohmann::json::out_of_range&) {
      // a number beyond double's range: valid JSON that nlohmann cannot hold
    } catch (const nlohmann::json::parse_error&) {
      std::abort();
    }
  }
  return 0;
}
