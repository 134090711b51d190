#include "server/request.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "server/request_parts.h"
#include "server/responses_api.h"
#include "text/json_grammar.h"

namespace dsv4::server {

using ojson = nlohmann::ordered_json;

void bad_request(const std::string& param, const std::string& message) {
  throw ApiError(400, "invalid_request_error", param.empty() ? message : "'" + param + "': " + message, param);
}

std::string error_body(const ApiError& e) {
  ojson err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return ojson{{"error", err}}.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string anthropic_error_body(const ApiError& e) {
  std::string type = e.type;
  if (e.status == 400) type = "invalid_request_error";
  if (e.status == 401) type = "authentication_error";
  if (e.status == 404) type = "not_found_error";
  if (e.status == 413) type = "request_too_large";
  if (e.status == 503) type = "overloaded_error";
  if (e.status >= 500 && e.status != 503) type = "api_error";
  return ojson{{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}}.dump(-1, ' ', false,
                                                                                        ojson::error_handler_t::replace);
}

const ojson* Fields::get(const char* k) const {
  auto it = obj.find(k);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}
double Fields::number(const char* k, double def, double lo, double hi) const {
  const ojson* v = get(k);
  if (!v) return def;
  if (!v->is_number()) bad_request(name(k), std::string("must be a number, got ") + type_of(*v));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi) || !std::isfinite(x))
    bad_request(name(k), "must be in [" + fmt(lo) + ", " + fmt(hi) + "], got " + fmt(x));
  return x;
}
int64_t Fields::integer(const char* k, int64_t def, int64_t lo, int64_t hi) const {
  const ojson* v = get(k);
  if (!v) return def;
  if (!v->is_number_integer()) bad_request(name(k), std::string("must be an integer, got ") + type_of(*v));
  // Unsigned values beyond int64 are out of range too.
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
    bad_request(name(k), "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    bad_request(name(k), "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(x));
  return x;
}
bool Fields::boolean(const char* k, bool def) const {
  const ojson* v = get(k);
  if (!v) return def;
  if (!v->is_boolean()) bad_request(name(k), std::string("must be a boolean, got ") + type_of(*v));
  return v->get<bool>();
}
std::string Fields::string(const char* k, const std::string& def) const {
  const ojson* v = get(k);
  if (!v) return def;
  if (!v->is_string()) bad_request(name(k), std::string("must be a string, got ") + type_of(*v));
  return v->get<std::string>();
}

// "stop": a string or a list of strings (at most 16, none empty).
static std::vector<std::string> stop_list(const Fields& f, const char* key) {
  std::vector<std::string> out;
  const ojson* v = f.get(key);
  if (!v) return out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const auto& s : *v) {
      if (!s.is_string()) bad_request(f.name(key), "must be a string or a list of strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    bad_request(f.name(key), "must be a string or a list of strings");
  }
  if (out.size() > 16) bad_request(f.name(key), "at most 16 stop sequences, got " + std::to_string(out.size()));
  for (const auto& s : out)
    if (s.empty()) bad_request(f.name(key), "stop sequences must not be empty");
  return out;
}

// Sampling fields shared by the OpenAI endpoints.
void read_sampling(const Fields& f, ParsedRequest& r) {
  SamplingParams& s = r.gen.sampling;
  s.temperature = static_cast<float>(f.number("temperature", 1.0, 0.0, 2.0));
  s.top_p = static_cast<float>(f.number("top_p", 1.0, 0.0, 1.0));
  if (s.top_p == 0.0f) bad_request("top_p", "must be > 0");
  const int64_t k = f.integer("top_k", 0, -1, 1 << 30);
  s.top_k = k < 0 ? 0 : k;  // -1 = off (vLLM's convention)
  s.min_p = static_cast<float>(f.number("min_p", 0.0, 0.0, 0.999999));
  s.presence_penalty = static_cast<float>(f.number("presence_penalty", 0.0, -2.0, 2.0));
  s.frequency_penalty = static_cast<float>(f.number("frequency_penalty", 0.0, -2.0, 2.0));
  s.repetition_penalty = static_cast<float>(f.number("repetition_penalty", 1.0, 0.01, 10.0));
  if (f.get("seed")) {
    s.seed = static_cast<uint64_t>(f.integer("seed", 0, INT64_MIN, INT64_MAX));
  } else {
    s.seed = std::random_device{}() * 0x100000000ull + std::random_device{}();
  }
  r.gen.stop = stop_list(f, "stop");
  r.gen.n = static_cast<int>(f.integer("n", 1, 1, 1 << 20));
}

bool read_thinking(const Fields& f, bool def) {
  bool thinking = def;
  if (const ojson* t = f.get("thinking")) {
    if (!t->is_object()) bad_request("thinking", "must be an object");
    const std::string type = Fields{*t, "thinking."}.string("type", def ? "enabled" : "");
    if (type != "enabled" && type != "disabled") bad_request("thinking.type", "must be enabled or disabled, got '" + type + "'");
    thinking = type == "enabled";
  }
  if (const ojson* k = f.get("chat_template_kwargs")) {
    if (!k->is_object()) bad_request("chat_template_kwargs", "must be an object");
    thinking = Fields{*k, "chat_template_kwargs."}.boolean("thinking", thinking);
  }
  return thinking;
}

std::string render_messages(const ojson& rendered, const ChatOptions& co, const std::string& note) {
  try {
    return render_chat(rendered, co);
  } catch (const Error& e) {
    bad_request("messages", std::string(e.what()) + note);
  }
}

void compile_schema(ParsedRequest& r, const ojson& schema, const std::string& where) {
  try {
    r.gen.json = JsonGrammar::compile(schema, where);
  } catch (const SchemaError& e) {
    bad_request(e.path, e.why);
  }
}

// Text of a message content: a string, or a list of {"type": "text", "text": ...} parts.
std::string content_text(const ojson& c, const std::string& where, const std::vector<std::string>& text_types) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad_request(where, std::string("must be a string or a list of text parts, got ") + type_of(c));
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const ojson& p = c[i];
    const std::string w = where + "[" + std::to_string(i) + "]";
    if (!p.is_object()) bad_request(w, "must be an object");
    auto t = p.find("type");
    if (t == p.end() || !t->is_string()) bad_request(w + ".type", "is required");
    if (std::find(text_types.begin(), text_types.end(), t->get<std::string>()) == text_types.end())
      bad_request(w + ".type", "only text parts (" + text_types[0] + ") are supported, got '" + t->get<std::string>() + "'");
    auto x = p.find("text");
    if (x == p.end() || !x->is_string()) bad_request(w + ".text", "must be a string");
    out += x->get<std::string>();
  }
  return out;
}

// OpenAI tools: [{"type": "function", "function": {"name", "description", "parameters"}}].
void check_tools(const ojson& tools, const std::string& where) {
  if (!tools.is_array()) bad_request(where, "must be a list");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    const ojson& t = tools[i];
    // Fields::string, not json::value: a non-string type must be a 400, not a JSON type_error
    // (a 500), as for every nested string below (found by fuzz_server_request).
    if (!t.is_object() || Fields{t, w + "."}.string("type", "") != "function") bad_request(w + ".type", "must be 'function'");
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) bad_request(w + ".function", "must be an object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
      bad_request(w + ".function.name", "must be a non-empty string");
  }
}

// The chat's messages in the form render_chat takes, with the tools put on the system message
// (the official encoding lists them in the first system turn; one is added when there is none).
ojson chat_messages(const ojson& in, const ojson& tools, const ToolCallStore* store, const ojson& schema) {
  if (!in.is_array()) bad_request("messages", std::string("must be a list, got ") + type_of(in));
  if (in.empty()) bad_request("messages", "must not be empty");
  ojson out = ojson::array();
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string w = "messages[" + std::to_string(i) + "]";
    const ojson& m = in[i];
    if (!m.is_object()) bad_request(w, "must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) bad_request(w + ".role", "is required (a string)");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool")
      bad_request(w + ".role", "must be system, developer, user, assistant or tool, got '" + r + "'");
    ojson o = ojson::object();
    o["role"] = r;
    auto c = m.find("content");
    if (c != m.end() && !c->is_null()) {
      o["content"] = content_text(*c, w + ".content");
    } else if (r != "assistant") {
      bad_request(w + ".content", "is required");
    }
    if (r == "assistant") {
      if (auto rc = m.find("reasoning_content"); rc != m.end() && !rc->is_null()) {
        if (!rc->is_string()) bad_request(w + ".reasoning_content", "must be a string");
        o["reasoning_content"] = *rc;
      }
      if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
        o["tool_calls"] = *tc;
        // The exact text sampled for a call this server returned (byte-identical re-render).
        if (store && tc->is_array())
          for (auto& call : o["tool_calls"])
            if (call.is_object() && call.contains("id") && call["id"].is_string())
              if (auto d = store->get(call["id"].get<std::string>())) call["dsml"] = *d;
      }
      if (!o.contains("content") && !o.contains("tool_calls")) bad_request(w + ".content", "is required without tool_calls");
    }
    if (r == "tool") {
      auto id = m.find("tool_call_id");
      if (id != m.end() && !id->is_null()) {
        if (!id->is_string()) bad_request(w + ".tool_call_id", "must be a string");
        o["tool_call_id"] = *id;
      }
    }
    out.push_back(std::move(o));
  }
  if (!tools.empty() || !schema.is_null()) {
    if (out[0]["role"] != "system") out.insert(out.begin(), ojson{{"role", "system"}, {"content", ""}});
    if (!tools.empty()) out[0]["tools"] = tools;
    if (!schema.is_null()) out[0]["response_format"] = schema;
  }
  return out;
}

// JSON text is UTF-8 (RFC 8259); nlohmann's parser passes invalid bytes inside strings through,
// so they are refused here, before anything renders or echoes them.
static void check_utf8(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= n && !(c == 0xC0 || c == 0xC1 || c > 0xF4);
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (size_t k = 1; ok && k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      ok = (d & 0xC0) == 0x80;
      cp = (cp << 6) | (d & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8 either.
    if (ok && ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF)))
      ok = false;
    if (!ok)
      throw ApiError(400, "invalid_request_error", "the body is not valid UTF-8 (byte " + std::to_string(i) + ")");
    i += len;
  }
}

// Copying and dumping a JSON value recurse once per level of nesting (so does rendering a tool's
// parameters): a body of ~100 KB of '[' inside a tool overflowed the handling thread's stack and
// killed the server, well under the 8 MB body limit. Deeper nesting than any real request needs
// (a tool schema of ~60 nested objects) is refused before parsing.
static constexpr int kMaxJsonDepth = 128;

// Depth of [ and { outside strings; exact for valid JSON (what the parser would accept), and
// anything else the parser refuses anyway.
static void check_depth(const std::string& s) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;  // the escaped character cannot end the string
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw ApiError(400, "invalid_request_error",
                       "the body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels (byte " + std::to_string(i) + ")");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

ojson parse_json(const std::string& body) {
  check_utf8(body);
  check_depth(body);
  ojson j;
  try {
    j = ojson::parse(body);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann rejects invalid UTF-8 inside strings too.
    throw ApiError(400, "invalid_request_error", std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "invalid_request_error", "the body must be a JSON object");
  return j;
}

void check_forced_call(const ojson& tools, bool named, const std::string& name, const std::string& name_param,
                       bool thinking, const std::string& unforce) {
  const bool known = std::any_of(tools.begin(), tools.end(), [&](const ojson& t) { return t["function"]["name"] == name; });
  if (named && !known) bad_request(name_param, "'" + name + "' is not in tools");
  // Forcing the call markup with no tool to call would only make the model invent one (found by
  // fuzz_server_request).
  if (tools.empty()) bad_request("tool_choice", "needs tools");
  // In thinking mode the model reasons first, and forcing markup there would cut its reasoning.
  if (thinking) bad_request("tool_choice", "a tool call cannot be forced while the model reasons first; " + unforce);
}

std::string namespaced_tool(const std::string& ns, const std::string& name) { return ns + "__" + name; }

bool read_tool_choice(const Fields& f, ParsedRequest& r, bool thinking, bool flat, std::string& forced,
                      const std::string& unforce) {
  const ojson* tc = f.get("tool_choice");
  if (!tc) return false;
  const char* name_param = flat ? "tool_choice.name" : "tool_choice.function.name";
  bool forced_any = false;
  if (tc->is_string()) {
    const std::string c = tc->get<std::string>();
    if (c == "none") r.tools = ojson::array();
    else if (c == "required") forced_any = true;
    else if (c != "auto")
      bad_request("tool_choice", std::string("must be auto, none, required or {type: function, ") +
                                     (flat ? "name" : "function: {name}") + "}, got '" + c + "'");
  } else if (tc->is_object()) {
    const Fields tf{*tc, "tool_choice."};
    const std::string type = tf.string("type", "");
    // (chat completions clients have sent the object without its type: taken as a function)
    if (type != "function" && (flat || !type.empty()))
      bad_request("tool_choice.type", "only a function can be chosen, got '" + type + "'");
    const ojson* fn = flat ? tc : tf.get("function");
    if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) bad_request(name_param, "is required");
    forced = (*fn)["name"].get<std::string>();
    if (flat && tf.get("namespace")) forced = namespaced_tool(tf.string("namespace", ""), forced);  // Responses
    forced_any = true;
  } else {
    bad_request("tool_choice", "must be a string or an object");
  }
  if (forced_any) check_forced_call(r.tools, tc->is_object(), forced, name_param, thinking, unforce);
  return forced_any;
}

// The DSML text that opens a forced tool call (tool_choice required or a named function).
std::string forced_call_prefix(const std::string& name) {
  std::string s = std::string("\n\n<") + kDsmlText + "tool_calls>\n";
  if (!name.empty()) s += std::string("<") + kDsmlText + "invoke name=\"" + name + "\">\n";
  return s;
}

void tokenize_prompt(ParsedRequest& r, const ModelFacts& model, const RequestLimits& lim, const char* max_key,
                     int64_t max_tokens_given) {
  // The V4 encoding drops earlier reasoning unless the conversation has tools.
  r.gen.answer_reused = !r.chat || r.mode != ChatMode::Thinking || !r.tools.empty();
  if (r.single_tool_call && !r.tools.empty())
    r.gen.end_at_first_call = std::make_shared<const GenParams::FirstCall>(GenParams::FirstCall{r.mode, r.tools, r.forced_prefix});
  if (r.gen.prompt.empty()) r.gen.prompt = model.tok.encode(r.prompt_text + r.forced_prefix);
  const int64_t ctx = model.context;
  const int64_t n = static_cast<int64_t>(r.gen.prompt.size());
  if (n == 0) bad_request("prompt", "must not be empty");
  if (lim.count_only) return;
  if (n >= ctx)
    bad_request(r.chat ? "messages" : "prompt", "the prompt has " + std::to_string(n) + " tokens; the context is " + std::to_string(ctx) +
                                " (no room to generate)");
  if (max_tokens_given > 0 && n + max_tokens_given > ctx)
    bad_request(max_key, "prompt (" + std::to_string(n) + " tokens) + " + max_key + " (" + std::to_string(max_tokens_given) +
                             ") exceeds the context (" + std::to_string(ctx) + ")");
  r.gen.max_tokens = max_tokens_given > 0 ? max_tokens_given : std::min(lim.default_max_tokens, ctx - n);
}

// logit_bias: {"token id": bias in [-100, 100]}, added to the logits before the pick (OpenAI's).
void read_logit_bias(const Fields& f, ParsedRequest& r, int64_t vocab) {
  const ojson* b = f.get("logit_bias");
  if (!b) return;
  if (!b->is_object()) bad_request("logit_bias", std::string("must be an object of token ids to numbers, got ") + type_of(*b));
  if (b->size() > 300) bad_request("logit_bias", "may bias at most 300 tokens, got " + std::to_string(b->size()));
  for (const auto& [k, v] : b->items()) {
    const std::string w = "logit_bias." + k;
    const bool digits = !k.empty() && k.size() <= 9 && k.find_first_not_of("0123456789") == std::string::npos;
    const int64_t id = digits ? std::stoll(k) : -1;
    if (id < 0 || id >= vocab)
      bad_request("logit_bias", "'" + k + "' is not a token id in [0, " + std::to_string(vocab) + ")");
    if (!v.is_number()) bad_request(w, std::string("must be a number, got ") + type_of(v));
    const double x = v.get<double>();
    if (!(x >= -100 && x <= 100)) bad_request(w, "must be in [-100, 100], got " + Fields::fmt(x));
    r.gen.logit_bias.push_back({static_cast<int32_t>(id), static_cast<float>(x)});
  }
}

// What both OpenAI endpoints read alike: model, stream (+ usage), sampling, n.
static void read_openai_common(const Fields& f, ParsedRequest& r, const RequestLimits& lim) {
  r.model = f.string("model", "");
  r.stream = f.boolean("stream", false);
  if (const ojson* so = f.get("stream_options")) {
    if (!so->is_object()) bad_request("stream_options", "must be an object");
    r.include_usage = Fields{*so, "stream_options."}.boolean("include_usage", false);
  }
  read_sampling(f, r);
  if (r.gen.n > lim.max_n) bad_request("n", "must be at most " + std::to_string(lim.max_n) + ", got " + std::to_string(r.gen.n));
}

// A JSON answer beside tools: the answer is then the object or a tool-call block
// (engine/json_constraint.h). When a call is forced (tool_choice required or a named one), the
// answer is that call, so the format is for a later answer, not this one.
void json_beside_tools(ParsedRequest& r, bool call_forced) {
  if (!r.gen.json || r.tools.empty()) return;
  if (call_forced) r.gen.json = nullptr;
  else r.gen.json_or_tool_call = true;
}

// response_format: text, json_object (any JSON object, as DeepSeek's API offers) or json_schema
// (an object of the schema). Either is enforced (engine/json_constraint.h). Returns the schema
// (null for the others): a chat prompt shows it to the model in the system message's Response
// Format section.
static ojson read_response_format(const Fields& f, ParsedRequest& r) {
  const ojson* rf = f.get("response_format");
  if (!rf) return nullptr;
  if (!rf->is_object()) bad_request("response_format", "must be an object");
  const Fields rff{*rf, "response_format."};
  const std::string t = rff.string("type", "");
  if (t == "json_object") {
    r.gen.json = JsonGrammar::any_object();
  } else if (t == "json_schema") {
    const ojson* js = rff.get("json_schema");
    if (!js || !js->is_object()) bad_request("response_format.json_schema", "is required: {name, schema}");
    const ojson* sc = Fields{*js, "response_format.json_schema."}.get("schema");
    if (!sc) bad_request("response_format.json_schema.schema", "is required");
    compile_schema(r, *sc, "response_format.json_schema.schema");
    return *sc;
  } else if (t != "text") {
    bad_request("response_format.type", "must be text, json_object or json_schema, got '" + t + "'");
  }
  return nullptr;
}

static void parse_openai_chat(const ojson& j, ParsedRequest& r, const ModelFacts& model, const RequestLimits& lim,
                       const ToolCallStore* store) {
  Fields f{j, ""};
  read_openai_common(f, r, lim);
  read_logit_bias(f, r, model.vocab);
  r.logprobs = f.boolean("logprobs", false);
  const int64_t top = f.integer("top_logprobs", -1, 0, 20);
  if (top >= 0 && !r.logprobs) bad_request("top_logprobs", "needs logprobs: true");
  r.gen.top_logprobs = r.logprobs ? static_cast<int>(std::max<int64_t>(top, 0)) : -1;
  const ojson schema = read_response_format(f, r);
  // What would change the answer and cannot be done here is refused, not ignored.
  if (const ojson* m = f.get("modalities")) {
    if (!m->is_array()) bad_request("modalities", "must be a list");
    for (const auto& x : *m)
      if (x != "text") bad_request("modalities", "only text output is offered, got " + x.dump());
  }
  if (f.get("audio")) bad_request("audio", "audio output is not offered");
  if (f.get("web_search_options")) bad_request("web_search_options", "web search is not offered");
  const bool thinking = read_thinking(f, true);  // on by default, as in DeepSeek's API
  r.mode = thinking ? ChatMode::Thinking : ChatMode::Chat;
  r.gen.reasoning_first = thinking;
  ChatOptions co;
  co.mode = r.mode;
  const std::string effort = f.string("reasoning_effort", "");
  if (effort == "max") {
    co.reasoning_effort = "max";
  } else if (effort == "low" || effort == "medium" || effort == "high") {
    co.reasoning_effort = "high";  // DeepSeek's API maps low / medium to high
  } else if (!effort.empty()) {
    bad_request("reasoning_effort", "must be low, medium, high or max, got '" + effort + "'");
  }
  if (const ojson* t = f.get("tools")) {
    check_tools(*t, "tools");
    r.tools = *t;
  }
  r.single_tool_call = !f.boolean("parallel_tool_calls", true);
  std::string forced;
  const bool forced_any = read_tool_choice(f, r, thinking, false, forced,
                                           "disable thinking (thinking: {type: disabled}) or use tool_choice auto");
  json_beside_tools(r, forced_any);
  const ojson* msgs = f.get("messages");
  if (!msgs) bad_request("messages", "is required");
  const ojson rendered = chat_messages(*msgs, r.tools, store, schema);
  // The renderer's indices are of the list it got: one more than the client's when a system
  // message was put first to carry the tools.
  const bool shifted = rendered.size() != msgs->size();
  r.prompt_text = render_messages(
      rendered, co, shifted ? " (counting a system message added first for the tools or the response format)" : "");
  if (forced_any) r.forced_prefix = forced_call_prefix(forced);
  const int64_t mt = f.integer("max_completion_tokens", f.integer("max_tokens", 0, 1, 1 << 30), 1, 1 << 30);
  tokenize_prompt(r, model, lim, f.get("max_completion_tokens") ? "max_completion_tokens" : "max_tokens", mt);
}

static void parse_openai_completion(const ojson& j, ParsedRequest& r, const ModelFacts& model, const RequestLimits& lim) {
  Fields f{j, ""};
  r.chat = false;
  read_openai_common(f, r, lim);
  read_logit_bias(f, r, model.vocab);
  const int64_t lp = f.integer("logprobs", -1, 0, 20);
  r.logprobs = lp >= 0;
  r.gen.top_logprobs = static_cast<int>(lp);
  r.echo = f.boolean("echo", false);
  read_response_format(f, r);  // the answer follows the prompt as it is: no reasoning, no schema shown
  const ojson* p = f.get("prompt");
  if (!p) bad_request("prompt", "is required");
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number_integer()) {
    const int64_t V = model.vocab;
    for (size_t i = 0; i < p->size(); ++i) {
      const ojson& t = (*p)[i];
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= V)
        bad_request("prompt[" + std::to_string(i) + "]", "must be a token id in [0, " + std::to_string(V) + ")");
      r.gen.prompt.push_back(t.get<int32_t>());
    }
    // The text is echoed in JSON (echo: true), which must be valid UTF-8, and ids can split or
    // garble characters: decode as the answer is streamed, bad bytes becoming U+FFFD (found by
    // fuzz_server_request; a plain decode made the answer's JSON dump throw).
    StreamDecoder dec(model.tok);
    r.prompt_text.clear();
    for (int32_t id : r.gen.prompt) r.prompt_text += dec.push(id);
    r.prompt_text += dec.flush();
  } else {
    bad_request("prompt", "must be a string or a list of token ids (one prompt per request)");
  }
  r.echo_text = r.prompt_text;
  // suffix: fill in the middle between the prompt and it (DeepSeek's FIM completion).
  if (f.get("suffix")) {
    if (!p->is_string()) bad_request("suffix", "fill-in-the-middle needs a text prompt, not token ids");
    r.prompt_text = render_fim(r.prompt_text, f.string("suffix", ""));
  }
  tokenize_prompt(r, model, lim, "max_tokens", f.integer("max_tokens", 16, 1, 1 << 30));
}

// Anthropic Messages -> OpenAI-format messages for the same renderer.
static void parse_anthropic(const ojson& j, ParsedRequest& r, const ModelFacts& model, const RequestLimits& lim,
                     const ToolCallStore* store) {
  Fields f{j, ""};
  r.model = f.string("model", "");
  r.stream = f.boolean("stream", false);
  SamplingParams& s = r.gen.sampling;
  s.temperature = static_cast<float>(f.number("temperature", 1.0, 0.0, 1.0));
  s.top_p = static_cast<float>(f.number("top_p", 1.0, 0.0, 1.0));
  if (s.top_p == 0.0f) bad_request("top_p", "must be > 0");
  s.top_k = f.integer("top_k", 0, 0, 1 << 30);
  s.seed = std::random_device{}() * 0x100000000ull + std::random_device{}();
  r.gen.stop = stop_list(f, "stop_sequences");
  if (!f.get("max_tokens") && !lim.count_only) bad_request("max_tokens", "is required");
  const int64_t max_tokens = f.integer("max_tokens", 0, 1, 1 << 30);
  // Thinking is off unless asked for, as in Anthropic's API.
  if (const ojson* m = f.get("mcp_servers"); m && !(m->is_array() && m->empty()))
    bad_request("mcp_servers", "the MCP connector is not offered: connect the servers in the client and send their tools");
  // enabled (a budget), adaptive (the model decides how much) and between_tools all mean V4's
  // thinking mode: it reasons before each answer, as much as it sees fit.
  bool thinking = false;
  if (const ojson* t = f.get("thinking")) {
    if (!t->is_object()) bad_request("thinking", "must be an object");
    const Fields tf{*t, "thinking."};
    const std::string type = tf.string("type", "");
    if (type != "enabled" && type != "adaptive" && type != "between_tools" && type != "disabled")
      bad_request("thinking.type", "must be enabled, adaptive, between_tools or disabled, got '" + type + "'");
    thinking = type != "disabled";
    // display "omitted": the thinking block's text is left empty; its signature carries it, so
    // that the block sent back renders the same prompt.
    const std::string display = tf.string("display", "summarized");
    if (display != "summarized" && display != "omitted")
      bad_request("thinking.display", "must be summarized or omitted, got '" + display + "'");
    r.reasoning_in_signature = thinking && display == "omitted";
  }
  r.mode = thinking ? ChatMode::Thinking : ChatMode::Chat;
  ojson tools = ojson::array();
  if (const ojson* t = f.get("tools")) {
    if (!t->is_array()) bad_request("tools", "must be a list");
    for (size_t i = 0; i < t->size(); ++i) {
      const ojson& x = (*t)[i];
      const std::string w = "tools[" + std::to_string(i) + "]";
      if (!x.is_object() || !x.contains("name") || !x["name"].is_string()) bad_request(w + ".name", "must be a string");
      // Anthropic-defined tools (bash_20250124, text_editor_..., web_search_20250305, ...) carry a
      // type and no input_schema: the model would be shown a tool without its parameters, and a
      // server tool would come back as a tool_use for the client. Refused, not ignored.
      if (const std::string type = Fields{x, w + "."}.string("type", "custom"); type != "custom")
        bad_request(w + ".type", "Anthropic-defined and server tools ('" + type +
                                     "') are not offered: define the tool with name, description and input_schema");
      ojson fn = {{"name", x["name"]}};
      if (x.contains("description")) fn["description"] = x["description"];
      fn["parameters"] = x.value("input_schema", ojson::object());
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
  }
  std::string forced;
  bool forced_any = false;
  if (const ojson* tc = f.get("tool_choice")) {
    if (!tc->is_object()) bad_request("tool_choice", "must be an object");
    const Fields tf{*tc, "tool_choice."};
    const std::string type = tf.string("type", "");
    r.single_tool_call = tf.boolean("disable_parallel_tool_use", false);
    if (type == "none") {
      tools = ojson::array();
    } else if (type == "any") {
      forced_any = true;
    } else if (type == "tool") {
      forced = tf.string("name", "");
      forced_any = true;
    } else if (type != "auto") {
      bad_request("tool_choice.type", "must be auto, any, tool or none");
    }
    if (forced_any)
      check_forced_call(tools, type == "tool", forced, "tool_choice.name", thinking, "disable thinking or use tool_choice auto");
  }
  r.tools = tools;
  r.gen.reasoning_first = thinking;
  // Structured output: output_config.format (Anthropic's GA form) or output_format (its beta),
  // {type: json_schema, schema}: enforced as response_format json_schema is.
  ojson schema;
  const ojson* format = nullptr;
  std::string where;
  ChatOptions co;
  co.mode = r.mode;
  if (const ojson* oc = f.get("output_config")) {
    if (!oc->is_object()) bad_request("output_config", "must be an object");
    const Fields of{*oc, "output_config."};
    format = of.get("format");
    where = "output_config.format";
    // effort: max (and xhigh) ask for V4's maximum reasoning effort, the others are its default.
    const std::string effort = of.string("effort", "");
    if (effort == "max" || effort == "xhigh") co.reasoning_effort = "max";
    else if (!effort.empty() && effort != "low" && effort != "medium" && effort != "high")
      bad_request("output_config.effort", "must be low, medium, high, xhigh or max, got '" + effort + "'");
  }
  if (const ojson* of = f.get("output_format"); of && !format) format = of, where = "output_format";
  if (format) {
    if (!format->is_object()) bad_request(where, "must be an object");
    const Fields ff{*format, where + "."};
    const std::string type = ff.string("type", "");
    if (type != "json_schema") bad_request(where + ".type", "must be json_schema, got '" + type + "'");
    const ojson* sc = ff.get("schema");
    if (!sc) bad_request(where + ".schema", "is required");
    compile_schema(r, *sc, where + ".schema");
    schema = *sc;
    json_beside_tools(r, forced_any);
  }
  ojson msgs = ojson::array();
  if (const ojson* sys = f.get("system")) msgs.push_back({{"role", "system"}, {"content", content_text(*sys, "system")}});
  const ojson* in = f.get("messages");
  if (!in || !in->is_array() || in->empty()) bad_request("messages", "must be a non-empty list");
  for (size_t i = 0; i < in->size(); ++i) {
    const ojson& m = (*in)[i];
    const std::string w = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad_request(w, "must be an object");
    const std::string role = Fields{m, w + "."}.string("role", "");
    if (role != "user" && role != "assistant" && role != "system")
      bad_request(w + ".role", "must be user, assistant or system, got '" + role + "'");
    auto c = m.find("content");
    if (c == m.end()) bad_request(w + ".content", "is required");
    // A mid-conversation system message (Claude Code sends them) is a system message where it
    // sits, rendered as the chat endpoint renders one there. Anthropic's placement: right after a
    // user turn (the top-level `system` is the place for the first one).
    if (role == "system") {
      if (i == 0 || (*in)[i - 1].value("role", "") != "user")
        bad_request(w + ".role", "a system message must follow a user message (put the first one in `system`)");
      msgs.push_back({{"role", "system"}, {"content", content_text(*c, w + ".content")}});
      continue;
    }
    if (c->is_string()) {
      msgs.push_back({{"role", role}, {"content", *c}});
      continue;
    }
    if (!c->is_array()) bad_request(w + ".content", "must be a string or a list of blocks");
    std::string text, reasoning;
    ojson calls = ojson::array();
    for (size_t k = 0; k < c->size(); ++k) {
      const ojson& b = (*c)[k];
      const std::string bw = w + ".content[" + std::to_string(k) + "]";
      if (!b.is_object()) bad_request(bw, "must be an object");
      const Fields bf{b, bw + "."};
      const std::string type = bf.string("type", "");
      if (type == "text") {
        if (!b.contains("text") || !b["text"].is_string()) bad_request(bw + ".text", "must be a string");
        text += b["text"].get<std::string>();
      } else if (type == "thinking" && role == "assistant") {
        // A block whose text was omitted carries it in its signature (thinking.display).
        const std::string t = bf.string("thinking", ""), sig = bf.string("signature", "");
        reasoning += t.empty() && sig.rfind(kReasoningSignature, 0) == 0 ? sig.substr(std::strlen(kReasoningSignature)) : t;
      } else if (type == "redacted_thinking" && role == "assistant") {
      } else if (type == "tool_use" && role == "assistant") {
        if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") || !b["name"].is_string())
          bad_request(bw, "tool_use needs id and name");
        ojson input = b.value("input", ojson::object());
        if (!input.is_object()) bad_request(bw + ".input", "must be an object");
        calls.push_back({{"id", b["id"]}, {"type", "function"}, {"function", {{"name", b["name"]}, {"arguments", input.dump()}}}});
      } else if (type == "tool_result" && role == "user") {
        ojson res = {{"role", "tool"}};
        if (b.contains("tool_use_id")) res["tool_call_id"] = b["tool_use_id"];
        const ojson rc = b.value("content", ojson(""));
        res["content"] = content_text(rc, bw + ".content");
        msgs.push_back(std::move(res));
      } else {
        bad_request(bw + ".type", "unsupported block type '" + type + "' in a " + role + " message");
      }
    }
    if (role == "user" && !text.empty()) msgs.push_back({{"role", "user"}, {"content", text}});
    if (role == "assistant") {
      ojson a = {{"role", "assistant"}, {"content", text}};
      if (!reasoning.empty()) a["reasoning_content"] = reasoning;
      if (!calls.empty()) a["tool_calls"] = calls;
      msgs.push_back(std::move(a));
    }
  }
  // The renderer's indices are of the converted list (system first, a tool_result block a
  // message of its own), not of the client's messages.
  r.prompt_text = render_messages(chat_messages(msgs, r.tools, store, schema), co,
                                  " (in the conversation as converted to OpenAI messages)");
  if (forced_any) r.forced_prefix = forced_call_prefix(forced);
  tokenize_prompt(r, model, lim, "max_tokens", max_tokens);
}

ParsedRequest parse_request(Api api, const std::string& body, const ModelFacts& model, const RequestLimits& lim,
                            const ToolCallStore* store, const ResponseStore* responses) {
  const ojson j = parse_json(body);
  ParsedRequest r;
  r.api = api;
  if (api == Api::OpenAiChat) parse_openai_chat(j, r, model, lim, store);
  if (api == Api::OpenAiCompletion) parse_openai_completion(j, r, model, lim);
  if (api == Api::OpenAiResponses) parse_openai_responses(j, r, model, lim, store, responses);
  if (api == Api::Anthropic) parse_anthropic(j, r, model, lim, store);
  return r;
}

}  // namespace dsv4::server
