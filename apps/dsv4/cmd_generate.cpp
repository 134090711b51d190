// dsv4 generate / chat: text in, text out through the chat encoding, sampling and streaming.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>

#include "args.h"
#include "device.h"
#include "engine/generate.h"
#include "text/chat.h"
#include "text/json_grammar.h"
#include "text/tokenizer.h"

namespace dsv4::cli {

EngineOptions engine_options(const Args& a, int64_t context) {
  EngineOptions eo;
  eo.model_dir = a.str("model");
  eo.device = device_option(a);
  eo.threads = static_cast<int>(a.integer("threads", 0));
  eo.load = load_mode_option(a);
  eo.context = context;
  eo.memory_budget = memory_budget_option(a);
  eo.parallel = parallel_option(a);
  eo.tokenizer = a.str("tokenizer", "");
  eo.require_tokenizer = true;  // the Engine checks it, and that it fits the model, before the weights
  return eo;
}

namespace {

// A JSON schema file, for --json-schema.
nlohmann::ordered_json read_schema(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open the JSON schema file");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not JSON (" + e.what() + ")");
  }
}

GenerateOptions gen_options(const Args& a) {
  GenerateOptions o;
  o.max_new_tokens = a.integer("n", 256);
  o.sampling.temperature = static_cast<float>(a.number("temperature", 0.0));
  o.sampling.top_k = a.integer("top-k", 0);
  o.sampling.top_p = static_cast<float>(a.number("top-p", 1.0));
  o.sampling.min_p = static_cast<float>(a.number("min-p", 0.0));
  o.sampling.repetition_penalty = static_cast<float>(a.number("repetition-penalty", 1.0));
  o.sampling.presence_penalty = static_cast<float>(a.number("presence-penalty", 0.0));
  o.sampling.seed = static_cast<uint64_t>(a.integer("seed", 0));
  o.stop_strings = a.all_stop();
  o.prefill_chunk = a.integer("chunk", 0);
  o.context_limit = a.integer("context", 0);
  o.draft = a.integer("draft", 0);
  // A JSON answer: any object, or an object of a JSON schema (the server's response_format).
  const std::string schema_file = a.str("json-schema", "");
  if (a.flag("json-object") && !schema_file.empty()) throw Usage("--json-object and --json-schema exclude each other");
  if (a.flag("json-object")) o.json = JsonGrammar::any_object();
  if (!schema_file.empty()) {
    const nlohmann::ordered_json schema = read_schema(schema_file);
    try {
      o.json = JsonGrammar::compile(schema, "schema");
    } catch (const SchemaError& e) {
      throw Error(schema_file + ": " + e.what());
    }
  }
  if (o.max_new_tokens < 0) throw Usage("-n must be >= 0");
  if (o.draft < 0 || o.draft > kCheapRewind) throw Usage("--draft must be in [0, " + std::to_string(kCheapRewind) + "]");
  validate(o.sampling);
  return o;
}

// Routes streamed text in thinking mode: reasoning until "</think>", then the answer.
// Reasoning goes to stderr as it comes when shown (dimmed on a terminal; elsewhere between
// "[reasoning]" and "[/reasoning]" lines), else nowhere.
class ThinkRouter {
 public:
  ThinkRouter(bool thinking, bool show) : in_reasoning_(thinking), show_(show) {}
  void operator()(std::string_view t) {
    if (!in_reasoning_) return answer(t);
    held_ += t;
    size_t at = held_.find(kThinkEndText);
    if (at == std::string::npos) {
      // Keep a tail that might be the start of "</think>".
      size_t keep = std::min(held_.size(), std::string_view(kThinkEndText).size() - 1);
      reasoning(held_.substr(0, held_.size() - keep));
      held_.erase(0, held_.size() - keep);
      return;
    }
    reasoning(held_.substr(0, at));
    std::string rest = held_.substr(at + std::string_view(kThinkEndText).size());
    held_.clear();
    in_reasoning_ = false;
    end_reasoning();
    answer(rest);
  }
  void finish() {
    if (in_reasoning_) reasoning(held_);
    held_.clear();
    if (in_reasoning_) end_reasoning();
  }

 private:
  void reasoning(const std::string& t) {
    if (!show_ || t.empty()) return;
    if (!started_reasoning_) std::fputs(isatty(2) ? "\x1b[2m" : "[reasoning]\n", stderr);
    started_reasoning_ = true;
    std::fwrite(t.data(), 1, t.size(), stderr);
    std::fflush(stderr);
  }
  void end_reasoning() {
    if (show_ && started_reasoning_) std::fputs(isatty(2) ? "\x1b[0m\n" : "\n[/reasoning]\n", stderr);
    std::fflush(stderr);
  }
  void answer(std::string_view t) {
    std::fwrite(t.data(), 1, t.size(), stdout);
    std::fflush(stdout);
  }
  bool in_reasoning_, show_, started_reasoning_ = false;
  std::string held_;
};

// generate also takes raw (handled by the caller); chat does not.
ChatMode parse_mode(const std::string& m, bool raw_too) {
  if (m == "thinking") return ChatMode::Thinking;
  if (m == "chat") return ChatMode::Chat;
  throw Usage(std::string("--mode must be ") + (raw_too ? "thinking, chat or raw" : "thinking or chat") + ", got '" + m + "'");
}

std::string effort_option(const Args& a) {
  const std::string e = a.str("reasoning-effort", "");
  if (!valid_reasoning_effort(e)) throw Usage("--reasoning-effort must be high or max, got '" + e + "'");
  return e;
}

void print_stats(const GenerateResult& r, int64_t draft) {
  const double pf = r.prefill_s > 0 ? static_cast<double>(r.prompt_tokens) / r.prefill_s : 0;
  const double dc = r.decode_s > 0 ? static_cast<double>(r.tokens.size()) / r.decode_s : 0;
  std::string reuse = r.reused_tokens > 0 ? " (+" + std::to_string(r.reused_tokens) + " reused)" : "";
  std::fprintf(stderr, "[%lld prompt tokens%s, prefill %.1f tok/s; %zu generated, decode %.1f tok/s; stop: %s]\n",
               static_cast<long long>(r.prompt_tokens), reuse.c_str(), pf, r.tokens.size(), dc, r.stop_reason.c_str());
  if (draft > 0)
    std::fprintf(stderr, "[speculative: %lld steps, %lld drafted, %lld accepted (%.1f%%), %.2f tokens per step]\n",
                 static_cast<long long>(r.steps), static_cast<long long>(r.drafted), static_cast<long long>(r.accepted),
                 r.drafted > 0 ? 100.0 * static_cast<double>(r.accepted) / static_cast<double>(r.drafted) : 0.0,
                 r.steps > 0 ? static_cast<double>(r.tokens.size()) / static_cast<double>(r.steps) : 0.0);
}

}  // namespace

int cmd_generate(const Args& a) {
  // Every option is read and checked before the model loads, which can take minutes.
  const std::string prompt = a.str("prompt");
  const std::string mode = a.str("mode", "thinking");
  const bool raw = mode == "raw";
  const ChatMode chat_mode = raw ? ChatMode::Chat : parse_mode(mode, true);
  const bool show = !a.flag("hide-reasoning");
  const std::string effort = effort_option(a);
  GenerateOptions opt = gen_options(a);  // (it reads and compiles --json-schema's file)
  const std::string schema_file = a.str("json-schema", "");
  const EngineOptions eo = engine_options(a, opt.context_limit);
  a.check_all_used();
  std::unique_ptr<Engine> E = std::make_unique<Engine>(eo);
  const Tokenizer& tok = E->tokenizer();

  std::vector<int32_t> ids;
  bool thinking = false;
  if (raw) {
    ids = tok.encode(prompt);
  } else {
    ChatOptions co;
    co.mode = chat_mode;
    co.reasoning_effort = effort;
    thinking = co.mode == ChatMode::Thinking;
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    if (!schema_file.empty())  // shown to the model as the server shows it
      msgs.push_back({{"role", "system"}, {"content", ""}, {"response_format", read_schema(schema_file)}});
    msgs.push_back({{"role", "user"}, {"content", prompt}});
    ids = tok.encode(render_chat(msgs, co));
  }
  opt.json_after_reasoning = thinking;
  Session s = new_session(*E, opt);
  ThinkRouter route(thinking, show);
  GenerateResult r = generate(*E, s, ids, opt, [&](std::string_view t) { route(t); });
  route.finish();
  std::fputc('\n', stdout);
  print_stats(r, opt.draft);
  return 0;
}

int cmd_chat(const Args& a) {
  // Every option is read and checked before the model loads, which can take minutes.
  const std::string mode = a.str("mode", "thinking");
  ChatOptions co;
  co.mode = parse_mode(mode, false);
  const bool show = !a.flag("hide-reasoning");
  co.reasoning_effort = effort_option(a);
  const std::string system = a.str("system", "");
  GenerateOptions opt = gen_options(a);  // (it reads and compiles --json-schema's file)
  opt.json_after_reasoning = co.mode == ChatMode::Thinking;
  const std::string schema_file = a.str("json-schema", "");
  const EngineOptions eo = engine_options(a, opt.context_limit);
  a.check_all_used();
  std::unique_ptr<Engine> E = std::make_unique<Engine>(eo);
  const Tokenizer& tok = E->tokenizer();

  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  auto reset = [&] {
    msgs = nlohmann::ordered_json::array();
    if (!system.empty() || !schema_file.empty()) msgs.push_back({{"role", "system"}, {"content", system}});
    if (!schema_file.empty()) msgs[0]["response_format"] = read_schema(schema_file);
  };
  reset();
  // One session for the whole conversation: each turn reuses the state of the previous ones
  // (engine/generate.h Session) and prefills only what is new.
  Session s = new_session(*E, opt);
  const bool tty = isatty(0);
  std::fprintf(stderr, "dsv4 chat (%s mode). /reset clears the conversation, /exit quits.\n", mode.c_str());
  std::string line;
  for (;;) {
    if (tty) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line) || line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      reset();
      s = new_session(*E, opt);
      std::fputs("(conversation cleared)\n", stderr);
      continue;
    }
    if (line.empty()) continue;
    msgs.push_back({{"role", "user"}, {"content", line}});
    std::vector<int32_t> ids = tok.encode(render_chat(msgs, co));
    ThinkRouter route(co.mode == ChatMode::Thinking, show);
    GenerateResult r = generate(*E, s, ids, opt, [&](std::string_view t) { route(t); });
    route.finish();
    std::fputc('\n', stdout);
    print_stats(r, opt.draft);
    // Keep the assistant turn in the conversation as the encoder expects it.
    nlohmann::ordered_json turn = {{"role", "assistant"}};
    try {
      ParsedCompletion p = parse_completion(r.text, co.mode);
      turn["reasoning_content"] = p.reasoning_content;
      turn["content"] = p.content;
      if (!p.tool_calls.empty()) turn["tool_calls"] = p.tool_calls;
    } catch (const Error&) {
      // A completion cut by the token budget need not parse; keep what was said as content.
      size_t at = r.text.find(kThinkEndText);
      turn["content"] = at == std::string::npos ? std::string() : r.text.substr(at + std::string_view(kThinkEndText).size());
      turn["reasoning_content"] = at == std::string::npos ? r.text : r.text.substr(0, at);
    }
    msgs.push_back(turn);
  }
  return 0;
}

}  // namespace dsv4::cli
