#include "text/chat.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <vector>

#include "core/error.h"

namespace dsv4 {

using ojson = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// Python-compatible JSON text
// ---------------------------------------------------------------------------------------------

namespace {

void put_py_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// float.__repr__: the shortest digits that round-trip; positional notation when the decimal
// exponent e (x = d.ddd * 10^e) is in [-5, 15], else d.ddde+XX; positional always has a '.'.
void put_py_float(std::string& out, double v) {
  if (std::isnan(v)) { out += "NaN"; return; }
  if (std::isinf(v)) { out += v < 0 ? "-Infinity" : "Infinity"; return; }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // [-]d[.ddd]e(+|-)XX
  std::string sign;
  if (!sci.empty() && sci[0] == '-') { sign = "-"; sci.erase(0, 1); }
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp10 = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (char c : mant) if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  out += sign;
  const int decpt = exp10 + 1;  // x = 0.digits * 10^decpt
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (digits.size() > 1) { out += '.'; out.append(digits, 1, std::string::npos); }
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else {
    const size_t ip = static_cast<size_t>(decpt);
    if (digits.size() <= ip) {
      out += digits;
      out.append(ip - digits.size(), '0');
      out += ".0";
    } else {
      out.append(digits, 0, ip);
      out += '.';
      out.append(digits, ip, std::string::npos);
    }
  }
}

void put_py_json(std::string& out, const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null: out += "null"; break;
    case ojson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case ojson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case ojson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case ojson::value_t::number_float: put_py_float(out, v.get<double>()); break;
    case ojson::value_t::string: put_py_string(out, v.get_ref<const std::string&>()); break;
    case ojson::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        put_py_json(out, e);
      }
      out += ']';
      break;
    }
    case ojson::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        put_py_string(out, it.key());
        out += ": ";
        put_py_json(out, it.value());
      }
      out += '}';
      break;
    }
    case ojson::value_t::binary:
    case ojson::value_t::discarded:
      throw Error("chat: value cannot be written as JSON");
  }
}

}  // namespace

std::string to_python_json(const ojson& value) {
  std::string out;
  put_py_json(out, value);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------

namespace {

const std::string kBos = kBosText, kEos = kEosText, kUser = kUserText, kAssistant = kAssistantText,
                  kReminder = kLatestReminderText, kThinkStart = kThinkStartText,
                  kThinkEnd = kThinkEndText, kDsml = kDsmlText;

const std::map<std::string, std::string>& task_tokens() {
  static const std::map<std::string, std::string> m = {
      {"action", "<｜action｜>"},       {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"},       {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"},
  };
  return m;
}

const char* const kEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

std::string tools_section(const std::vector<ojson>& functions) {
  std::string schemas;
  for (size_t i = 0; i < functions.size(); ++i) {
    if (i) schemas += '\n';
    schemas += to_python_json(functions[i]);
  }
  const std::string tc = "<" + kDsml + "tool_calls>", tc_end = "</" + kDsml + "tool_calls>";
  const std::string inv_end = "</" + kDsml + "invoke>";
  std::string s;
  s += "## Tools\n\n";
  s += "You have access to a set of tools to help answer the user's question. You can invoke "
       "tools by writing a \"" + tc + "\" block like the following:\n\n";
  s += tc + "\n";
  s += "<" + kDsml + "invoke name=\"$TOOL_NAME\">\n";
  s += "<" + kDsml + "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" +
       kDsml + "parameter>\n";
  s += "...\n" + inv_end + "\n";
  s += "<" + kDsml + "invoke name=\"$TOOL_NAME2\">\n";
  s += "...\n" + inv_end + "\n";
  s += tc_end + "\n\n";
  s += "String parameters should be specified as is and set `string=\"true\"`. For all other "
       "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
       "`string=\"false\"`.\n\n";
  s += "If thinking_mode is enabled (triggered by " + kThinkStart + "), you MUST output your "
       "complete reasoning inside " + kThinkStart + "..." + kThinkEnd +
       " BEFORE any tool calls or final response.\n\n";
  s += "Otherwise, output directly after " + kThinkEnd + " with tool calls or final response.\n\n";
  s += "### Available Tool Schemas\n\n";
  s += schemas;
  s += "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
       "tool calls.\n";
  return s;
}

std::string response_format_section(const ojson& rf) {
  return "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
         to_python_json(rf);
}

bool truthy(const ojson& j) {
  switch (j.type()) {
    case ojson::value_t::null: return false;
    case ojson::value_t::boolean: return j.get<bool>();
    case ojson::value_t::number_integer: return j.get<int64_t>() != 0;
    case ojson::value_t::number_unsigned: return j.get<uint64_t>() != 0;
    case ojson::value_t::number_float: return j.get<double>() != 0.0;
    case ojson::value_t::string: return !j.get_ref<const std::string&>().empty();
    case ojson::value_t::array:
    case ojson::value_t::object: return !j.empty();
    default: return true;
  }
}

// A tool-call / tool-result id as a map key: strings as they are, other values by their JSON.
std::string id_key(const ojson& j) {
  if (j.is_string()) return j.get<std::string>();
  return "\x01" + j.dump();
}

struct Block {
  bool tool_result = false;
  std::string text;    // text block: the text; tool result: the rendered content
  std::string use_id;  // tool result: id_key(tool_call_id)
};

struct ToolCall {
  std::string name, dsml_args;
  std::optional<std::string> dsml;  // the exact invoke text ("dsml"), written instead
  std::optional<std::string> id;  // id_key of a truthy id
};

struct Msg {
  std::string role;
  std::optional<std::string> content;  // absent or null -> nullopt
  std::vector<ojson> tools;            // function objects; empty when tools is falsy
  bool has_tools = false;              // truthy `tools` (decides whether reasoning is dropped)
  std::optional<ojson> response_format;  // truthy only
  std::vector<ToolCall> tool_calls;
  std::optional<std::string> reasoning;
  bool wo_eos = false;
  std::optional<std::string> task;
  bool has_blocks = false;  // user turns (always, after merging)
  std::vector<Block> blocks;
};

class Where {
 public:
  Where(const char* list, size_t index) : base_(std::string(list) + "[" + std::to_string(index) + "]") {}
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error("chat: " + base_ + (field.empty() ? "" : "." + field) + ": " + what);
  }

 private:
  std::string base_;
};

std::optional<std::string> opt_string(const ojson& m, const char* key, const Where& w) {
  auto it = m.find(key);
  if (it == m.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) w.fail(key, "must be a string, got " + std::string(it->type_name()));
  return it->get<std::string>();
}

// The arguments of one call as an object. Arguments that are not JSON become one string
// parameter named "arguments".
ojson arguments_object(const ojson& args, const Where& w, const std::string& field) {
  ojson parsed;
  if (args.is_string()) {
    parsed = ojson::parse(args.get<std::string>(), nullptr, false);
    if (parsed.is_discarded()) {
      parsed = ojson::object();
      parsed["arguments"] = args;
    } else if (!parsed.is_object()) {
      w.fail(field, "must encode a JSON object, got " + std::string(parsed.type_name()));
    }
  } else if (args.is_object()) {
    parsed = args;
  } else {
    w.fail(field, "must be a JSON string (or an object)");
  }
  return parsed;
}

// The DSML parameter lines of one call: one line per argument; strings as they are
// (string="true"), everything else as JSON (string="false").
std::string encode_arguments(const ojson& parsed) {
  std::string out;
  bool first = true;
  for (auto it = parsed.begin(); it != parsed.end(); ++it) {
    if (!first) out += '\n';
    first = false;
    const bool is_str = it.value().is_string();
    out += "<" + kDsml + "parameter name=\"" + it.key() + "\" string=\"" + (is_str ? "true" : "false") +
           "\">";
    out += is_str ? it.value().get<std::string>() : to_python_json(it.value());
    out += "</" + kDsml + "parameter>";
  }
  return out;
}

// One DSML invoke as written: the tool's name and each parameter's name, value text and
// string="true" flag, in order.
struct DsmlParam {
  std::string name, value;
  bool is_string = false;
};
struct DsmlCall {
  std::string name;
  std::vector<DsmlParam> params;
};
std::vector<DsmlCall> parse_dsml_calls(const std::string& text, size_t& pos);  // Decoding, below

// A tool call's "dsml" (the exact text the model wrote for it, CompletionStream's tool_call_dsml):
// one well-formed invoke with the call's name and arguments, else rendering it would contradict
// the call. The server typed the arguments by the tool's schema (tool_schema.h), which this
// message does not carry: each value the client sent back must be the written value either as
// written or typed to the value's own type.
void check_dsml(const std::string& dsml, const std::string& name, const ojson& args, const Where& w,
                const std::string& field) {
  const std::string text = ">\n" + dsml + "\n</" + kDsml + "tool_calls>";
  size_t pos = 0;
  std::vector<DsmlCall> calls;
  try {
    calls = parse_dsml_calls(text, pos);
  } catch (const Error& e) {
    w.fail(field, std::string("not a DSML invoke: ") + e.what());
  }
  if (calls.size() != 1 || pos != text.size()) w.fail(field, "must hold exactly one DSML invoke");
  if (calls[0].name != name) w.fail(field, "names tool '" + calls[0].name + "', the call '" + name + "'");
  const auto differ = [&] { w.fail(field, "its arguments differ from the call's"); };
  if (!args.is_object() || args.size() != calls[0].params.size()) differ();
  // Compared as JSON values (key order and number spelling aside).
  const auto same = [](const std::string& json_text, const ojson& v) {
    const ojson p = ojson::parse(json_text, nullptr, false);
    return !p.is_discarded() && nlohmann::json(p) == nlohmann::json(v);
  };
  for (const DsmlParam& p : calls[0].params) {
    const auto v = args.find(p.name);
    if (v == args.end()) differ();
    if (!same(typed_argument(p.value, p.is_string, {}), *v) &&
        !same(typed_argument(p.value, p.is_string, {json_type_of(*v)}), *v))
      differ();
  }
}

std::string tool_result_text(const ojson& m, const Where& w) {
  auto it = m.find("content");
  if (it == m.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    std::string out;
    for (size_t k = 0; k < it->size(); ++k) {
      const ojson& b = (*it)[k];
      if (!b.is_object()) w.fail("content[" + std::to_string(k) + "]", "must be an object");
      if (k) out += "\n\n";
      auto ty = b.find("type");
      if (ty != b.end() && ty->is_string() && ty->get<std::string>() == "text") {
        auto tx = b.find("text");
        if (tx == b.end()) continue;
        if (!tx->is_string()) w.fail("content[" + std::to_string(k) + "].text", "must be a string");
        out += tx->get<std::string>();
      } else {
        std::string tname = ty == b.end() || ty->is_null() ? "None"
                            : ty->is_string()               ? ty->get<std::string>()
                                                            : ty->dump();
        out += "[Unsupported " + tname + "]";
      }
    }
    return out;
  }
  w.fail("content", "must be a string or a list of content blocks");
}

// Checks one input message and converts it; `tool` messages become a tool-result block.
Msg convert(const ojson& m, const Where& w) {
  if (!m.is_object()) w.fail("", "must be an object");
  Msg out;
  auto r = m.find("role");
  if (r == m.end() || !r->is_string()) w.fail("role", "missing or not a string");
  out.role = r->get<std::string>();
  static const char* const kRoles[] = {"system", "developer", "user", "assistant", "tool",
                                       "latest_reminder"};
  if (std::find_if(std::begin(kRoles), std::end(kRoles),
                   [&](const char* k) { return out.role == k; }) == std::end(kRoles))
    w.fail("role", "unknown role '" + out.role + "'");

  if (auto t = m.find("task"); t != m.end() && !t->is_null()) {
    if (!t->is_string() || !task_tokens().count(t->get<std::string>()))
      w.fail("task", "invalid task " + t->dump() +
                         " (valid: action, query, authority, domain, title, read_url)");
    out.task = t->get<std::string>();
  }
  if (auto e = m.find("wo_eos"); e != m.end()) out.wo_eos = truthy(*e);

  if (out.role == "tool") {
    if (auto c = m.find("content"); c != m.end() && c->is_null()) w.fail("content", "must not be null");
    Block b;
    b.tool_result = true;
    b.text = "<tool_result>" + tool_result_text(m, w) + "</tool_result>";
    auto id = m.find("tool_call_id");
    b.use_id = id == m.end() ? std::string() : id_key(*id);
    out.has_blocks = true;
    out.blocks.push_back(std::move(b));
    return out;
  }

  out.content = opt_string(m, "content", w);
  if (out.role == "user") {
    // The official encoder keeps only content (and task / wo_eos) of a user message.
    if (auto c = m.find("content"); c != m.end() && c->is_null()) w.fail("content", "must not be null");
    out.has_blocks = true;
    out.blocks.push_back(Block{false, out.content.value_or(""), {}});
    return out;
  }
  if (out.role == "developer" && (!out.content || out.content->empty()))
    w.fail("content", "a developer message needs a non-empty content");
  if (out.role == "latest_reminder" && !out.content) w.fail("content", "missing");

  if (auto t = m.find("tools"); t != m.end() && truthy(*t)) {
    if (!t->is_array()) w.fail("tools", "must be a list");
    for (size_t k = 0; k < t->size(); ++k) {
      const ojson& tool = (*t)[k];
      const std::string f = "tools[" + std::to_string(k) + "]";
      if (!tool.is_object()) w.fail(f, "must be an object");
      auto fn = tool.find("function");
      if (fn == tool.end() || !fn->is_object()) w.fail(f + ".function", "missing or not an object");
      out.tools.push_back(*fn);
    }
    out.has_tools = true;
  }
  if (auto rf = m.find("response_format"); rf != m.end() && truthy(*rf)) out.response_format = *rf;

  if (out.role == "assistant") {
    out.reasoning = opt_string(m, "reasoning_content", w);
    if (auto tcs = m.find("tool_calls"); tcs != m.end() && truthy(*tcs)) {
      if (!tcs->is_array()) w.fail("tool_calls", "must be a list");
      for (size_t k = 0; k < tcs->size(); ++k) {
        const ojson& tc = (*tcs)[k];
        const std::string f = "tool_calls[" + std::to_string(k) + "]";
        if (!tc.is_object()) w.fail(f, "must be an object");
        auto fn = tc.find("function");
        if (fn == tc.end() || !fn->is_object()) w.fail(f + ".function", "missing or not an object");
        auto name = fn->find("name");
        if (name == fn->end() || !name->is_string())
          w.fail(f + ".function.name", "missing or not a string");
        auto args = fn->find("arguments");
        if (args == fn->end()) w.fail(f + ".function.arguments", "missing");
        ToolCall call;
        call.name = name->get<std::string>();
        const ojson args_object = arguments_object(*args, w, f + ".function.arguments");
        call.dsml_args = encode_arguments(args_object);
        if (auto d = tc.find("dsml"); d != tc.end() && !d->is_null()) {
          if (!d->is_string()) w.fail(f + ".dsml", "must be a string");
          call.dsml = d->get<std::string>();
          check_dsml(*call.dsml, call.name, args_object, w, f + ".dsml");
        }
        // The id is the call's "id", else the function's "id" (first truthy one).
        auto id = tc.find("id");
        if (id != tc.end() && truthy(*id)) {
          call.id = id_key(*id);
        } else if (auto fid = fn->find("id"); fid != fn->end() && truthy(*fid)) {
          call.id = id_key(*fid);
        }
        out.tool_calls.push_back(std::move(call));
      }
    }
  }
  return out;
}

std::vector<Msg> convert_all(const ojson& list, const char* name) {
  if (!list.is_array()) throw Error(std::string("chat: ") + name + " must be a JSON list of messages");
  std::vector<Msg> out;
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) out.push_back(convert(list[i], Where(name, i)));
  return out;
}

// Tool results join the user turn before them (or open one); a user message joins such a
// turn too, unless that turn carries a task.
std::vector<Msg> merge_tool_messages(std::vector<Msg> in) {
  std::vector<Msg> merged;
  for (auto& m : in) {
    const bool prev_user = !merged.empty() && merged.back().role == "user" && merged.back().has_blocks;
    if (m.role == "tool") {
      if (prev_user) {
        merged.back().blocks.push_back(std::move(m.blocks[0]));
      } else {
        Msg u;
        u.role = "user";
        u.has_blocks = true;
        u.blocks = std::move(m.blocks);
        merged.push_back(std::move(u));
      }
    } else if (m.role == "user") {
      if (prev_user && !merged.back().task) {
        merged.back().blocks.push_back(std::move(m.blocks[0]));
      } else {
        merged.push_back(std::move(m));
      }
    } else {
      merged.push_back(std::move(m));
    }
  }
  return merged;
}

// Tool results of a user turn follow the order of the calls of the last assistant turn that made
// calls; results with an unknown id sort as if they were the first call (stable).
void sort_tool_results(std::vector<Msg*>& msgs) {
  std::map<std::string, size_t> order;
  for (Msg* m : msgs) {
    if (m->role == "assistant" && !m->tool_calls.empty()) {
      order.clear();
      for (size_t k = 0; k < m->tool_calls.size(); ++k)
        if (m->tool_calls[k].id) order[*m->tool_calls[k].id] = k;
    } else if (m->role == "user" && m->has_blocks) {
      std::vector<Block> results;
      for (const auto& b : m->blocks)
        if (b.tool_result) results.push_back(b);
      if (results.size() <= 1 || order.empty()) continue;
      auto rank = [&](const Block& b) {
        auto it = order.find(b.use_id);
        return it == order.end() ? size_t{0} : it->second;
      };
      std::stable_sort(results.begin(), results.end(),
                       [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      size_t k = 0;
      for (auto& b : m->blocks)
        if (b.tool_result) b = results[k++];
    }
  }
}

long last_user_index(const std::vector<Msg>& msgs) {
  for (long i = static_cast<long>(msgs.size()) - 1; i >= 0; --i)
    if (msgs[i].role == "user" || msgs[i].role == "developer") return i;
  return -1;
}

// Before the last user/developer turn: assistant turns lose their reasoning and developer turns
// are removed altogether.
std::vector<Msg> drop_thinking_messages(const std::vector<Msg>& msgs) {
  const long last = last_user_index(msgs);
  std::vector<Msg> out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Msg& m = msgs[i];
    if (m.role != "assistant" && m.role != "developer") {
      out.push_back(m);
    } else if (static_cast<long>(i) >= last) {
      out.push_back(m);
    } else if (m.role == "assistant") {
      Msg c = m;
      c.reasoning.reset();
      out.push_back(std::move(c));
    }
  }
  return out;
}

struct RenderFlags {
  bool thinking;
  bool drop_thinking;
  bool effort_max;
  bool generation_prompt;  // the suffix after the last message
};

// A system message after a user (or developer) turn, with only system messages between: the
// official encoder writes no assistant opener after it, so [user, system] would end the prompt
// without `<｜Assistant｜>` (and a following assistant turn would start inside the system text).
// Such a message closes the user turn instead (clients send them: Anthropic's mid-conversation
// system messages, trailing reminders).
bool closes_user_turn(size_t index, const std::vector<Msg>& msgs) {
  if (msgs[index].role != "system") return false;
  for (size_t k = index; k-- > 0;) {
    if (msgs[k].role == "system") continue;
    return msgs[k].role == "user" || msgs[k].role == "developer";
  }
  return false;
}

std::string render_message(size_t index, const std::vector<Msg>& msgs, const RenderFlags& f) {
  std::string p;
  const Msg& m = msgs[index];
  const long last_user = last_user_index(msgs);

  if (index == 0 && f.thinking && f.effort_max) p += kEffortMax;

  if (m.role == "system") {
    p += m.content.value_or("");
    if (!m.tools.empty()) p += "\n\n" + tools_section(m.tools);
    if (m.response_format) p += "\n\n" + response_format_section(*m.response_format);
  } else if (m.role == "developer") {
    p += kUser + *m.content;
    if (!m.tools.empty()) p += "\n\n" + tools_section(m.tools);
    if (m.response_format) p += "\n\n" + response_format_section(*m.response_format);
  } else if (m.role == "user") {
    p += kUser;
    for (size_t k = 0; k < m.blocks.size(); ++k) {
      if (k) p += "\n\n";
      p += m.blocks[k].text;
    }
  } else if (m.role == "latest_reminder") {
    p += kReminder + *m.content;
  } else if (m.role == "assistant") {
    std::string tc;
    if (!m.tool_calls.empty()) {
      tc = "\n\n<" + kDsml + "tool_calls>\n";
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        if (k) tc += '\n';
        if (m.tool_calls[k].dsml) {
          tc += *m.tool_calls[k].dsml;
        } else {
          tc += "<" + kDsml + "invoke name=\"" + m.tool_calls[k].name + "\">\n" + m.tool_calls[k].dsml_args +
                "\n</" + kDsml + "invoke>";
        }
      }
      tc += "\n</" + kDsml + "tool_calls>";
    }
    const bool prev_has_task = index > 0 && msgs[index - 1].task.has_value();
    std::string thinking;
    if (f.thinking && !prev_has_task && (!f.drop_thinking || static_cast<long>(index) > last_user))
      thinking = m.reasoning.value_or("") + kThinkEnd;
    p += thinking + m.content.value_or("") + tc;
    if (!m.wo_eos) p += kEos;
  }

  // What follows the message: nothing unless the next one is an assistant or latest_reminder
  // turn (or this is the last message); then the task token(s), or after a user/developer turn
  // the assistant opener.
  if (index + 1 < msgs.size()) {
    const std::string& next = msgs[index + 1].role;
    if (next != "assistant" && next != "latest_reminder") return p;
  } else if (!f.generation_prompt) {
    return p;
  }
  if (m.task) {
    const std::string& tok = task_tokens().at(*m.task);
    if (*m.task != "action") {
      p += tok;
    } else {
      p += kAssistant + (f.thinking ? kThinkStart : kThinkEnd) + tok;
    }
  } else if (m.role == "user" || m.role == "developer" || closes_user_turn(index, msgs)) {
    p += kAssistant;
    if (f.thinking && (!f.drop_thinking || static_cast<long>(index) >= last_user))
      p += kThinkStart;
    else
      p += kThinkEnd;
  }
  return p;
}

}  // namespace

bool valid_reasoning_effort(const std::string& e) { return e.empty() || e == "high" || e == "max"; }

std::string render_chat(const ojson& messages, const ChatOptions& opt) {
  const bool thinking = opt.mode == ChatMode::Thinking;
  if (!valid_reasoning_effort(opt.reasoning_effort))
    throw Error("chat: reasoning_effort: invalid value '" + opt.reasoning_effort +
                "' (valid: \"\", \"high\", \"max\")");

  std::vector<Msg> msgs = merge_tool_messages(convert_all(messages, "messages"));
  std::vector<Msg> ctx_raw = convert_all(opt.context, "context");
  // Tool results of the new messages are ordered by calls that may sit in the context (the
  // context is not merged yet at that point, as in the official encoder).
  {
    std::vector<Msg*> all;
    for (auto& m : ctx_raw) all.push_back(&m);
    for (auto& m : msgs) all.push_back(&m);
    sort_tool_results(all);
  }
  std::vector<Msg> ctx = merge_tool_messages(std::move(ctx_raw));
  {
    std::vector<Msg*> all;
    for (auto& m : ctx) all.push_back(&m);
    sort_tool_results(all);
  }

  std::vector<Msg> full = ctx;
  full.insert(full.end(), msgs.begin(), msgs.end());

  std::string prompt = opt.add_bos && ctx.empty() ? kBos : std::string();

  bool drop = opt.drop_thinking;
  if (std::any_of(full.begin(), full.end(), [](const Msg& m) { return m.has_tools; })) drop = false;

  size_t num_to_render, context_len;
  if (thinking && drop) {
    full = drop_thinking_messages(full);
    num_to_render = full.size() - drop_thinking_messages(ctx).size();
    context_len = full.size() - num_to_render;
  } else {
    num_to_render = msgs.size();
    context_len = ctx.size();
  }

  RenderFlags f{thinking, drop, opt.reasoning_effort == "max", opt.add_generation_prompt};
  for (size_t i = 0; i < num_to_render; ++i) prompt += render_message(context_len + i, full, f);
  return prompt;
}

std::string render_chat(const nlohmann::json& messages, const ChatOptions& opt) {
  return render_chat(ojson(messages), opt);
}

// ---------------------------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------------------------

namespace {

[[noreturn]] void parse_fail(const std::string& what) {
  throw Error("chat: completion: " + what);
}

// Reads from `pos` up to the earliest of `stops`: returns the text before it and which stop
// matched (-1: none, the text runs to the end); `pos` moves past the stop.
int read_until(const std::string& text, size_t& pos, const std::vector<std::string>& stops,
               std::string& before) {
  size_t best = std::string::npos;
  int which = -1;
  for (size_t k = 0; k < stops.size(); ++k) {
    size_t at = text.find(stops[k], pos);
    if (at != std::string::npos && (best == std::string::npos || at < best)) {
      best = at;
      which = static_cast<int>(k);
    }
  }
  if (which < 0) {
    before = text.substr(pos);
    pos = text.size();
  } else {
    before = text.substr(pos, best - pos);
    pos = best + stops[which].size();
  }
  return which;
}

// `s` ends with `tail`, or with `tail` + "\n" (a Python regex `$` also matches before a final
// newline). Returns the length of `s` before the tail, or npos.
size_t tail_at(const std::string& s, const std::string& tail) {
  if (s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0)
    return s.size() - tail.size();
  if (s.size() >= tail.size() + 1 && s.back() == '\n' &&
      s.compare(s.size() - 1 - tail.size(), tail.size(), tail) == 0)
    return s.size() - 1 - tail.size();
  return std::string::npos;
}

// ` name="NAME">\n` (leading whitespace allowed).
std::string parse_invoke_name(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  const std::string open = "name=\"";
  if (s.compare(i, open.size(), open) != 0) parse_fail("tool name format error: '" + s + "'");
  const size_t start = i + open.size();
  // Non-greedy name: the first `">\n` from which the rest of the string is the tail.
  for (size_t at = s.find("\">\n", start); at != std::string::npos; at = s.find("\">\n", at + 1)) {
    const std::string rest = s.substr(at);
    if (rest == "\">\n" || rest == "\">\n\n") {
      if (at == start) parse_fail("empty tool name");
      return s.substr(start, at - start);
    }
  }
  parse_fail("tool name format error: '" + s + "'");
}

// ` name="K" string="true|false">VALUE<`.
void parse_parameter(const std::string& s, std::string& name, bool& is_string, std::string& value) {
  const std::string open = " name=\"";
  const size_t end = tail_at(s, "<");
  if (s.compare(0, open.size(), open) != 0 || end == std::string::npos)
    parse_fail("parameter format error: '" + s + "'");
  for (size_t at = s.find("\" string=\"", open.size()); at != std::string::npos;
       at = s.find("\" string=\"", at + 1)) {
    const size_t v = at + 10;
    for (const char* flag : {"true\">", "false\">"}) {
      const std::string fl = flag;
      if (s.compare(v, fl.size(), fl) == 0 && v + fl.size() <= end) {
        name = s.substr(open.size(), at - open.size());
        is_string = fl[0] == 't';
        value = s.substr(v + fl.size(), end - (v + fl.size()));
        return;
      }
    }
  }
  parse_fail("parameter format error: '" + s + "'");
}

// The invokes of a tool-call block as written; `pos` is just after "\n\n<｜DSML｜tool_calls".
std::vector<DsmlCall> parse_dsml_calls(const std::string& text, size_t& pos) {
  const std::string invoke = "<" + kDsml + "invoke", calls_end = "</" + kDsml + "tool_calls>";
  const std::string param = "<" + kDsml + "parameter", param_end = "/" + kDsml + "parameter",
                    invoke_end = "</" + kDsml + "invoke";
  std::vector<DsmlCall> calls;
  std::string chunk;
  while (pos < text.size()) {
    int s = read_until(text, pos, {invoke, calls_end}, chunk);
    if (chunk != ">\n") parse_fail("tool call format error: expected '>\\n' but got '" + chunk + "'");
    if (s == 1) break;
    if (s < 0) parse_fail("missing special token in tool calls");

    s = read_until(text, pos, {param, invoke_end}, chunk);
    DsmlCall call;
    call.name = parse_invoke_name(chunk);
    while (s == 0) {
      read_until(text, pos, {param_end}, chunk);
      DsmlParam p;
      parse_parameter(chunk, p.name, p.is_string, p.value);
      for (const auto& a : call.params)
        if (a.name == p.name) parse_fail("duplicate parameter name: '" + p.name + "'");
      call.params.push_back(std::move(p));
      s = read_until(text, pos, {param, invoke_end}, chunk);
      if (chunk != ">\n") parse_fail("parameter format error: expected '>\\n' but got '" + chunk + "'");
    }
    calls.push_back(std::move(call));
  }
  return calls;
}

// The calls in OpenAI format. The arguments JSON as the official decoder writes it: string
// values JSON-quoted, others verbatim, except that a string="false" value that is not JSON is
// quoted as a string too (the official decoder writes it verbatim: invalid JSON arguments); then
// typed by the tool's schema when there is one (tool_schema.h).
ojson tool_calls_json(const std::vector<DsmlCall>& calls, const ToolSchemas& tools) {
  ojson out = ojson::array();
  for (const DsmlCall& c : calls) {
    std::string json = "{";
    for (size_t k = 0; k < c.params.size(); ++k) {
      const DsmlParam& p = c.params[k];
      if (k) json += ", ";
      json += to_python_json(p.name) + ": " + typed_argument(p.value, p.is_string, tools.types(c.name, p.name));
    }
    json += "}";
    ojson call = ojson::object();
    call["type"] = "function";
    call["function"] = ojson::object();
    call["function"]["name"] = c.name;
    call["function"]["arguments"] = json;
    out.push_back(std::move(call));
  }
  return out;
}

}  // namespace

ParsedCompletion parse_completion(const std::string& text, ChatMode mode, const ToolSchemas& tools) {
  ParsedCompletion out;
  const std::string calls_start = "\n\n<" + kDsml + "tool_calls";
  size_t pos = 0;
  std::string chunk;
  if (mode == ChatMode::Thinking) {
    const int s = read_until(text, pos, {kThinkEnd, calls_start}, chunk);
    if (s != 0) parse_fail("thinking mode text without '</think>' before the answer");
    out.reasoning_content = chunk;
  }
  const int s = read_until(text, pos, {kEos, calls_start}, chunk);
  out.content = chunk;
  if (s == 1) {
    out.tool_calls = tool_calls_json(parse_dsml_calls(text, pos), tools);
    read_until(text, pos, {kEos}, chunk);
    if (!chunk.empty()) parse_fail("unexpected text after the tool calls: '" + chunk + "'");
  }
  if (pos != text.size()) parse_fail("unexpected text after the end of sentence");
  for (const std::string* sp : {&kBos, &kEos, &kThinkStart, &kThinkEnd, &kDsml}) {
    if (out.content.find(*sp) != std::string::npos || out.reasoning_content.find(*sp) != std::string::npos)
      parse_fail("unexpected special token '" + *sp + "' in the content");
  }
  return out;
}

}  // namespace dsv4
