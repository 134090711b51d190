#include "server/response.h"

#include <chrono>

#include "server/choice_text.h"
#include "server/responses_api.h"

namespace dsv4::server {

using ojson = nlohmann::ordered_json;
using Kind = CompletionEvent::Kind;

std::string sse(const std::string& json) { return "data: " + json + "\n\n"; }
std::string sse_event(const std::string& name, const std::string& json) { return "event: " + name + "\ndata: " + json + "\n\n"; }

std::string Responder::failed(const ApiError& e) { return sse(error_body(e)); }
std::string Responder::keep_alive() { return ": keep-alive\n\n"; }

int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

namespace {

// OpenAI's usage, with DeepSeek's names for the cache hits beside it (clients written for
// DeepSeek's API read prompt_cache_hit_tokens / prompt_cache_miss_tokens); reasoning_tokens
// (chat completions: summed over the choices) when known, as both APIs give it.
ojson usage_json(const Usage& u, int64_t reasoning_tokens = -1) {
  ojson j = {{"prompt_tokens", u.prompt_tokens},
             {"completion_tokens", u.completion_tokens},
             {"total_tokens", u.prompt_tokens + u.completion_tokens},
             {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
             {"prompt_cache_hit_tokens", u.cached_tokens},
             {"prompt_cache_miss_tokens", u.prompt_tokens - u.cached_tokens}};
  if (reasoning_tokens >= 0) j["completion_tokens_details"] = {{"reasoning_tokens", std::min(reasoning_tokens, u.completion_tokens)}};
  return j;
}

std::string openai_finish(const std::string& reason, bool tool_calls) {
  if (tool_calls) return "tool_calls";
  return reason == "length" ? "length" : "stop";
}

// A sampled token's text; "" for an id the tokenizer has none for (a model's vocabulary may be
// padded past its tokenizer's). token_text throws there, which here would end the answer
// half-sent (found by fuzz_server_request).
std::string text_of(const Tokenizer& tok, int32_t id) {
  try {
    return tok.token_text(id);
  } catch (const Error&) {
    return "";
  }
}

// A token's text for a JSON string: a token may hold part of a UTF-8 character, which a JSON
// string cannot carry (nlohmann refuses to write it); such a token's text is "" (the chat format's
// `bytes` has its exact bytes, as OpenAI's API does).
std::string whole_utf8_or_empty(const std::string& t) {
  try {
    (void)ojson(t).dump();
    return t;
  } catch (const nlohmann::json::exception&) {
    return "";
  }
}

}  // namespace

// OpenAI's per-token logprob entries: {token, logprob, bytes, top_logprobs}.
ojson token_logprobs(const Event& e, const Tokenizer& tok) {
  ojson out = ojson::array();
  auto entry = [&](int32_t id, float lp) {
    const std::string t = text_of(tok, id);
    ojson bytes = ojson::array();
    for (unsigned char ch : t) bytes.push_back(static_cast<int>(ch));
    return ojson{{"token", whole_utf8_or_empty(t)}, {"logprob", lp}, {"bytes", bytes}};
  };
  for (size_t i = 0; i < e.ids.size() && i < e.logprobs.size(); ++i) {
    ojson x = entry(e.ids[i], e.logprobs[i]);
    ojson top = ojson::array();
    if (i < e.top.size())
      for (const auto& t : e.top[i]) top.push_back(entry(t.id, t.logprob));
    x["top_logprobs"] = top;
    out.push_back(std::move(x));
  }
  return out;
}

namespace {

class OpenAiChat : public Responder {
 public:
  OpenAiChat(const ParsedRequest& r, const Tokenizer& tok, ToolCallStore& store)
      : r_(r), tok_(tok), store_(store), id_(ToolCallStore::new_id("chatcmpl-")), created_(now_s()),
        think_end_(tok.find_token(kThinkEndText).value_or(-1)) {
    for (int i = 0; i < r.gen.n; ++i) choices_.emplace_back(r, "call_");
  }

  std::string start() override {
    std::string out;
    for (int i = 0; i < r_.gen.n; ++i) out += chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
    return out;
  }

  std::string event(const Event& e) override {
    ChoiceText& c = choices_[static_cast<size_t>(e.choice)];
    std::string out;
    ojson lp = nullptr;
    if (r_.logprobs && !e.ids.empty()) {
      lp = ojson{{"content", token_logprobs(e, tok_)}};
      for (auto& x : lp["content"]) c.logprobs.push_back(x);
    }
    std::vector<CompletionEvent> ev;
    c.count(e.ids, think_end_, r_.mode == ChatMode::Thinking);
    if (e.kind == Event::Text) ev = c.feed(e.text);
    if (e.kind == Event::Finish) ev = c.finish();
    for (const auto& x : ev) {
      out += chunk(e.choice, delta(c, x), lp, nullptr);
      lp = nullptr;
    }
    if (!lp.is_null()) out += chunk(e.choice, ojson::object(), lp, nullptr);
    if (e.kind == Event::Finish) {
      c.finish_reason = openai_finish(e.finish_reason, !c.calls.empty());
      c.store(store_);
      out += chunk(e.choice, ojson::object(), nullptr, c.finish_reason);
    }
    return out;
  }

  std::string end(const Usage& u) override {
    std::string out;
    if (r_.include_usage) {
      ojson j = head("chat.completion.chunk");
      j["choices"] = ojson::array();
      j["usage"] = usage_json(u, reasoning_tokens());
      out += sse(j.dump());
    }
    return out + "data: [DONE]\n\n";
  }

  std::string body(const Usage& u) override {
    ojson j = head("chat.completion");
    j["choices"] = ojson::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const ChoiceText& c = choices_[i];
      ojson msg = {{"role", "assistant"}, {"content", c.content}};
      if (r_.mode == ChatMode::Thinking) msg["reasoning_content"] = c.reasoning;
      if (!c.calls.empty()) {
        ojson calls = ojson::array();
        for (const auto& t : c.calls)
          calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.args}}}});
        msg["tool_calls"] = calls;
      }
      ojson ch = {{"index", i}, {"message", msg}, {"logprobs", nullptr}, {"finish_reason", c.finish_reason}};
      if (r_.logprobs) ch["logprobs"] = {{"content", c.logprobs}};
      j["choices"].push_back(std::move(ch));
    }
    j["usage"] = usage_json(u, reasoning_tokens());
    return j.dump();
  }

 private:
  int64_t reasoning_tokens() const {
    int64_t n = 0;
    for (const auto& c : choices_) n += c.reasoning_tokens;
    return n;
  }
  ojson head(const char* object) const {
    return {{"id", id_}, {"object", object}, {"created", created_}, {"model", r_.model}, {"system_fingerprint", "dsv4"}};
  }
  std::string chunk(int choice, const ojson& delta, const ojson& logprobs, const ojson& finish) const {
    ojson j = head("chat.completion.chunk");
    j["choices"] = ojson::array({{{"index", choice}, {"delta", delta}, {"logprobs", logprobs}, {"finish_reason", finish}}});
    return sse(j.dump());
  }
  static ojson delta(const ChoiceText& c, const CompletionEvent& x) {
    switch (x.kind) {
      case Kind::Reasoning: return {{"reasoning_content", x.text}};
      case Kind::Content: return {{"content", x.text}};
      case Kind::ToolCallBegin: {
        const auto& t = c.calls[static_cast<size_t>(x.index)];
        return {{"tool_calls", ojson::array({{{"index", x.index}, {"id", t.id}, {"type", "function"},
                                              {"function", {{"name", t.name}, {"arguments", ""}}}}})}};
      }
      case Kind::ToolCallArguments:
        return {{"tool_calls", ojson::array({{{"index", x.index}, {"function", {{"arguments", x.text}}}}})}};
      case Kind::ToolCallEnd: break;
    }
    return ojson::object();
  }

  const ParsedRequest& r_;
  const Tokenizer& tok_;
  ToolCallStore& store_;
  std::vector<ChoiceText> choices_;
  std::string id_;
  int64_t created_;
  int32_t think_end_;
};

// /v1/completions: raw text, no chat parsing.
class OpenAiCompletion : public Responder {
 public:
  OpenAiCompletion(const ParsedRequest& r, const Tokenizer& tok)
      : r_(r), tok_(tok), id_(ToolCallStore::new_id("cmpl-")), created_(now_s()), text_(r.gen.n), finish_(r.gen.n),
        lp_(r.gen.n) {
    if (r.echo)
      for (auto& t : text_) t = r.echo_text;
  }
  std::string start() override {
    if (!r_.echo) return "";
    std::string out;
    for (int i = 0; i < r_.gen.n; ++i) out += chunk(i, r_.echo_text, nullptr, nullptr);
    return out;
  }
  std::string event(const Event& e) override {
    const auto i = static_cast<size_t>(e.choice);
    ojson lp = nullptr;
    if (r_.logprobs && !e.ids.empty()) {
      lp = legacy_logprobs(e);
      append(lp_[i], lp);
    }
    if (e.kind == Event::Text) {
      text_[i] += e.text;
      return chunk(e.choice, e.text, lp, nullptr);
    }
    if (e.kind == Event::Finish) {
      finish_[i] = openai_finish(e.finish_reason, false);
      return chunk(e.choice, e.text, lp, finish_[i]);
    }
    return "";
  }
  std::string end(const Usage& u) override {
    std::string out;
    if (r_.include_usage) {
      ojson j = head();
      j["choices"] = ojson::array();
      j["usage"] = usage_json(u);
      out += sse(j.dump());
    }
    return out + "data: [DONE]\n\n";
  }
  std::string body(const Usage& u) override {
    ojson j = head();
    j["choices"] = ojson::array();
    for (size_t i = 0; i < text_.size(); ++i)
      j["choices"].push_back({{"text", text_[i]}, {"index", i}, {"logprobs", r_.logprobs ? lp_[i] : ojson(nullptr)},
                              {"finish_reason", finish_[i]}});
    j["usage"] = usage_json(u);
    return j.dump();
  }

 private:
  ojson head() const { return {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", r_.model}}; }
  std::string chunk(int choice, const std::string& text, const ojson& lp, const ojson& finish) const {
    ojson j = head();
    j["choices"] = ojson::array({{{"text", text}, {"index", choice}, {"logprobs", lp}, {"finish_reason", finish}}});
    return sse(j.dump());
  }
  // The legacy format: parallel lists of tokens, their logprobs and {token: logprob} maps.
  ojson legacy_logprobs(const Event& e) const {
    ojson toks = ojson::array(), lps = ojson::array(), tops = ojson::array();
    for (size_t i = 0; i < e.ids.size() && i < e.logprobs.size(); ++i) {
      toks.push_back(whole_utf8_or_empty(text_of(tok_, e.ids[i])));
      lps.push_back(e.logprobs[i]);
      ojson m = ojson::object();
      if (i < e.top.size())
        for (const auto& t : e.top[i]) m[whole_utf8_or_empty(text_of(tok_, t.id))] = t.logprob;
      tops.push_back(m);
    }
    return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}};
  }
  static void append(ojson& acc, const ojson& lp) {
    if (acc.is_null()) acc = {{"tokens", ojson::array()}, {"token_logprobs", ojson::array()}, {"top_logprobs", ojson::array()}};
    for (const char* k : {"tokens", "token_logprobs", "top_logprobs"})
      for (const auto& x : lp[k]) acc[k].push_back(x);
  }

  const ParsedRequest& r_;
  const Tokenizer& tok_;
  std::string id_;
  int64_t created_;
  std::vector<std::string> text_, finish_;
  std::vector<ojson> lp_;
};

// Anthropic Messages: one choice; thinking, text and tool_use content blocks.
class AnthropicMessages : public Responder {
 public:
  AnthropicMessages(const ParsedRequest& r, ToolCallStore& store)
      : r_(r), store_(store), id_(ToolCallStore::new_id("msg_")), choice_(r, "toolu_") {}

  std::string start() override {
    ojson msg = {{"id", id_},          {"type", "message"},        {"role", "assistant"},
                 {"content", ojson::array()}, {"model", r_.model}, {"stop_reason", nullptr},
                 {"stop_sequence", nullptr},  {"usage", {{"input_tokens", r_.gen.prompt.size()}, {"output_tokens", 0}}}};
    return sse_event("message_start", ojson{{"type", "message_start"}, {"message", msg}}.dump());
  }

  std::string event(const Event& e) override {
    std::vector<CompletionEvent> ev;
    if (e.kind == Event::Text) ev = choice_.feed(e.text);
    if (e.kind == Event::Finish) ev = choice_.finish();
    std::string out;
    for (const auto& x : ev) out += block_event(x);
    if (e.kind == Event::Finish) {
      out += close_block();
      choice_.store(store_);
      if (!choice_.calls.empty()) stop_reason_ = "tool_use";
      else if (e.finish_reason == "length") stop_reason_ = "max_tokens";
      else if (e.finish_reason == "stop_string") stop_reason_ = "stop_sequence", stop_sequence_ = e.stop_string;
      else stop_reason_ = "end_turn";
    }
    return out;
  }

  // The whole usage goes in message_delta too (as Anthropic's does): message_start is sent before
  // the prefix cache is looked up, so only here are the cached tokens known. Clients (the SDK's
  // stream, Claude Code) take the delta's fields over the start's.
  std::string end(const Usage& u) override {
    ojson d = {{"type", "message_delta"},
               {"delta", {{"stop_reason", stop_reason_}, {"stop_sequence", stop_seq()}}},
               {"usage", usage(u)}};
    return sse_event("message_delta", d.dump()) + sse_event("message_stop", R"({"type":"message_stop"})");
  }

  std::string failed(const ApiError& e) override { return sse_event("error", anthropic_error_body(e)); }
  std::string keep_alive() override { return sse_event("ping", R"({"type":"ping"})"); }

  std::string body(const Usage& u) override {
    ojson content = ojson::array();
    for (const auto& b : blocks_) content.push_back(b);
    ojson j = {{"id", id_},
               {"type", "message"},
               {"role", "assistant"},
               {"model", r_.model},
               {"content", content},
               {"stop_reason", stop_reason_},
               {"stop_sequence", stop_seq()},
               {"usage", usage(u)}};
    return j.dump();
  }

 private:
  // Anthropic's input_tokens are the ones not read from the cache; nothing is written to a cache
  // the client pays for (cache_control is a hint here: every prompt's end is kept).
  static ojson usage(const Usage& u) {
    return {{"input_tokens", u.prompt_tokens - u.cached_tokens},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", u.cached_tokens},
            {"output_tokens", u.completion_tokens}};
  }
  ojson stop_seq() const { return stop_sequence_.empty() ? ojson(nullptr) : ojson(stop_sequence_); }

  // Opens a block of `type` unless it is the open one; returns the SSE text.
  std::string open(const std::string& type, const ojson& block) {
    std::string out;
    if (open_ == type && type != "tool_use") return out;
    out += close_block();
    open_ = type;
    blocks_.push_back(block);
    out += sse_event("content_block_start",
                     ojson{{"type", "content_block_start"}, {"index", blocks_.size() - 1}, {"content_block", block}}.dump());
    return out;
  }
  std::string close_block() {
    if (open_.empty()) return "";
    std::string out;
    if (open_ == "thinking" && r_.reasoning_in_signature) {
      // thinking.display "omitted": the text goes in the signature, sent as Anthropic does.
      const std::string sig = kReasoningSignature + hidden_;
      blocks_.back()["signature"] = sig;
      hidden_.clear();
      out += delta({{"type", "signature_delta"}, {"signature", sig}});
    }
    if (open_ == "tool_use") {
      // The non-streamed block holds the parsed input object.
      ojson& b = blocks_.back();
      b["input"] = ojson::parse(args_, nullptr, false);
      if (b["input"].is_discarded() || !b["input"].is_object()) b["input"] = ojson::object();
      args_.clear();
    }
    open_.clear();
    return out + sse_event("content_block_stop", ojson{{"type", "content_block_stop"}, {"index", blocks_.size() - 1}}.dump());
  }
  std::string delta(const ojson& d) {
    return sse_event("content_block_delta", ojson{{"type", "content_block_delta"}, {"index", blocks_.size() - 1}, {"delta", d}}.dump());
  }
  std::string block_event(const CompletionEvent& x) {
    std::string out;
    switch (x.kind) {
      case Kind::Reasoning:
        out += open("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
        if (r_.reasoning_in_signature) {
          hidden_ += x.text;
          break;
        }
        blocks_.back()["thinking"].get_ref<std::string&>() += x.text;  // in place, not a copy per delta
        out += delta({{"type", "thinking_delta"}, {"thinking", x.text}});
        break;
      case Kind::Content:
        out += open("text", {{"type", "text"}, {"text", ""}});
        blocks_.back()["text"].get_ref<std::string&>() += x.text;
        out += delta({{"type", "text_delta"}, {"text", x.text}});
        break;
      case Kind::ToolCallBegin: {
        const auto& t = choice_.calls[static_cast<size_t>(x.index)];
        out += open("tool_use", {{"type", "tool_use"}, {"id", t.id}, {"name", t.name}, {"input", ojson::object()}});
        break;
      }
      case Kind::ToolCallArguments:
        args_ += x.text;
        out += delta({{"type", "input_json_delta"}, {"partial_json", x.text}});
        break;
      case Kind::ToolCallEnd: out += close_block(); break;
    }
    return out;
  }

  const ParsedRequest& r_;
  ToolCallStore& store_;
  std::string id_;
  ChoiceText choice_;
  std::vector<ojson> blocks_;
  std::string open_, args_;
  std::string hidden_;  // the open thinking block's text, when it goes in the signature
  std::string stop_reason_ = "end_turn", stop_sequence_;
};

}  // namespace

std::unique_ptr<Responder> make_responder(const ParsedRequest& r, const Tokenizer& tok, ToolCallStore& store,
                                          ResponseStore* responses) {
  switch (r.api) {
    case Api::OpenAiResponses: return make_responses_responder(r, tok, store, responses);
    case Api::OpenAiChat: return std::make_unique<OpenAiChat>(r, tok, store);
    case Api::OpenAiCompletion: return std::make_unique<OpenAiCompletion>(r, tok);
    case Api::Anthropic: return std::make_unique<AnthropicMessages>(r, store);
  }
  return nullptr;
}

}  // namespace dsv4::server
