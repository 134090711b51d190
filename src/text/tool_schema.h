#pragma once
// Tool-call arguments typed by the tool's JSON schema. DSML marks each parameter value as a raw
// string (string="true") or JSON (string="false"), and the model sometimes marks it against the
// schema: a number written as a string, a string parameter written as a bare number. The client
// validates arguments against its schema, so the server answers with the schema's type where the
// text allows it:
// - string="true" for a parameter whose schema does not allow a string: the text parsed as JSON
//   when it is a value of an allowed type (written as it is), else the JSON string;
// - string="false" whose JSON value has a type the schema does not allow while it allows a
//   string: the text as a JSON string (null stays null: optional parameters);
// - otherwise as written: JSON as it is, the JSON string of a raw string, and a string="false"
//   text that is not JSON as a JSON string.
// Types come from the parameter schema's "type" (a name or a list), else from the "type" of its
// "anyOf" / "oneOf" alternatives, else from the values of "enum" / "const". A parameter without
// any (unknown, or no schema) is taken as written. The exact DSML text is kept apart (completion
// stream), so typing never changes what a later prompt renders.
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace dsv4 {

class ToolSchemas {
 public:
  ToolSchemas() = default;  // no tools: every value as written
  // `tools`: null, or a list of {"type":"function","function":{"name":..,"parameters":..}} (or
  // {"name":..,"parameters":..}) objects. Throws dsv4::Error for another shape (the index named).
  explicit ToolSchemas(const nlohmann::ordered_json& tools);

  bool empty() const { return tools_.empty(); }
  bool has_tool(const std::string& name) const { return tools_.count(name) != 0; }
  // The JSON types the parameter allows ("string", "integer", ...); empty: unknown, untyped.
  const std::set<std::string>& types(const std::string& tool, const std::string& param) const;

 private:
  std::map<std::string, std::map<std::string, std::set<std::string>>> tools_;  // tool -> param -> types
};

// A value's JSON Schema type: "string", "integer" (a number without fraction or exponent as
// written), "number", "boolean", "null", "object" or "array".
std::string json_type_of(const nlohmann::ordered_json& v);

// Whether a string="true" value of a parameter with these types is a JSON string (and so can be
// streamed as it arrives) whatever its text.
bool string_value_stays_string(const std::set<std::string>& types);

// The JSON text of one argument value: `raw` as written between the parameter's tags,
// `is_string` its string="true" flag, `types` the parameter's (see above).
std::string typed_argument(const std::string& raw, bool is_string, const std::set<std::string>& types);

}  // namespace dsv4
