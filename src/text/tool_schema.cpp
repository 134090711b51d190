#include "text/tool_schema.h"

#include "core/error.h"
#include "text/chat.h"

namespace dsv4 {

using ojson = nlohmann::ordered_json;

std::string json_type_of(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::string: return "string";
    case ojson::value_t::boolean: return "boolean";
    case ojson::value_t::null: return "null";
    case ojson::value_t::object: return "object";
    case ojson::value_t::array: return "array";
    case ojson::value_t::number_float: return "number";
    case ojson::value_t::number_integer:
    case ojson::value_t::number_unsigned: return "integer";
    default: return "";
  }
}

namespace {

void add_declared_type(const ojson& t, std::set<std::string>* out) {
  if (t.is_string()) out->insert(t.get<std::string>());
  if (t.is_array())
    for (const auto& x : t)
      if (x.is_string()) out->insert(x.get<std::string>());
}

std::set<std::string> schema_types(const ojson& schema) {
  std::set<std::string> out;
  if (!schema.is_object()) return out;
  if (schema.contains("type")) add_declared_type(schema["type"], &out);
  for (const char* alt : {"anyOf", "oneOf"})
    if (out.empty() && schema.contains(alt) && schema[alt].is_array())
      for (const auto& s : schema[alt])
        if (s.is_object() && s.contains("type")) add_declared_type(s["type"], &out);
  if (out.empty() && schema.contains("enum") && schema["enum"].is_array())
    for (const auto& v : schema["enum"]) out.insert(json_type_of(v));
  if (out.empty() && schema.contains("const")) out.insert(json_type_of(schema["const"]));
  out.erase("");
  return out;
}

// A JSON value of one of `types` ("number" takes integers too, as JSON Schema does).
bool has_allowed_type(const ojson& v, const std::set<std::string>& types) {
  const std::string t = json_type_of(v);
  return types.count(t) || (t == "integer" && types.count("number"));
}

}  // namespace

ToolSchemas::ToolSchemas(const ojson& tools) {
  if (tools.is_null()) return;
  if (!tools.is_array()) throw Error("tools must be a list");
  for (size_t k = 0; k < tools.size(); ++k) {
    const ojson& t = tools[k];
    const ojson* fn = &t;
    if (t.is_object() && t.contains("function") && t["function"].is_object()) fn = &t["function"];
    if (!fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
      throw Error("tools[" + std::to_string(k) + "]: no function name");
    auto& params = tools_[(*fn)["name"].get<std::string>()];
    const auto p = fn->find("parameters");
    if (p == fn->end() || !p->is_object() || !p->contains("properties") || !(*p)["properties"].is_object()) continue;
    for (const auto& [name, schema] : (*p)["properties"].items()) params[name] = schema_types(schema);
  }
}

const std::set<std::string>& ToolSchemas::types(const std::string& tool, const std::string& param) const {
  static const std::set<std::string> none;
  const auto t = tools_.find(tool);
  if (t == tools_.end()) return none;
  const auto p = t->second.find(param);
  return p == t->second.end() ? none : p->second;
}

bool string_value_stays_string(const std::set<std::string>& types) { return types.empty() || types.count("string"); }

std::string typed_argument(const std::string& raw, bool is_string, const std::set<std::string>& types) {
  if (is_string && string_value_stays_string(types)) return to_python_json(raw);
  const ojson v = ojson::parse(raw, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return to_python_json(raw);
  if (is_string) return has_allowed_type(v, types) ? raw : to_python_json(raw);
  if (!types.empty() && !v.is_null() && !has_allowed_type(v, types) && types.count("string")) return to_python_json(raw);
  return raw;
}

}  // namespace dsv4
