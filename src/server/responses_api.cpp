#include "server/responses_api.h"

#include <algorithm>
#include <set>

#include "server/choice_text.h"
#include "server/request_parts.h"
#include "text/json_grammar.h"

namespace dsv4::server {

using ojson = nlohmann::ordered_json;
using Kind = CompletionEvent::Kind;

namespace {

// The text parts a Responses message may hold: what a client writes and what this server
// returned (an assistant turn sent back as it came).
const std::vector<std::string> kTextParts = {"input_text", "output_text", "text"};

// Input items -> chat messages, appended to `out` (which may hold earlier turns already).
// Function calls join the assistant message before them (one turn: its text, then its calls);
// a reasoning item gives its text to the assistant message or calls that follow it.
void convert_input(const ojson& input, ojson& out) {
  if (input.is_string()) {
    out.push_back({{"role", "user"}, {"content", input}});
    return;
  }
  if (!input.is_array()) bad_request("input", std::string("must be a string or a list of items, got ") + type_of(input));
  std::string reasoning;  // from a reasoning item, for the assistant turn that follows
  bool have_reasoning = false;
  auto assistant_turn = [&](bool join_last) -> ojson& {
    if (!(join_last && !out.empty() && out.back()["role"] == "assistant")) out.push_back({{"role", "assistant"}});
    ojson& a = out.back();
    if (have_reasoning) a["reasoning_content"] = reasoning, reasoning.clear(), have_reasoning = false;
    return a;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string w = "input[" + std::to_string(i) + "]";
    const ojson& item = input[i];
    if (!item.is_object()) bad_request(w, std::string("must be an object, got ") + type_of(item));
    const Fields f{item, w + "."};
    const std::string type = f.string("type", "message");
    if (type == "message") {
      const std::string role = f.string("role", "");
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        bad_request(w + ".role", "must be user, system, developer or assistant, got '" + role + "'");
      const ojson* c = f.get("content");
      if (!c) bad_request(w + ".content", "is required");
      const std::string text = content_text(*c, w + ".content", kTextParts);
      if (role == "assistant") {
        assistant_turn(false)["content"] = text;
      } else {
        out.push_back({{"role", role}, {"content", text}});
      }
    } else if (type == "reasoning") {
      // The reasoning as written: its content (what this server returns), else what was put in
      // encrypted_content for a client that keeps only that, else the summary.
      const ojson* content = f.get("content");
      std::string text = content ? content_text(*content, w + ".content", {"reasoning_text"}) : "";
      if (text.empty()) text = f.string("encrypted_content", "");
      const ojson* summary = f.get("summary");
      if (text.empty() && summary) text = content_text(*summary, w + ".summary", {"summary_text"});
      reasoning += text;
      have_reasoning = true;
    } else if (type == "function_call") {
      const std::string call_id = f.string("call_id", ""), name = f.string("name", "");
      if (call_id.empty()) bad_request(w + ".call_id", "is required");
      if (name.empty()) bad_request(w + ".name", "is required");
      if (!f.get("arguments")) bad_request(w + ".arguments", "is required (a JSON object text)");
      const std::string ns = f.string("namespace", "");
      ojson& a = assistant_turn(true);
      if (!a.contains("tool_calls")) a["tool_calls"] = ojson::array();
      a["tool_calls"].push_back({{"id", call_id},
                                 {"type", "function"},
                                 {"function", {{"name", ns.empty() ? name : namespaced_tool(ns, name)}, {"arguments", f.string("arguments", "")}}}});
    } else if (type == "function_call_output") {
      const std::string call_id = f.string("call_id", "");
      if (call_id.empty()) bad_request(w + ".call_id", "is required");
      const ojson* o = f.get("output");
      if (!o) bad_request(w + ".output", "is required");
      out.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", content_text(*o, w + ".output", kTextParts)}});
    } else {
      bad_request(w + ".type", "unsupported input item '" + type +
                                   "' (this server takes message, reasoning, function_call and function_call_output items)");
    }
  }
}

// The input's items as GET /v1/responses/{id}/input_items lists them, appended to `out`: each
// with its id (as sent, else a new one) and a status; a message's text as content parts. Runs
// after convert_input, which has checked them.
void append_input_items(const ojson& input, ojson& out) {
  auto parts = [](const ojson& c, bool assistant) {
    if (!c.is_string()) return c;
    ojson p = {{"type", assistant ? "output_text" : "input_text"}, {"text", c}};
    if (assistant) p["annotations"] = ojson::array();
    return ojson::array({p});
  };
  if (input.is_string()) {
    out.push_back({{"id", ToolCallStore::new_id("msg_")}, {"type", "message"}, {"role", "user"},
                   {"content", parts(input, false)}, {"status", "completed"}});
    return;
  }
  for (const ojson& item : input) {
    const std::string type = item.value("type", "message");
    const ojson* id = item.contains("id") && item["id"].is_string() && !item["id"].get<std::string>().empty() ? &item["id"] : nullptr;
    ojson o = {{"id", id ? *id
                         : ojson(ToolCallStore::new_id(type == "message"         ? "msg_"
                                                       : type == "reasoning"     ? "rs_"
                                                       : type == "function_call" ? "fc_"
                                                                                 : "fco_"))},
               {"type", type}};
    for (const auto& [k, v] : item.items())
      if (k != "id" && k != "type") o[k] = v;
    if (type == "message") o["content"] = parts(o["content"], o["role"] == "assistant");
    if (type != "reasoning" && !o.contains("status")) o["status"] = "completed";
    out.push_back(std::move(o));
  }
}

// One function tool ({type: function, name, description, parameters, strict}) as a chat tool,
// named `prefix` + its name, its description after `intro` (a namespace's).
ojson convert_function(const ojson& tool, const std::string& w, const std::string& prefix, const std::string& intro) {
  const Fields f{tool, w + "."};
  const std::string name = f.string("name", "");
  if (name.empty()) bad_request(w + ".name", "must be a non-empty string");
  ojson fn = {{"name", prefix + name}};
  const std::string description = f.string("description", "");
  if (!intro.empty() || f.get("description")) fn["description"] = intro.empty() ? description : intro + "\n\n" + description;
  if (const ojson* p = f.get("parameters"); p && !p->is_null()) {
    if (!p->is_object()) bad_request(w + ".parameters", "must be an object (a JSON Schema)");
    fn["parameters"] = *p;
  }
  return {{"type", "function"}, {"function", fn}};
}

// Responses tools -> chat tools: function tools, and the functions of namespace tools ({type:
// namespace, name, description, tools: [function, ...]}, which Codex sends) named
// NAMESPACE__NAME, recorded in r.tool_namespaces. Web search is left out: Codex offers it with
// every request, and this server cannot search (the model is not told of it). Other hosted
// and custom tools are refused.
ojson convert_tools(const ojson& tools, ParsedRequest& r) {
  if (!tools.is_array()) bad_request("tools", std::string("must be a list, got ") + type_of(tools));
  ojson out = ojson::array();
  std::set<std::string> names;
  auto add = [&](ojson t, const std::string& w) {
    if (!names.insert(t["function"]["name"].get<std::string>()).second)
      bad_request(w + ".name", "another tool has the name '" + t["function"]["name"].get<std::string>() +
                                   "' (a namespace's functions are named NAMESPACE__NAME)");
    out.push_back(std::move(t));
  };
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string w = "tools[" + std::to_string(i) + "]";
    if (!tools[i].is_object()) bad_request(w, "must be an object");
    const Fields f{tools[i], w + "."};
    const std::string type = f.string("type", "");
    if (type == "function") {
      add(convert_function(tools[i], w, "", ""), w);
    } else if (type == "namespace") {
      const std::string ns = f.string("name", "");
      if (ns.empty()) bad_request(w + ".name", "must be a non-empty string");
      const ojson* fns = f.get("tools");
      if (!fns || !fns->is_array()) bad_request(w + ".tools", "must be a list of function tools");
      for (size_t k = 0; k < fns->size(); ++k) {
        const std::string wk = w + ".tools[" + std::to_string(k) + "]";
        if (!(*fns)[k].is_object()) bad_request(wk, "must be an object");
        const std::string t = Fields{(*fns)[k], wk + "."}.string("type", "");
        if (t != "function") bad_request(wk + ".type", "only function tools are supported in a namespace, got '" + t + "'");
        ojson fn = convert_function((*fns)[k], wk, namespaced_tool(ns, ""), f.string("description", ""));
        r.tool_namespaces[fn["function"]["name"].get<std::string>()] = {ns, Fields{(*fns)[k], wk + "."}.string("name", "")};
        add(std::move(fn), wk);
      }
    } else if (type.rfind("web_search", 0) != 0) {
      bad_request(w + ".type", "only function and namespace tools are supported (web_search is left out), got '" + type + "'");
    }
  }
  return out;
}

}  // namespace

void parse_openai_responses(const ojson& j, ParsedRequest& r, const ModelFacts& model, const RequestLimits& lim,
                            const ToolCallStore* calls, const ResponseStore* kept) {
  const Fields f{j, ""};
  r.model = f.string("model", "");
  r.stream = f.boolean("stream", false);
  read_sampling(f, r);  // temperature and top_p, and vLLM's extensions (top_k, min_p, seed, stop, ...)
  if (r.gen.n != 1) bad_request("n", "the Responses API answers one choice per request");
  read_logit_bias(f, r, model.vocab);
  // What this server cannot do is refused, not ignored.
  if (f.boolean("background", false)) bad_request("background", "background responses are not supported");
  if (f.get("conversation")) bad_request("conversation", "the Conversations API is not supported; use previous_response_id or send the input");
  if (f.get("prompt")) bad_request("prompt", "prompt templates are not supported");
  // Log-probabilities of the answer's text: include "message.output_text.logprobs", with
  // top_logprobs alternatives per token (which alone asks for them too).
  const int64_t top = f.integer("top_logprobs", 0, 0, 20);
  r.logprobs = top > 0;
  const std::string truncation = f.string("truncation", "disabled");
  if (truncation != "disabled") bad_request("truncation", "only 'disabled' is supported, got '" + truncation + "'");
  if (const ojson* inc = f.get("include")) {
    if (!inc->is_array()) bad_request("include", "must be a list");
    for (size_t i = 0; i < inc->size(); ++i) {
      if (!(*inc)[i].is_string()) bad_request("include[" + std::to_string(i) + "]", "must be a string");
      const std::string v = (*inc)[i].get<std::string>();
      if (v == "reasoning.encrypted_content") r.reasoning_in_encrypted_content = true;
      if (v == "message.output_text.logprobs") r.logprobs = true;
    }
  }
  r.gen.top_logprobs = r.logprobs ? static_cast<int>(top) : -1;
  r.store_response = f.boolean("store", true);
  if (const ojson* m = f.get("metadata"); m && !m->is_object()) bad_request("metadata", "must be an object");

  // Reasoning: V4 thinks unless asked not to (effort "none", or thinking / chat_template_kwargs
  // as on /v1/chat/completions); xhigh / max ask for its maximum effort.
  ChatOptions co;
  bool thinking = true;
  ojson reasoning = {{"effort", nullptr}, {"summary", nullptr}};
  if (const ojson* re = f.get("reasoning")) {
    if (!re->is_object()) bad_request("reasoning", "must be an object");
    const Fields rf{*re, "reasoning."};
    const std::string effort = rf.string("effort", "");
    if (effort == "none") {
      thinking = false;
    } else if (effort == "xhigh" || effort == "max") {
      co.reasoning_effort = "max";
    } else if (effort == "minimal" || effort == "low" || effort == "medium" || effort == "high") {
      co.reasoning_effort = "high";  // as DeepSeek's API maps the lower efforts
    } else if (!effort.empty()) {
      bad_request("reasoning.effort", "must be none, minimal, low, medium, high, xhigh or max, got '" + effort + "'");
    }
    const std::string summary = rf.string("summary", "");
    if (!summary.empty() && summary != "auto" && summary != "concise" && summary != "detailed")
      bad_request("reasoning.summary", "must be auto, concise or detailed, got '" + summary + "'");
    if (!effort.empty()) reasoning["effort"] = effort;
    if (!summary.empty()) reasoning["summary"] = summary;
  }
  thinking = read_thinking(f, thinking);
  r.mode = co.mode = thinking ? ChatMode::Thinking : ChatMode::Chat;
  r.gen.reasoning_first = thinking;

  if (const ojson* t = f.get("tools")) r.tools = convert_tools(*t, r);
  r.single_tool_call = !f.boolean("parallel_tool_calls", true);
  std::string forced;
  const bool forced_any = read_tool_choice(f, r, thinking, true, forced, "set reasoning.effort to none or use tool_choice auto");

  // text.format: text, json_object or json_schema {name, schema, strict}: enforced as
  // response_format is on /v1/chat/completions.
  ojson schema;
  ojson text = {{"format", {{"type", "text"}}}};
  if (const ojson* t = f.get("text")) {
    if (!t->is_object()) bad_request("text", "must be an object");
    if (const ojson* fmt = Fields{*t, "text."}.get("format")) {
      if (!fmt->is_object()) bad_request("text.format", "must be an object");
      const Fields ff{*fmt, "text.format."};
      const std::string type = ff.string("type", "");
      if (type == "json_object") {
        r.gen.json = JsonGrammar::any_object();
      } else if (type == "json_schema") {
        const ojson* sc = ff.get("schema");
        if (!sc) bad_request("text.format.schema", "is required");
        compile_schema(r, *sc, "text.format.schema");
        schema = *sc;
      } else if (type != "text") {
        bad_request("text.format.type", "must be text, json_object or json_schema, got '" + type + "'");
      }
      text = *t;
    }
  }
  json_beside_tools(r, forced_any);

  // The conversation: a previous response's (its input and answer), then this input.
  ojson conversation = ojson::array(), items = ojson::array();
  const std::string previous = f.string("previous_response_id", "");
  if (!previous.empty()) {
    auto p = kept ? kept->get(previous) : nullptr;
    if (!p)
      throw ApiError(404, "invalid_request_error",
                     "'previous_response_id': no response with id '" + previous + "' is kept (kept responses are in "
                     "memory only, the oldest forgotten first; send the whole conversation as input instead)",
                     "previous_response_id", "previous_response_not_found");
    conversation = p->conversation;
    if (p->input_items.is_array()) items = p->input_items;
    if (auto out = p->response.find("output"); out != p->response.end() && out->is_array())
      for (const ojson& o : *out) items.push_back(o);
  }
  if (const ojson* in = f.get("input")) {
    convert_input(*in, conversation);
    append_input_items(*in, items);
  }
  if (conversation.empty()) bad_request("input", "is required");
  const std::string instructions = f.string("instructions", "");
  ojson messages = ojson::array();
  if (!instructions.empty()) messages.push_back({{"role", "system"}, {"content", instructions}});
  for (const auto& m : conversation) messages.push_back(m);
  r.prompt_text = render_messages(chat_messages(messages, r.tools, calls, schema), co,
                                  " (in the conversation as converted to chat messages: instructions first, "
                                  "function calls joined to their assistant turn)");
  if (forced_any) r.forced_prefix = forced_call_prefix(forced);
  r.conversation = std::move(conversation);
  r.input_items = std::move(items);

  const int64_t max_out = f.integer("max_output_tokens", 0, 1, 1 << 30);
  tokenize_prompt(r, model, lim, "max_output_tokens", max_out);
  r.settings = {{"instructions", instructions.empty() ? ojson(nullptr) : ojson(instructions)},
                {"max_output_tokens", max_out > 0 ? ojson(max_out) : ojson(nullptr)},
                {"parallel_tool_calls", !r.single_tool_call},
                {"previous_response_id", previous.empty() ? ojson(nullptr) : ojson(previous)},
                {"reasoning", reasoning},
                {"store", r.store_response},
                {"temperature", r.gen.sampling.temperature},
                {"text", text},
                {"tool_choice", f.get("tool_choice") ? *f.get("tool_choice") : ojson("auto")},
                {"tools", f.get("tools") ? *f.get("tools") : ojson::array()},
                {"top_logprobs", top},
                {"top_p", r.gen.sampling.top_p},
                {"truncation", truncation},
                {"metadata", f.get("metadata") ? *f.get("metadata") : ojson::object()}};
  if (f.get("user")) r.settings["user"] = f.string("user", "");
}

ojson list_input_items(const StoredResponse& s, const std::multimap<std::string, std::string>& query) {
  int64_t limit = 20;
  bool desc = true, encrypted = false;
  const std::string* after = nullptr;
  for (const auto& [k, v] : query) {
    if (k == "limit") {
      const bool digits = !v.empty() && v.size() <= 3 && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
      limit = digits ? std::stoll(v) : 0;
      if (limit < 1 || limit > 100) bad_request("limit", "must be an integer from 1 to 100, got '" + v + "'");
    } else if (k == "order") {
      if (v != "asc" && v != "desc") bad_request("order", "must be 'asc' or 'desc', got '" + v + "'");
      desc = v == "desc";
    } else if (k == "after") {
      after = &v;
    } else if ((k == "include" || k == "include[]") && v == "reasoning.encrypted_content") {
      encrypted = true;
    }
  }
  std::vector<const ojson*> items;
  for (const ojson& o : s.input_items) items.push_back(&o);
  if (desc) std::reverse(items.begin(), items.end());
  size_t i = 0;
  if (after) {
    while (i < items.size() && (*items[i])["id"] != *after) ++i;
    if (i == items.size()) bad_request("after", "no input item of this response has the id '" + *after + "'");
    ++i;
  }
  ojson data = ojson::array();
  for (; i < items.size() && static_cast<int64_t>(data.size()) < limit; ++i) {
    ojson o = *items[i];
    if (!encrypted && o["type"] == "reasoning") o.erase("encrypted_content");
    data.push_back(std::move(o));
  }
  const ojson first = data.empty() ? ojson(nullptr) : data.front()["id"], last = data.empty() ? ojson(nullptr) : data.back()["id"];
  return {{"object", "list"}, {"data", std::move(data)}, {"first_id", first}, {"last_id", last}, {"has_more", i < items.size()}};
}

namespace {

// The answer as output items, streamed as the Responses API's events or returned whole.
class OpenAiResponses : public Responder {
 public:
  OpenAiResponses(const ParsedRequest& r, const Tokenizer& tok, ToolCallStore& calls, ResponseStore* kept)
      : r_(r), tok_(tok), calls_(calls), kept_(kept), id_(ToolCallStore::new_id("resp_")), created_(now_s()), choice_(r, "call_") {
    if (auto t = tok.find_token("</think>")) think_end_ = *t;
  }

  std::string start() override {
    std::string out = emit("response.created", {{"response", object("in_progress", nullptr)}});
    return out + emit("response.in_progress", {{"response", object("in_progress", nullptr)}});  // numbered in order
  }

  std::string event(const Event& e) override {
    choice_.count(e.ids, think_end_, r_.mode == ChatMode::Thinking);
    if (r_.logprobs && !e.ids.empty()) {
      // The tokens' entries wait for the text delta they wrote (text can be held back while it
      // might still be markup); those through "</think>" were reasoning and are dropped.
      ojson lp = token_logprobs(e, tok_);
      for (size_t i = 0; i < lp.size(); ++i) {
        if (e.ids[i] == think_end_ && r_.mode == ChatMode::Thinking) pending_lp_.clear();
        else pending_lp_.push_back(std::move(lp[i]));
      }
    }
    std::vector<CompletionEvent> ev;
    if (e.kind == Event::Text) ev = choice_.feed(e.text);
    // Cut short by max_output_tokens: the item open then (a call too, closed by finish()) is
    // incomplete.
    if (e.kind == Event::Finish) ev = choice_.finish(), incomplete_ = e.finish_reason == "length";
    std::string out;
    for (const auto& x : ev) out += item_event(x);
    if (e.kind == Event::Finish) {
      out += close_item(incomplete_ ? "incomplete" : "completed");
      choice_.store(calls_);
    }
    return out;
  }

  std::string end(const Usage& u) override {
    const ojson resp = final_object(u);
    return emit(incomplete_ ? "response.incomplete" : "response.completed", {{"response", resp}});
  }

  std::string body(const Usage& u) override { return final_object(u).dump(); }

  std::string failed(const ApiError& e) override {
    ojson resp = object("failed", nullptr);
    resp["error"] = {{"code", e.code.empty() ? e.type : e.code}, {"message", e.what()}};
    return emit("response.failed", {{"response", resp}});
  }

 private:
  // The response object: `status`, the output items so far, the request's settings.
  ojson object(const char* status, const ojson& usage) const {
    ojson o = {{"id", id_},
               {"object", "response"},
               {"created_at", created_},
               {"status", status},
               {"background", false},
               {"error", nullptr},
               {"incomplete_details", nullptr},
               {"model", r_.model},
               {"output", ojson::array()}};
    for (const auto& [k, v] : r_.settings.items()) o[k] = v;
    if (!usage.is_null()) {
      o["output"] = output_;
      o["usage"] = usage;
    }
    return o;
  }
  ojson final_object(const Usage& u) {
    const ojson usage = {{"input_tokens", u.prompt_tokens},
                         {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
                         {"output_tokens", u.completion_tokens},
                         {"output_tokens_details", {{"reasoning_tokens", std::min(choice_.reasoning_tokens, u.completion_tokens)}}},
                         {"total_tokens", u.prompt_tokens + u.completion_tokens}};
    ojson o = object(incomplete_ ? "incomplete" : "completed", usage);
    if (incomplete_) o["incomplete_details"] = {{"reason", "max_output_tokens"}};
    else o["completed_at"] = now_s();
    keep(o);
    return o;
  }
  // Kept once (a streamed answer's end(), or body()), with the conversation and this answer.
  void keep(const ojson& resp) {
    if (kept_done_ || !r_.store_response || !kept_) return;
    kept_done_ = true;
    ojson conv = r_.conversation;
    ojson a = {{"role", "assistant"}, {"content", choice_.content}};
    if (r_.mode == ChatMode::Thinking) a["reasoning_content"] = choice_.reasoning;
    if (!choice_.calls.empty()) {
      a["tool_calls"] = ojson::array();
      for (const auto& c : choice_.calls)
        a["tool_calls"].push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.args}}}});
    }
    conv.push_back(std::move(a));
    kept_->put(id_, StoredResponse{resp, std::move(conv), r_.input_items});
  }

  // One SSE event: its type, its fields and the running sequence number.
  std::string emit(const char* type, ojson fields) {
    ojson j = {{"type", type}};
    for (auto& [k, v] : fields.items()) j[k] = std::move(v);
    j["sequence_number"] = seq_++;
    return sse_event(type, j.dump());
  }
  ojson where() const { return {{"item_id", output_.back()["id"]}, {"output_index", output_.size() - 1}}; }
  ojson part_where() const {
    ojson w = where();
    w["content_index"] = 0;
    return w;
  }

  // Opens an output item of `type` unless it is the open one (a function call is always new).
  std::string open_item(const std::string& type, int call = -1) {
    if (open_ == type && type != "function_call") return "";
    std::string out = close_item("completed");
    open_ = type;
    ojson item;
    if (type == "reasoning") {
      item = {{"id", ToolCallStore::new_id("rs_")}, {"type", "reasoning"}, {"summary", ojson::array()}, {"content", ojson::array()}};
      if (r_.reasoning_in_encrypted_content) item["encrypted_content"] = "";
    } else if (type == "message") {
      item = {{"id", ToolCallStore::new_id("msg_")}, {"type", "message"}, {"status", "in_progress"}, {"role", "assistant"},
              {"content", ojson::array()}};
    } else {
      const auto& c = choice_.calls[static_cast<size_t>(call)];
      item = {{"id", ToolCallStore::new_id("fc_")}, {"type", "function_call"}, {"status", "in_progress"},
              {"call_id", c.id}, {"name", c.name}, {"arguments", ""}};
      // A namespace's function: its own name and its namespace, as the client declared them.
      if (auto ns = r_.tool_namespaces.find(c.name); ns != r_.tool_namespaces.end())
        item["name"] = ns->second.second, item["namespace"] = ns->second.first;
    }
    output_.push_back(item);
    out += emit("response.output_item.added", {{"output_index", output_.size() - 1}, {"item", item}});
    if (type == "reasoning") {
      output_.back()["content"].push_back({{"type", "reasoning_text"}, {"text", ""}});
      out += emit("response.content_part.added", merge(part_where(), {{"part", output_.back()["content"][0]}}));
    } else if (type == "message") {
      output_.back()["content"].push_back({{"type", "output_text"}, {"text", ""}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}});
      out += emit("response.content_part.added", merge(part_where(), {{"part", output_.back()["content"][0]}}));
    }
    return out;
  }
  std::string close_item(const char* status) {
    if (open_.empty()) return "";
    ojson& item = output_.back();
    std::string out;
    if (open_ == "reasoning") {
      const ojson& part = item["content"][0];
      out += emit("response.reasoning_text.done", merge(part_where(), {{"text", part["text"]}}));
      out += emit("response.content_part.done", merge(part_where(), {{"part", part}}));
      if (r_.reasoning_in_encrypted_content) item["encrypted_content"] = part["text"];
    } else if (open_ == "message") {
      const ojson& part = item["content"][0];
      out += emit("response.output_text.done", merge(part_where(), {{"text", part["text"]}, {"logprobs", part["logprobs"]}}));
      out += emit("response.content_part.done", merge(part_where(), {{"part", part}}));
      item["status"] = status;
    } else {
      out += emit("response.function_call_arguments.done",
                  merge(where(), {{"name", item["name"]}, {"arguments", item["arguments"]}}));
      item["status"] = status;
    }
    out += emit("response.output_item.done", {{"output_index", output_.size() - 1}, {"item", item}});
    open_.clear();
    return out;
  }
  static ojson merge(ojson a, const ojson& b) {
    for (const auto& [k, v] : b.items()) a[k] = v;
    return a;
  }
  // In place: copying the whole text for every delta would be quadratic in the answer's length.
  static void append(ojson& s, const std::string& t) { s.get_ref<std::string&>() += t; }

  std::string item_event(const CompletionEvent& x) {
    std::string out;
    switch (x.kind) {
      case Kind::Reasoning:
        pending_lp_.clear();  // reasoning tokens: OpenAI gives no log-probabilities for them
        out += open_item("reasoning");
        append(output_.back()["content"][0]["text"], x.text);
        out += emit("response.reasoning_text.delta", merge(part_where(), {{"delta", x.text}}));
        break;
      case Kind::Content: {
        out += open_item("message");
        append(output_.back()["content"][0]["text"], x.text);
        ojson lp = ojson::array();
        lp.swap(pending_lp_);
        for (const auto& t : lp) output_.back()["content"][0]["logprobs"].push_back(t);
        out += emit("response.output_text.delta", merge(part_where(), {{"delta", x.text}, {"logprobs", lp}}));
        break;
      }
      case Kind::ToolCallBegin:
        pending_lp_.clear();  // the call's markup and arguments are not the message's text
        out += open_item("function_call", x.index);
        break;
      case Kind::ToolCallArguments:
        append(output_.back()["arguments"], x.text);
        out += emit("response.function_call_arguments.delta", merge(where(), {{"delta", x.text}}));
        break;
      case Kind::ToolCallEnd: out += close_item(incomplete_ ? "incomplete" : "completed"); break;
    }
    return out;
  }

  const ParsedRequest& r_;
  const Tokenizer& tok_;
  ToolCallStore& calls_;
  ResponseStore* kept_;
  ojson pending_lp_ = ojson::array();  // log-probability entries of tokens whose text is not out yet
  std::string id_;
  int64_t created_;
  ChoiceText choice_;
  ojson output_ = ojson::array();
  std::string open_;  // the open item's type: reasoning | message | function_call | ""
  int64_t seq_ = 0;
  int32_t think_end_ = -1;
  bool incomplete_ = false, kept_done_ = false;
};

}  // namespace

std::unique_ptr<Responder> make_responses_responder(const ParsedRequest& r, const Tokenizer& tok, ToolCallStore& calls,
                                                    ResponseStore* kept) {
  return std::make_unique<OpenAiResponses>(r, tok, calls, kept);
}

}  // namespace dsv4::server
