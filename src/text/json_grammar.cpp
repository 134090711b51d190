#include "text/json_grammar.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "core/error.h"

namespace dsv4 {

using ojson = nlohmann::ordered_json;
using Node = JsonGrammar::Node;

namespace {

// Keywords that constrain nothing. `format` is one too: JSON Schema 2020-12 makes it an annotation
// unless a schema asks for the format-assertion vocabulary (pydantic writes it for dates, e-mail
// addresses, UUIDs); the grammar holds such a value to `type` alone.
const std::set<std::string> kAnnotations = {"title",    "description", "default",         "examples",
                                            "$schema",  "$id",         "$comment",        "deprecated",
                                            "readOnly", "writeOnly",   "format",          "contentEncoding",
                                            "contentMediaType", "discriminator"};
const std::set<std::string> kKeywords = {"type",      "properties", "required",         "additionalProperties",
                                         "items",     "prefixItems", "additionalItems",  "minItems",   "maxItems",
                                         "minLength",
                                         "maxLength", "pattern",    "minimum",          "maximum",
                                         "exclusiveMinimum",
                                         "exclusiveMaximum",        "enum",             "const",
                                         "anyOf",     "oneOf",      "allOf",            "$ref",
                                         "$defs",     "definitions"};
// Keywords that hold only beside a type (a string's length, a number's bounds).
const std::set<std::string> kTypeKeywords = {"minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
                                             "exclusiveMaximum"};

[[noreturn]] void refuse(const std::string& path, const std::string& why) { throw SchemaError(path, why); }

bool has(const ojson& s, const char* k) { return s.contains(k); }

std::string byte_name(int b) {
  if (b >= 0x21 && b < 0x7F) return std::string("'") + static_cast<char>(b) + "'";
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", b);
  return buf;
}

}  // namespace

struct GrammarCompiler {
  JsonGrammar& g;
  const ojson& root;
  std::string root_path;
  std::map<std::string, int> refs;
  std::map<int, std::string> anyof_paths;
  int any = -1;
  int pattern_states = 0;
  static constexpr int kMaxPatternStates = 32768;

  int add(Node n) {
    g.nodes_.push_back(std::move(n));
    return static_cast<int>(g.nodes_.size()) - 1;
  }

  static Node enum_of(std::vector<std::string> texts, std::vector<uint8_t> numeric) {
    Node n;
    n.kind = JsonGrammar::Enum;
    n.texts = std::move(texts);
    n.numeric = std::move(numeric);
    return n;
  }

  // Any JSON value: an object or array of any values, a string, a number, true, false or null.
  int any_node() {
    if (any >= 0) return any;
    any = add(Node{});
    Node obj;
    obj.kind = JsonGrammar::Object;
    obj.additional = any;
    Node arr;
    arr.kind = JsonGrammar::Array;
    arr.items = any;
    Node str, num;
    str.kind = JsonGrammar::String;
    num.kind = JsonGrammar::Number;
    const int o = add(obj), a = add(arr), s = add(str), n = add(num), l = add(enum_of({"true", "false", "null"}, {0, 0, 0}));
    g.nodes_[static_cast<size_t>(any)].branches = {o, a, s, n, l};
    anyof_paths[any] = root_path;
    return any;
  }

  int compile(const ojson& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_node();
      refuse(path, "false: no value could match");
    }
    if (!s.is_object()) refuse(path, "must be a schema (an object)");
    std::vector<std::string> constraints;
    for (const auto& [k, v] : s.items()) {
      if (kAnnotations.count(k)) continue;
      if (!kKeywords.count(k))
        refuse(path + "." + k, "is not enforced by this server (it enforces type, properties, required, "
                               "additionalProperties, items, prefixItems, additionalItems, minItems, maxItems, minLength, maxLength, pattern, minimum, "
                               "maximum, "
                               "exclusiveMinimum, exclusiveMaximum, enum, const, anyOf, oneOf, allOf of one and $ref)");
      if (k != "$defs" && k != "definitions") constraints.push_back(k);
    }
    auto only = [&](const char* k) {
      if (constraints.size() > 1) refuse(path, std::string(k) + " beside other keywords is not supported: put them in one place");
    };
    if (has(s, "allOf")) {
      only("allOf");
      if (!s["allOf"].is_array() || s["allOf"].size() != 1) refuse(path + ".allOf", "only a list of one schema is supported");
      return compile(s["allOf"][0], path + ".allOf[0]");
    }
    if (has(s, "$ref")) {
      only("$ref");
      if (!s["$ref"].is_string()) refuse(path + ".$ref", "must be a string");
      return ref(s["$ref"].get<std::string>(), path + ".$ref");
    }
    if (has(s, "enum") || has(s, "const")) {
      if (has(s, "anyOf") || has(s, "oneOf")) refuse(path, "enum / const beside anyOf / oneOf is not supported");
      for (const std::string& k : constraints)
        if (kTypeKeywords.count(k)) refuse(path + "." + k, "beside enum / const is not supported");
      const bool c = has(s, "const");
      if (c && has(s, "enum")) refuse(path, "enum and const together are not supported");
      const std::string where = path + (c ? ".const" : ".enum");
      const ojson values = c ? ojson::array({s["const"]}) : s["enum"];
      if (!values.is_array() || values.empty()) refuse(where, "must be a non-empty list");
      if (values.size() > 64) refuse(where, "at most 64 values, got " + std::to_string(values.size()));
      std::vector<std::string> texts;
      std::vector<uint8_t> numeric;
      for (size_t i = 0; i < values.size(); ++i) {
        const ojson& v = values[i];
        if (v.is_object() || v.is_array())
          refuse(c ? where : where + "[" + std::to_string(i) + "]", "only strings, numbers, booleans and null are supported");
        texts.push_back(v.dump());
        numeric.push_back(v.is_number());
        if (texts.back().size() > 4096)  // (a frame counts the bytes matched in 16 bits)
          refuse(c ? where : where + "[" + std::to_string(i) + "]", "values longer than 4096 bytes are not supported");
      }
      return add(enum_of(std::move(texts), std::move(numeric)));
    }
    if (has(s, "anyOf") || has(s, "oneOf")) {
      const char* k = has(s, "anyOf") ? "anyOf" : "oneOf";
      only(k);
      const ojson& list = s[k];
      if (!list.is_array() || list.empty()) refuse(path + "." + k, "must be a non-empty list of schemas");
      std::vector<int> branches;
      for (size_t i = 0; i < list.size(); ++i) branches.push_back(compile(list[i], path + "." + k + "[" + std::to_string(i) + "]"));
      Node n;
      n.branches = std::move(branches);
      n.one_of = std::string(k) == "oneOf";
      const int id = add(std::move(n));
      anyof_paths[id] = path + "." + k;
      return id;
    }
    if (!has(s, "type")) {
      for (const std::string& k : constraints)
        if (kTypeKeywords.count(k)) refuse(path + "." + k, "is supported only beside a type (string, number or integer)");
      if (has(s, "properties") || has(s, "required") || has(s, "additionalProperties")) return typed(s, "object", path);
      if (has(s, "items") || has(s, "prefixItems") || has(s, "minItems") || has(s, "maxItems")) return typed(s, "array", path);
      return any_node();
    }
    const ojson& t = s["type"];
    if (t.is_string()) return typed(s, t.get<std::string>(), path);
    if (!t.is_array() || t.empty()) refuse(path + ".type", "must be a type name or a non-empty list of them");
    std::vector<int> branches;
    for (size_t i = 0; i < t.size(); ++i) {
      if (!t[i].is_string()) refuse(path + ".type[" + std::to_string(i) + "]", "must be a type name");
      branches.push_back(typed(s, t[i].get<std::string>(), path));
    }
    if (branches.size() == 1) return branches[0];
    Node n;
    n.branches = std::move(branches);
    const int id = add(std::move(n));
    anyof_paths[id] = path + ".type";
    return id;
  }

  int typed(const ojson& s, const std::string& type, const std::string& path) {
    Node n;
    if (type == "object") {
      n.kind = JsonGrammar::Object;
      if (has(s, "properties")) {
        const ojson& props = s["properties"];
        if (!props.is_object()) refuse(path + ".properties", "must be an object of schemas");
        if (props.size() > 64) refuse(path + ".properties", "at most 64 properties, got " + std::to_string(props.size()));
        for (const auto& [k, v] : props.items()) {
          const std::string text = ojson(k).dump();
          if (text.size() > 4096) refuse(path + ".properties", "property names longer than 4096 bytes are not supported");
          if (text.find('\\') != std::string::npos)
            refuse(path + ".properties." + k, "a property name that needs an escape in JSON is not supported");
          const int value = compile(v, path + ".properties." + k);
          n.keys.push_back(text);
          n.values.push_back(value);
        }
      }
      if (has(s, "required")) {
        const ojson& req = s["required"];
        if (!req.is_array()) refuse(path + ".required", "must be a list of property names");
        for (size_t i = 0; i < req.size(); ++i) {
          const std::string w = path + ".required[" + std::to_string(i) + "]";
          if (!req[i].is_string()) refuse(w, "must be a property name");
          const std::string text = req[i].dump();
          size_t k = 0;
          while (k < n.keys.size() && n.keys[k] != text) ++k;
          if (k == n.keys.size()) refuse(w, "'" + req[i].get<std::string>() + "' is not one of the properties");
          n.required |= uint64_t{1} << k;
        }
      }
      n.additional = any_node();
      if (has(s, "additionalProperties")) {
        const ojson& a = s["additionalProperties"];
        if (a.is_boolean()) n.additional = a.get<bool>() ? any_node() : -1;
        else n.additional = compile(a, path + ".additionalProperties");
      }
    } else if (type == "array") {
      n.kind = JsonGrammar::Array;
      // A tuple: prefixItems (2020-12), or items as a list (draft 4-2019) with additionalItems
      // for the rest; else items is the rest. The rest false: nothing past the prefix.
      const bool list = has(s, "items") && s["items"].is_array();
      if (list && has(s, "prefixItems")) refuse(path + ".items", "a list of schemas beside prefixItems is not supported");
      const char* tuple = has(s, "prefixItems") ? "prefixItems" : list ? "items" : nullptr;
      if (tuple) {
        const ojson& t = s[tuple];
        if (!t.is_array()) refuse(path + "." + tuple, "must be a list of schemas");
        if (t.size() > 64) refuse(path + "." + tuple, "at most 64 schemas, got " + std::to_string(t.size()));
        for (size_t i = 0; i < t.size(); ++i) n.prefix.push_back(compile(t[i], path + "." + tuple + "[" + std::to_string(i) + "]"));
      }
      const char* rest = list ? "additionalItems" : "items";  // (additionalItems alone constrains nothing)
      if (!has(s, rest)) n.items = any_node();
      else if (s[rest].is_boolean() && !s[rest].get<bool>()) n.items = -1;
      else n.items = compile(s[rest], path + "." + rest);
      n.min_items = count(s, "minItems", 0, path);
      n.max_items = count(s, "maxItems", UINT32_MAX, path);
      if (n.items < 0) n.max_items = std::min<uint32_t>(n.max_items, static_cast<uint32_t>(n.prefix.size()));
      if (n.min_items > n.max_items) refuse(path + ".minItems", "is above maxItems (or the number of items allowed)");
    } else if (type == "string") {
      n.kind = JsonGrammar::String;
      n.min_len = count(s, "minLength", 0, path);
      n.max_len = count(s, "maxLength", UINT32_MAX, path);
      if (n.min_len > n.max_len) refuse(path + ".minLength", "is above maxLength");
      if (has(s, "pattern")) {
        if (!s["pattern"].is_string()) refuse(path + ".pattern", "must be a string");
        n.pattern = static_cast<int>(g.patterns_.size());
        g.patterns_.push_back(JsonPattern::compile(s["pattern"].get<std::string>(), path + ".pattern"));
        // Each pattern costs its states squared to build; bound the schema's sum.
        pattern_states += g.patterns_.back().built_states();
        if (pattern_states > kMaxPatternStates)
          refuse(path + ".pattern", "the schema's patterns need more than " + std::to_string(kMaxPatternStates) + " states in all");
      }
    } else if (type == "number" || type == "integer") {
      n.kind = type == "number" ? JsonGrammar::Number : JsonGrammar::Integer;
      if (NumberRange::in_schema(s)) {
        n.range = static_cast<int>(g.ranges_.size());
        g.ranges_.push_back(NumberRange::from_schema(s, path));
        if (!g.ranges_.back().feasible("", type == "integer", JsonGrammarState::kMaxNumber))
          refuse(path, std::string("no ") + (type == "integer" ? "integer" : "number") + " of at most " +
                           std::to_string(JsonGrammarState::kMaxNumber) + " bytes lies within the bounds");
      }
    } else if (type == "boolean") {
      return add(enum_of({"true", "false"}, {0, 0}));
    } else if (type == "null") {
      return add(enum_of({"null"}, {0}));
    } else {
      refuse(path + ".type", "unknown type '" + type + "'");
    }
    return add(std::move(n));
  }

  // A count keyword (minItems, maxLength, ...): `def` when absent.
  static uint32_t count(const ojson& s, const char* k, uint32_t def, const std::string& path) {
    if (!has(s, k)) return def;
    const ojson& v = s[k];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (int64_t{1} << 30))
      refuse(path + "." + k, "must be an integer in [0, 2^30]");
    return static_cast<uint32_t>(v.get<int64_t>());
  }

  int ref(const std::string& r, const std::string& path) {
    if (auto it = refs.find(r); it != refs.end()) return it->second;
    const ojson* target = nullptr;
    std::string where = root_path;
    if (r == "#") {
      target = &root;
    } else {
      for (const char* defs : {"#/$defs/", "#/definitions/"}) {
        const std::string p = defs;
        if (r.compare(0, p.size(), p) != 0) continue;
        const std::string section = p.substr(2, p.size() - 3);
        // The name is a JSON pointer token: ~1 is '/', ~0 is '~'.
        std::string name;
        for (size_t i = p.size(); i < r.size(); ++i) {
          if (r[i] == '~' && i + 1 < r.size() && (r[i + 1] == '0' || r[i + 1] == '1')) name += r[++i] == '0' ? '~' : '/';
          else if (r[i] == '/') refuse(path, "'" + r + "': only #, #/$defs/NAME and #/definitions/NAME are supported");
          else name += r[i];
        }
        if (root.is_object() && root.contains(section) && root[section].is_object() && root[section].contains(name)) {
          target = &root[section][name];
          where = root_path + "." + section + "." + name;
        }
      }
      if (!target) refuse(path, "'" + r + "' is not in the schema (supported: #, #/$defs/NAME, #/definitions/NAME)");
    }
    const int slot = add(Node{});
    refs[r] = slot;
    anyof_paths[slot] = where;  // (for a $ref that only refers to itself)
    const int n = compile(*target, where);
    g.nodes_[static_cast<size_t>(slot)] = g.nodes_[static_cast<size_t>(n)];
    if (auto it = anyof_paths.find(n); it != anyof_paths.end()) anyof_paths[slot] = it->second;
    return slot;
  }

  // The bytes each node's values can start with (a fixpoint: anyOf may be recursive), then each
  // anyOf's branch per byte.
  void finish() {
    const size_t N = g.nodes_.size();
    if (N > 30000) refuse(root_path, "the schema is too large (" + std::to_string(N) + " nodes; at most 30000)");
    g.first_.assign(N, {0, 0, 0, 0});
    auto set = [&](size_t i, uint8_t b) { g.first_[i][b >> 6] |= uint64_t{1} << (b & 63); };
    for (size_t i = 0; i < N; ++i) {
      const Node& n = g.nodes_[i];
      switch (n.kind) {
        case JsonGrammar::Object: set(i, '{'); break;
        case JsonGrammar::Array: set(i, '['); break;
        case JsonGrammar::String: set(i, '"'); break;
        case JsonGrammar::Number:
        case JsonGrammar::Integer:
          for (const char c : std::string("-0123456789"))
            if (n.range < 0 || g.range(n.range).feasible(std::string(1, c), n.kind == JsonGrammar::Integer, JsonGrammarState::kMaxNumber))
              set(i, static_cast<uint8_t>(c));
          break;
        case JsonGrammar::Enum:
          for (const std::string& t : n.texts) set(i, static_cast<uint8_t>(t[0]));
          break;
        case JsonGrammar::AnyOf: break;
      }
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < N; ++i)
        for (int b : g.nodes_[i].branches)
          for (int w = 0; w < 4; ++w) {
            const uint64_t u = g.first_[i][w] | g.first_[static_cast<size_t>(b)][w];
            if (u != g.first_[i][w]) g.first_[i][w] = u, changed = true;
          }
    }
    // Per byte c, the nodes (not AnyOf) a value of each AnyOf node starting with c can be of,
    // through nested ones: memoized, a cycle of AnyOf nodes is a $ref that only refers to itself.
    for (size_t i = 0; i < N; ++i)
      if (g.nodes_[i].kind == JsonGrammar::AnyOf) g.nodes_[i].by_first.fill(-1);
    std::vector<std::vector<int>> leaves(N);
    std::vector<uint8_t> state(N);  // 0 not yet, 1 in progress, 2 done
    for (int c = 0; c < 256; ++c) {
      std::fill(state.begin(), state.end(), 0);
      std::function<const std::vector<int>&(int)> of = [&](int i) -> const std::vector<int>& {
        std::vector<int>& out = leaves[static_cast<size_t>(i)];
        if (state[static_cast<size_t>(i)] == 2) return out;
        if (state[static_cast<size_t>(i)] == 1)
          refuse(anyof_paths.count(i) ? anyof_paths[i] : root_path, "no value can match it (a $ref that only refers to itself?)");
        state[static_cast<size_t>(i)] = 1;
        out.clear();
        for (int b : g.nodes_[static_cast<size_t>(i)].branches) {
          if (!g.starts(b, static_cast<uint8_t>(c))) continue;
          if (g.nodes_[static_cast<size_t>(b)].kind != JsonGrammar::AnyOf) out.push_back(b);
          else for (int l : of(b)) out.push_back(l);
        }
        std::sort(out.begin(), out.end());
        out.erase(std::unique(out.begin(), out.end()), out.end());
        state[static_cast<size_t>(i)] = 2;
        return out;
      };
      for (size_t i = 0; i < N; ++i) {
        if (g.nodes_[i].kind != JsonGrammar::AnyOf || !g.starts(static_cast<int>(i), static_cast<uint8_t>(c))) continue;
        const std::vector<int> l = of(static_cast<int>(i));
        Node& n = g.nodes_[i];
        if (l.size() == 1) {
          n.by_first[static_cast<size_t>(c)] = static_cast<int16_t>(l[0]);
          continue;
        }
        if (n.one_of) discriminated(l, c, anyof_paths.count(static_cast<int>(i)) ? anyof_paths[static_cast<int>(i)] : root_path);
        size_t k = 0;
        while (k < n.alike.size() && n.alike[k] != l) ++k;
        if (k == n.alike.size()) n.alike.push_back(l);
        n.by_first[static_cast<size_t>(c)] = static_cast<int16_t>(-2 - static_cast<int>(k));
      }
    }
    for (size_t i = 0; i < N; ++i) {
      const Node& n = g.nodes_[i];
      if (n.kind != JsonGrammar::AnyOf) continue;
      bool any_byte = false;
      for (int c = 0; c < 256; ++c) any_byte |= n.by_first[static_cast<size_t>(c)] != -1;
      if (!any_byte) refuse(anyof_paths.count(static_cast<int>(i)) ? anyof_paths[static_cast<int>(i)] : root_path,
                            "no value can match it (a $ref that only refers to itself?)");
    }
  }

  // oneOf branches that start alike (byte c) must exclude each other, which the grammar can tell
  // only in one form: objects with a required property whose value is a const, different in each
  // (a discriminator, as pydantic writes for tagged unions). Else the schema should say anyOf.
  void discriminated(const std::vector<int>& alike, int c, const std::string& where) {
    const std::string why = "branches that can both start with " + byte_name(c) +
                            " are supported in oneOf only as objects told apart by a required property with a "
                            "different const in each (a discriminator); use anyOf if any branch may match";
    for (int l : alike)
      if (g.nodes_[static_cast<size_t>(l)].kind != JsonGrammar::Object) refuse(where, why);
    const Node& first = g.nodes_[static_cast<size_t>(alike[0])];
    for (size_t k = 0; k < first.keys.size(); ++k) {
      std::set<std::string> values;
      bool ok = true;
      for (int l : alike) {
        const Node& o = g.nodes_[static_cast<size_t>(l)];
        const auto at = std::find(o.keys.begin(), o.keys.end(), first.keys[k]);
        const size_t j = static_cast<size_t>(at - o.keys.begin());
        if (at == o.keys.end() || !(o.required >> j & 1)) { ok = false; break; }
        const Node& v = g.nodes_[static_cast<size_t>(o.values[j])];
        if (v.kind != JsonGrammar::Enum || v.texts.size() != 1 || !values.insert(v.texts[0]).second) { ok = false; break; }
      }
      if (ok) return;
    }
    refuse(where, why);
  }
};

std::shared_ptr<const JsonGrammar> JsonGrammar::compile(const ojson& schema, const std::string& path) {
  auto g = std::make_shared<JsonGrammar>();
  GrammarCompiler c{*g, schema, path, {}, {}};
  int root;
  try {
    root = c.compile(schema, path);
  } catch (const ojson::type_error& e) {  // dump() of a string that is not UTF-8 (servers check first)
    refuse(path, std::string("holds text that is not valid UTF-8 (") + e.what() + ")");
  }
  c.finish();
  if (g->nodes_[static_cast<size_t>(root)].kind != Object)
    refuse(path, "the root must be an object schema (type: object): the answer is one JSON object");
  g->root_ = root;
  return g;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::any_object() {
  static const std::shared_ptr<const JsonGrammar> g = compile(ojson{{"type", "object"}}, "any object");
  return g;
}

bool JsonGrammar::starts(int n, uint8_t b) const { return first_[static_cast<size_t>(n)][b >> 6] >> (b & 63) & 1; }

// ---- the automaton ----

namespace {

// Lexer modes: a string's text, then the number parts.
enum Lex : uint8_t { Text, Esc, Hex, Utf8, Minus, Zero, Int, Dot, Frac, Exp, ExpSign, ExpDigits };
// Surrogates: a high one (\uD800-\uDBFF) must be followed at once by an escaped low one.
enum Pair : uint8_t { None, WantBackslash, WantU, InLow };
// Object phases: after '{', in a key, before ':', before a value, after a value, after ','.
enum ObjPhase : uint8_t { OOpen, OKey, OColon, OValue, OAfter, OComma };
// Array phases: after '[', after a value, after ','.
enum ArrPhase : uint8_t { AOpen, AAfter, ANext };

int hex_value(uint8_t b) {
  if (b >= '0' && b <= '9') return b - '0';
  if (b >= 'a' && b <= 'f') return b - 'a' + 10;
  if (b >= 'A' && b <= 'F') return b - 'A' + 10;
  return -1;
}

uint64_t low_bits(size_t n) { return n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1; }

}  // namespace

JsonGrammarThread& JsonGrammarThread::operator=(const JsonGrammarThread& o) {
  if (this == &o) return *this;
  g_ = o.g_;
  std::memcpy(frames_.data(), o.frames_.data(), sizeof(Frame) * static_cast<size_t>(o.depth_));
  depth_ = o.depth_, containers_ = o.containers_, done_ = o.done_, spaces_ = o.spaces_;
  lex_ = o.lex_, pair_ = o.pair_, left_ = o.left_, lo_ = o.lo_, hi_ = o.hi_, code_ = o.code_, cp_ = o.cp_;
  if (lex_ >= Minus) std::memcpy(num_.data(), o.num_.data(), left_);  // a number is open
  return *this;
}

JsonTextSpot JsonGrammarThread::text_spot() const {
  JsonTextSpot t;
  if (depth_ == 0 || lex_ != Text || pair_ != None) return t;
  const Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
  const Node& n = g_->node(f.node);
  if (n.kind == JsonGrammar::String) {  // a string value
    t.text = true;
    if (n.max_len != UINT32_MAX) t.room = n.max_len - f.count;
    if (n.pattern >= 0) t.pattern = n.pattern, t.states = {f.cand, f.seen};
  } else {  // or a key where any key is allowed
    t.text = n.kind == JsonGrammar::Object && f.phase == OKey && n.additional >= 0;
  }
  return t;
}

bool JsonGrammarThread::key_possible(const Frame& f) const {
  const Node& n = g_->node(f.node);
  return n.additional >= 0 || (~f.seen & low_bits(n.keys.size())) != 0;
}

bool JsonGrammarThread::begin_value(int node, uint8_t b) {
  int id = node;
  if (g_->node(id).kind == JsonGrammar::AnyOf) {  // (by_first looks through nested ones)
    const Node& a = g_->node(id);
    const int16_t v = a.by_first[b];
    if (v == -1) return false;
    id = v >= 0 ? v : a.alike[static_cast<size_t>(-2 - v)][static_cast<size_t>(pick_)];
  }
  const Node& n = g_->node(id);
  if (depth_ >= static_cast<int>(frames_.size())) return false;
  Frame& f = frames_[static_cast<size_t>(depth_)];
  f = Frame{static_cast<int16_t>(id), 0, -1, 0, 0, 0, 0};
  switch (n.kind) {
    case JsonGrammar::Object:
    case JsonGrammar::Array:
      if (b != (n.kind == JsonGrammar::Object ? '{' : '[') || containers_ >= kMaxDepth) return false;
      ++containers_;
      break;
    case JsonGrammar::String:
      if (b != '"') return false;
      lex_ = Text, pair_ = None;
      if (n.pattern >= 0) {
        const JsonPattern::Set s = g_->pattern(n.pattern).start();
        f.cand = s[0], f.seen = s[1];
      }
      break;
    case JsonGrammar::Number:
    case JsonGrammar::Integer:
      left_ = 1, num_[0] = static_cast<char>(b);
      if (b == '-') lex_ = Minus;
      else if (b == '0') lex_ = Zero;
      else if (b >= '1' && b <= '9') lex_ = Int;
      else return false;
      if (n.range >= 0 && !g_->range(n.range).feasible({num_.data(), 1}, n.kind == JsonGrammar::Integer, kMaxNumber))
        return false;
      break;
    case JsonGrammar::Enum:
      for (size_t k = 0; k < n.texts.size(); ++k)
        if (static_cast<uint8_t>(n.texts[k][0]) == b) f.cand |= uint64_t{1} << k;
      if (!f.cand) return false;
      f.pos = 1;
      break;
    case JsonGrammar::AnyOf: return false;
  }
  ++depth_;
  return true;
}

// The top value is complete: it leaves its container's phase "after a value".
void JsonGrammarThread::end_value() {
  --depth_;
  const JsonGrammar::Kind k = g_->node(frames_[static_cast<size_t>(depth_)].node).kind;
  if (k == JsonGrammar::Object || k == JsonGrammar::Array) --containers_;
  if (k == JsonGrammar::Number || k == JsonGrammar::Integer) lex_ = Text;  // (copies skip num_ again)
  if (depth_ == 0) {
    done_ = true;
    return;
  }
  Frame& p = frames_[static_cast<size_t>(depth_ - 1)];
  if (g_->node(p.node).kind == JsonGrammar::Object) {
    if (p.prop >= 0) p.seen |= uint64_t{1} << p.prop;
    p.phase = OAfter;
  } else {
    ++p.count;
    p.phase = AAfter;
  }
}

// A string's text byte other than '"' and '\' (UTF-8 checked: the lead byte fixes the length and
// the range of the first continuation byte, which rules out overlong forms, surrogates and code
// points above U+10FFFF).
bool JsonGrammarThread::string_byte(uint8_t b, bool key) {
  switch (lex_) {
    case Esc:
      if (pair_ == WantU || b == 'u') {
        if (b != 'u') return false;
        lex_ = Hex, left_ = 4, code_ = 0;
        if (pair_ == WantU) pair_ = InLow;
        return true;
      }
      if (b == 0 || !std::strchr("\"\\/bfnrt", b)) return false;
      lex_ = Text;
      return true;
    case Hex: {
      const int v = hex_value(b);
      if (v < 0) return false;
      code_ = static_cast<uint16_t>(code_ << 4 | v);
      const int seen = 4 - --left_;
      if (pair_ == InLow) {  // the low half of a pair: \uDC00-\uDFFF
        if ((seen == 1 && code_ != 0xD) || (seen == 2 && code_ < 0xDC)) return false;
        if (left_ == 0) pair_ = None, lex_ = Text;
        return true;
      }
      if (seen == 2 && code_ >= 0xDC && code_ <= 0xDF) return false;  // a low half alone
      if (left_ == 0) {
        if (code_ >= 0xD800 && code_ <= 0xDBFF) pair_ = WantBackslash, cp_ = code_;
        lex_ = Text;
      }
      return true;
    }
    case Utf8:
      if (b < lo_ || b > hi_) return false;
      lo_ = 0x80, hi_ = 0xBF;
      cp_ = cp_ << 6 | (b & 0x3Fu);
      if (--left_ == 0) lex_ = Text;
      return true;
    default: break;
  }
  if (pair_ == WantBackslash) {
    if (b != '\\') return false;
    lex_ = Esc, pair_ = WantU;
    return true;
  }
  if (b == '"') {
    if (key) return false;  // a key's end is its object's to decide
    end_value();
    return true;
  }
  if (b == '\\') {
    lex_ = Esc;
    return true;
  }
  if (b < 0x20) return false;  // control characters must be escaped
  if (b < 0x80) return true;
  lo_ = 0x80, hi_ = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) left_ = 1;
  else if (b == 0xE0) left_ = 2, lo_ = 0xA0;
  else if (b == 0xED) left_ = 2, hi_ = 0x9F;
  else if (b >= 0xE1 && b <= 0xEF) left_ = 2;
  else if (b == 0xF0) left_ = 3, lo_ = 0x90;
  else if (b == 0xF4) left_ = 3, hi_ = 0x8F;
  else if (b >= 0xF1 && b <= 0xF3) left_ = 3;
  else return false;
  cp_ = b & (left_ == 1 ? 0x1Fu : left_ == 2 ? 0x0Fu : 0x07u);
  lex_ = Utf8;
  return true;
}

// A string byte taken by the lexer, against the string's pattern: a character it completes must
// lead the pattern on (the states advance), and a character it begins must be able to: some code
// point its bytes so far can still become must (the prefix property).
bool JsonGrammarThread::pattern_byte(const JsonPattern& p, Frame& f, uint8_t b, uint8_t lex_before, uint8_t pair_before) {
  JsonPattern::Set s{f.cand, f.seen};
  // Code points a \u escape can still write, given the hexadecimal range [lo, hi] of its value.
  auto escaped = [&](uint32_t lo, uint32_t hi) {
    if (lo < 0xD800 && p.any_in(s, lo, std::min<uint32_t>(hi, 0xD7FF))) return true;
    if (hi >= 0xE000 && p.any_in(s, std::max<uint32_t>(lo, 0xE000), hi)) return true;
    const uint32_t h0 = std::max<uint32_t>(lo, 0xD800), h1 = std::min<uint32_t>(hi, 0xDBFF);  // high halves: a pair
    return h0 <= h1 && p.any_in(s, 0x10000 + ((h0 - 0xD800) << 10), 0x10000 + ((h1 - 0xD800) << 10) + 0x3FF);
  };
  auto pair_range = [&](uint32_t lo, uint32_t hi) {  // low halves [lo, hi] after the high half cp_
    lo = std::max<uint32_t>(lo, 0xDC00), hi = std::min<uint32_t>(hi, 0xDFFF);
    const uint32_t base = 0x10000 + ((cp_ - 0xD800) << 10) - 0xDC00;
    return lo <= hi && p.any_in(s, base + lo, base + hi);
  };
  if (lex_ == Text && pair_ == None) {  // a character is complete
    uint32_t cp = b;
    if (lex_before == Esc) {
      static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
      cp = static_cast<uint8_t>(to[std::strchr(from, b) - from]);
    } else if (lex_before == Hex) {
      cp = pair_before == InLow ? 0x10000 + ((cp_ - 0xD800) << 10) + (code_ - 0xDC00u) : code_;
    } else if (lex_before == Utf8) {
      cp = cp_;
    }
    if (!p.any_in(s, cp, cp)) return false;
    s = p.step(s, cp);
    f.cand = s[0], f.seen = s[1];
    return true;
  }
  switch (lex_) {
    case Esc: return pair_ == WantU ? pair_range(0xDC00, 0xDFFF) : escaped(0, 0xFFFF);
    case Hex: {
      const int bits = 4 * left_;
      const uint32_t lo = static_cast<uint32_t>(code_) << bits, hi = lo | ((1u << bits) - 1);
      return pair_ == InLow ? pair_range(lo, hi) : escaped(lo, hi);
    }
    case Utf8: {
      uint32_t lo = cp_ << (6 * left_), hi = lo | ((1u << (6 * left_)) - 1);
      if (lex_before == Text) {  // the lead byte: the shortest form's floor, no surrogates, at most U+10FFFF
        lo = std::max<uint32_t>(lo, left_ == 1 ? 0x80 : left_ == 2 ? 0x800 : 0x10000);
        if (b == 0xED) hi = 0xD7FF;
        hi = std::min<uint32_t>(hi, 0x10FFFF);
      }
      return p.any_in(s, lo, hi);
    }
    default: return pair_range(0xDC00, 0xDFFF);  // Text, WantBackslash: a high half read, its low to come
  }
}

// left_ counts the number's bytes: a byte that needs another after it ('.', 'e', a sign of the
// exponent) is taken only while two fit under kMaxNumber, a digit while one does; otherwise the
// number ends there.
// With bounds (Node::range) each byte taken must leave the number able to end within them, and the
// number ends only within them; it has no exponent then.
bool JsonGrammarThread::number_byte(uint8_t b, const JsonGrammar::Node& n, bool& ended) {
  const bool integer = n.kind == JsonGrammar::Integer, bounded = n.range >= 0;
  const bool digit = b >= '0' && b <= '9';
  const int room = kMaxNumber - left_;
  auto take = [&](Lex next) {
    lex_ = next;
    num_[left_++] = static_cast<char>(b);
    return !bounded || g_->range(n.range).feasible({num_.data(), left_}, integer, kMaxNumber);
  };
  switch (lex_) {
    case Minus:
      if (!digit) return false;
      return take(b == '0' ? Zero : Int);
    case Dot:
      if (!digit) return false;
      return take(Frac);
    case Exp:
      if ((b == '+' || b == '-') && room >= 2) return take(ExpSign);
      if (digit) return take(ExpDigits);
      return false;
    case ExpSign:
      if (!digit) return false;
      return take(ExpDigits);
    default:  // Zero, Int, Frac, ExpDigits: the number may end here
      if (digit && lex_ != Zero && room >= 1) return take(static_cast<Lex>(lex_));
      if (b == '.' && !integer && (lex_ == Zero || lex_ == Int) && room >= 2) return take(Dot);
      if ((b == 'e' || b == 'E') && !integer && !bounded && lex_ != ExpDigits && room >= 2) return take(Exp);
      ended = true;
      return !bounded || g_->range(n.range).contains({num_.data(), left_});
  }
}

JsonGrammarThread::Step JsonGrammarThread::step(uint8_t b, bool ws) {
  if (done_) return Step::Refused;
  auto space = [&] { return ++spaces_ <= kMaxSpaces ? Step::Taken : Step::Refused; };
  auto ok = [](bool t) { return t ? Step::Taken : Step::Refused; };
  if (depth_ == 0) return ws ? space() : ok(begin_value(g_->root(), b));
  Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
  const Node& n = g_->node(f.node);
  switch (n.kind) {
    case JsonGrammar::String: {
      // A character starts at a byte of the text (not inside an escape or a UTF-8 sequence, not
      // the low half of an escaped pair); the closing quote comes only after min_len of them.
      const bool text = lex_ == Text && pair_ == None;
      const bool closes = text && b == '"';
      if (closes && (f.count < n.min_len || (n.pattern >= 0 && !g_->pattern(n.pattern).accepts({f.cand, f.seen}))))
        return Step::Refused;
      const bool starts = text && !closes;
      if (starts && f.count >= n.max_len) return Step::Refused;
      const uint8_t lex_before = lex_, pair_before = pair_;
      if (!string_byte(b, false)) return Step::Refused;
      if (starts) ++f.count;
      if (n.pattern >= 0 && !closes && !pattern_byte(g_->pattern(n.pattern), f, b, lex_before, pair_before)) return Step::Refused;
      return Step::Taken;
    }
    case JsonGrammar::Number:
    case JsonGrammar::Integer: {
      bool ended = false;
      if (!number_byte(b, n, ended)) return Step::Refused;
      if (!ended) return Step::Taken;
      end_value();
      return Step::Again;
    }
    case JsonGrammar::Enum: {
      uint64_t next = 0;
      bool whole_number = false;
      for (size_t k = 0; k < n.texts.size(); ++k) {
        if (!(f.cand >> k & 1)) continue;
        const std::string& t = n.texts[k];
        if (f.pos < t.size() && static_cast<uint8_t>(t[f.pos]) == b) next |= uint64_t{1} << k;
        else if (f.pos == t.size() && n.numeric[k]) whole_number = true;
      }
      if (next) {
        f.cand = next;
        ++f.pos;
        // A string, true, false or null is not the beginning of another value: complete, it ends.
        for (size_t k = 0; k < n.texts.size(); ++k)
          if ((next >> k & 1) && n.texts[k].size() == f.pos && !n.numeric[k]) {
            end_value();
            break;
          }
        return Step::Taken;
      }
      if (!whole_number) return Step::Refused;
      end_value();
      return Step::Again;
    }
    case JsonGrammar::Object:
      switch (f.phase) {
        case OOpen:
        case OComma:
          if (ws) return space();
          if (b == '"' && key_possible(f)) {
            f.phase = OKey, f.pos = 1, f.prop = -1;
            f.cand = (n.additional >= 0 ? ~uint64_t{0} : ~f.seen) & low_bits(n.keys.size());
            lex_ = Text, pair_ = None;
            return Step::Taken;
          }
          if (b == '}' && f.phase == OOpen && (f.seen & n.required) == n.required) {
            end_value();
            return Step::Taken;
          }
          return Step::Refused;
        case OKey: {
          // Declared keys are matched byte by byte (candidates narrowing); with other keys
          // allowed, any key text is taken too.
          const bool free = n.additional >= 0;
          uint64_t next = 0;
          int whole = -1;
          for (size_t k = 0; k < n.keys.size(); ++k) {
            if (!(f.cand >> k & 1)) continue;
            const std::string& t = n.keys[k];
            if (f.pos < t.size() && static_cast<uint8_t>(t[f.pos]) == b) {
              next |= uint64_t{1} << k;
              if (f.pos + 1u == t.size()) whole = static_cast<int>(k);
            }
          }
          if (b == '"' && lex_ == Text && pair_ == None) {
            if (whole >= 0) {
              if (f.seen >> whole & 1) return Step::Refused;  // given already
              f.prop = static_cast<int16_t>(whole);
            } else if (!free) {
              return Step::Refused;
            }
            f.phase = OColon;
            return Step::Taken;
          }
          // Escapes only where no property is declared: declared keys are compared as written.
          if ((b == '\\' && !n.keys.empty()) || !string_byte(b, true)) return Step::Refused;
          if (!next && !free) return Step::Refused;
          if (f.cand) f.cand = next, ++f.pos;
          return Step::Taken;
        }
        case OColon:
          if (ws) return space();
          if (b != ':') return Step::Refused;
          f.phase = OValue;
          return Step::Taken;
        case OValue:
          if (ws) return space();
          return ok(begin_value(f.prop >= 0 ? n.values[static_cast<size_t>(f.prop)] : n.additional, b));
        default:  // OAfter
          if (ws) return space();
          if (b == ',' && key_possible(f)) {
            f.phase = OComma;
            return Step::Taken;
          }
          if (b == '}' && (f.seen & n.required) == n.required) {
            end_value();
            return Step::Taken;
          }
          return Step::Refused;
      }
    case JsonGrammar::Array:
      if (ws) return space();
      switch (f.phase) {
        case AOpen:
          if (b == ']' && n.min_items == 0) {
            end_value();
            return Step::Taken;
          }
          return ok(n.max_items > 0 && begin_value(n.prefix.empty() ? n.items : n.prefix[0], b));
        case AAfter:
          if (b == ',' && f.count < n.max_items) {
            f.phase = ANext;
            return Step::Taken;
          }
          if (b == ']' && f.count >= n.min_items) {
            end_value();
            return Step::Taken;
          }
          return Step::Refused;
        default:  // ANext (count < max_items: a value exists for this place)
          return ok(begin_value(f.count < n.prefix.size() ? n.prefix[f.count] : n.items, b));
      }
    case JsonGrammar::AnyOf: break;
  }
  return Step::Refused;
}

bool JsonGrammarThread::push(uint8_t b, int pick) {
  pick_ = pick;
  const bool ws = b == ' ' || b == '\t' || b == '\n' || b == '\r';
  if (!ws) spaces_ = 0;
  for (;;) {
    switch (step(b, ws)) {
      case Step::Refused: return false;
      case Step::Taken: return true;
      case Step::Again: break;  // a number ended: the byte is its container's
    }
  }
}

int JsonGrammarThread::value_node() const {
  if (done_) return -1;
  if (depth_ == 0) return g_->root();
  const Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
  const Node& n = g_->node(f.node);
  if (n.kind == JsonGrammar::Object && f.phase == OValue) return f.prop >= 0 ? n.values[static_cast<size_t>(f.prop)] : n.additional;
  if (n.kind == JsonGrammar::Array && (f.phase == ANext || (f.phase == AOpen && n.max_items > 0)))
    return f.count < n.prefix.size() ? n.prefix[f.count] : n.items;
  return -1;  // (a number's end hands its byte to a container after a value: no value starts)
}

int JsonGrammarThread::ambiguity(uint8_t b) const {
  const int id = value_node();
  if (id < 0 || g_->node(id).kind != JsonGrammar::AnyOf) return 1;
  const int16_t v = g_->node(id).by_first[b];
  return v <= -2 ? static_cast<int>(g_->node(id).alike[static_cast<size_t>(-2 - v)].size()) : 1;
}

// ---- all readings ----

JsonGrammarState& JsonGrammarState::operator=(const JsonGrammarState& o) {
  if (this == &o) return *this;
  n_ = o.n_;
  for (int i = 0; i < n_; ++i) threads_[static_cast<size_t>(i)] = o.threads_[static_cast<size_t>(i)];
  return *this;
}

JsonTextSpot JsonGrammarState::text_spot() const {
  if (n_ == 1) return threads_[0].text_spot();
  for (int i = 0; i < n_; ++i) {
    const JsonTextSpot t = threads_[static_cast<size_t>(i)].text_spot();
    if (t.text && t.room == UINT32_MAX && t.pattern < 0) return t;
  }
  return {};
}

bool JsonGrammarState::complete() const {
  for (int i = 0; i < n_; ++i)
    if (threads_[static_cast<size_t>(i)].complete()) return true;
  return false;
}

// A value that can be of several nodes forks the reading, one per node; readings that refuse a
// byte end. (Past kMaxThreads the last alternatives are dropped: a schema would need that many
// alike branches open at once.)
bool JsonGrammarState::push(uint8_t b) {
  if (n_ == 1 && threads_[0].ambiguity(b) == 1) return threads_[0].push(b);
  std::array<JsonGrammarThread, kMaxThreads> out;
  int m = 0;
  for (int i = 0; i < n_; ++i) {
    const int a = threads_[static_cast<size_t>(i)].ambiguity(b);
    for (int k = 0; k < a && m < kMaxThreads; ++k) {
      out[static_cast<size_t>(m)] = threads_[static_cast<size_t>(i)];
      if (out[static_cast<size_t>(m)].push(b, k)) ++m;
    }
  }
  if (m == 0) return false;
  n_ = m;
  for (int i = 0; i < m; ++i) threads_[static_cast<size_t>(i)] = out[static_cast<size_t>(i)];
  return true;
}

}  // namespace dsv4
