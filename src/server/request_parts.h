#pragma once
// The pieces request parsing is made of, shared by the endpoints' parsers (request.cpp for chat
// completions, completions and Anthropic messages; responses_api.cpp for OpenAI's Responses API).
// Internal to the server's API layer: apps call parse_request (request.h).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/request.h"

namespace dsv4::server {

inline const char* type_of(const nlohmann::ordered_json& v) { return v.type_name(); }

// Typed field readers: absent or null -> the default; a wrong type is a 400 naming the field
// (prefix + key, e.g. "text.format.type").
struct Fields {
  const nlohmann::ordered_json& obj;
  std::string prefix;
  std::string name(const char* k) const { return prefix + k; }
  const nlohmann::ordered_json* get(const char* k) const;
  double number(const char* k, double def, double lo, double hi) const;
  int64_t integer(const char* k, int64_t def, int64_t lo, int64_t hi) const;
  bool boolean(const char* k, bool def) const;
  std::string string(const char* k, const std::string& def) const;
  static std::string fmt(double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return b;
  }
};

// The body as a JSON object: valid UTF-8, nested at most 128 levels, else a 400.
nlohmann::ordered_json parse_json(const std::string& body);

// temperature, top_p, top_k, min_p, penalties, seed, stop and n (OpenAI's fields and vLLM's).
void read_sampling(const Fields& f, ParsedRequest& r);
// logit_bias: {"token id": bias in [-100, 100]}.
void read_logit_bias(const Fields& f, ParsedRequest& r, int64_t vocab);
// thinking: {type: enabled | disabled} and chat_template_kwargs: {thinking: bool}; `def` when
// neither says.
bool read_thinking(const Fields& f, bool def);

// A message content: a string, or a list of text parts whose "type" is one of `text_types`.
std::string content_text(const nlohmann::ordered_json& c, const std::string& where,
                         const std::vector<std::string>& text_types = {"text"});
// OpenAI chat tools: [{"type": "function", "function": {"name", ...}}].
void check_tools(const nlohmann::ordered_json& tools, const std::string& where);
// Messages (OpenAI chat format) in the form render_chat takes, tools and schema put on the first
// system message (one added when there is none); sent-back tool calls get their sampled DSML.
nlohmann::ordered_json chat_messages(const nlohmann::ordered_json& in, const nlohmann::ordered_json& tools,
                                     const ToolCallStore* store, const nlohmann::ordered_json& schema = nullptr);
// render_chat of chat_messages' output; a renderer error is a 400 on "messages" (`note` says how
// the client's list was converted, when its indices differ).
std::string render_messages(const nlohmann::ordered_json& rendered, const ChatOptions& co, const std::string& note);

// How the model knows a function of a Responses namespace tool: "NAMESPACE__NAME" (V4 knows
// tools by one name).
std::string namespaced_tool(const std::string& ns, const std::string& name);

// A forced call (tool_choice required / any, or `named` `name`): a named tool must be among
// `tools` (a 400 on name_param); there must be tools; the model must not reason first (`unforce`
// says how to ask for that).
void check_forced_call(const nlohmann::ordered_json& tools, bool named, const std::string& name, const std::string& name_param,
                       bool thinking, const std::string& unforce);
// OpenAI's tool_choice: auto (the default), none (the tools left out of the prompt), required, or
// a named function: {type: function, function: {name}} on chat completions, {type: function,
// name} (`flat`) on the Responses API. Returns whether a call is forced; `forced` names it ("":
// any). Forcing is checked by check_forced_call.
bool read_tool_choice(const Fields& f, ParsedRequest& r, bool thinking, bool flat, std::string& forced,
                      const std::string& unforce);
// The DSML text that opens a forced tool call (tool_choice required or a named function).
std::string forced_call_prefix(const std::string& name);
// With tools beside a JSON format, the answer is the object or a tool-call block; a forced call
// drops the format (it is the answer).
void json_beside_tools(ParsedRequest& r, bool call_forced);
// A JSON Schema compiled into r.gen.json; a keyword the grammar cannot enforce is a 400 naming
// its path under `where`.
void compile_schema(ParsedRequest& r, const nlohmann::ordered_json& schema, const std::string& where);

// Tokenizes prompt_text + forced_prefix (unless the prompt is token ids already), checks it
// against the context and sets max_tokens (given > 0, else the default); sets the GenParams
// that follow from the request's mode and tools (answer_reused, end_at_first_call). With lim.count_only the
// context checks are left out: the prompt is only counted.
void tokenize_prompt(ParsedRequest& r, const ModelFacts& model, const RequestLimits& lim, const char* max_key,
                     int64_t max_tokens_given);

}  // namespace dsv4::server
