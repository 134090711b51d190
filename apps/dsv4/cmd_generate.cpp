// dsv4 generate / chat: text in, text out through the chat encoding, sampling and streaming.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "args.h"
#include "device.h"
#include "core/threads.h"
#include "gen/generate.h"
#include "text/chat.h"
#include "text/tokenizer.h"

namespace dsv4::cli {

namespace {

struct Loaded {
  Model model;
  Tokenizer tok;
};

// The model and tokenizer on the device --device names. On cuda the sequence caches are sized
// for the context limit, so an unset --context becomes default_cuda_context().
Loaded load_all(const Args& a, GenerateOptions& opt) {
  const Device device = device_option(a);
  const std::string dir = a.str("model");
  const std::string tdir = a.str("tokenizer", dir);
  set_threads(static_cast<int>(a.integer("threads", 0)));
  if (!std::filesystem::exists(std::filesystem::path(tdir) / "tokenizer.json") && !std::filesystem::is_regular_file(tdir))
    throw Error("no tokenizer.json in " + tdir + " (pass --tokenizer DIR)");
  Tokenizer tok = Tokenizer::load(tdir);
  ModelWeights w = load_model(dir, load_mode_option(a));
  if (device == Device::Cuda && opt.context_limit <= 0) opt.context_limit = default_cuda_context(w.cfg);
  Model model = make_model(std::move(w), device, opt.context_limit);
  if (tok.vocab_size() > model.config().vocab)
    throw Error("tokenizer " + tdir + " has " + std::to_string(tok.vocab_size()) + " tokens but the model's vocab_size is " +
                std::to_string(model.config().vocab));
  return {std::move(model), std::move(tok)};
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
  if (o.max_new_tokens < 0) throw Usage("-n must be >= 0");
  validate(o.sampling);
  return o;
}

// Routes streamed text in thinking mode: reasoning until "</think>", then the answer.
// Reasoning goes to stderr (dimmed on a terminal) when shown, else nowhere.
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
    if (show_ && started_reasoning_) std::fputs(isatty(2) ? "\x1b[0m\n" : "\n", stderr);
    answer(rest);
  }
  void finish() {
    if (in_reasoning_) reasoning(held_);
    held_.clear();
    if (show_ && in_reasoning_ && started_reasoning_) std::fputs(isatty(2) ? "\x1b[0m\n" : "\n", stderr);
  }

 private:
  void reasoning(const std::string& t) {
    if (!show_ || t.empty()) return;
    if (!started_reasoning_ && isatty(2)) std::fputs("\x1b[2m", stderr);
    started_reasoning_ = true;
    std::fwrite(t.data(), 1, t.size(), stderr);
    std::fflush(stderr);
  }
  void answer(std::string_view t) {
    std::fwrite(t.data(), 1, t.size(), stdout);
    std::fflush(stdout);
  }
  bool in_reasoning_, show_, started_reasoning_ = false;
  std::string held_;
};

ChatMode parse_mode(const std::string& m) {
  if (m == "thinking") return ChatMode::Thinking;
  if (m == "chat") return ChatMode::Chat;
  throw Usage("--mode must be thinking, chat or raw, got '" + m + "'");
}

void print_stats(const GenerateResult& r) {
  const double pf = r.prefill_s > 0 ? static_cast<double>(r.prompt_tokens) / r.prefill_s : 0;
  const double dc = r.decode_s > 0 ? static_cast<double>(r.tokens.size()) / r.decode_s : 0;
  std::fprintf(stderr, "[%lld prompt tokens, prefill %.1f tok/s; %zu generated, decode %.1f tok/s; stop: %s]\n",
               static_cast<long long>(r.prompt_tokens), pf, r.tokens.size(), dc, r.stop_reason.c_str());
}

}  // namespace

int cmd_generate(const Args& a) {
  const std::string prompt = a.str("prompt");
  const std::string mode = a.str("mode", "thinking");
  const bool show = a.flag("show-reasoning");
  const std::string effort = a.str("reasoning-effort", "");
  GenerateOptions opt = gen_options(a);
  Loaded L = load_all(a, opt);
  a.check_all_used();

  std::vector<int32_t> ids;
  bool thinking = false;
  if (mode == "raw") {
    ids = L.tok.encode(prompt);
  } else {
    ChatOptions co;
    co.mode = parse_mode(mode);
    co.reasoning_effort = effort;
    thinking = co.mode == ChatMode::Thinking;
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array({{{"role", "user"}, {"content", prompt}}});
    ids = L.tok.encode(render_chat(msgs, co));
  }
  Session s = new_session(L.model);
  ThinkRouter route(thinking, show);
  GenerateResult r = generate(L.model, s, L.tok, ids, opt, [&](std::string_view t) { route(t); });
  route.finish();
  std::fputc('\n', stdout);
  print_stats(r);
  return 0;
}

int cmd_chat(const Args& a) {
  const std::string mode = a.str("mode", "thinking");
  const bool show = a.flag("show-reasoning");
  const std::string effort = a.str("reasoning-effort", "");
  const std::string system = a.str("system", "");
  GenerateOptions opt = gen_options(a);
  Loaded L = load_all(a, opt);
  a.check_all_used();
  ChatOptions co;
  co.mode = parse_mode(mode);
  co.reasoning_effort = effort;

  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  auto reset = [&] {
    msgs = nlohmann::ordered_json::array();
    if (!system.empty()) msgs.push_back({{"role", "system"}, {"content", system}});
  };
  reset();
  Session s = new_session(L.model);
  const bool tty = isatty(0);
  std::fprintf(stderr, "dsv4 chat (%s mode). /reset clears the conversation, /exit quits.\n", mode.c_str());
  std::string line;
  for (;;) {
    if (tty) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line) || line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      reset();
      s = new_session(L.model);
      std::fputs("(conversation cleared)\n", stderr);
      continue;
    }
    if (line.empty()) continue;
    msgs.push_back({{"role", "user"}, {"content", line}});
    std::vector<int32_t> ids = L.tok.encode(render_chat(msgs, co));
    ThinkRouter route(co.mode == ChatMode::Thinking, show);
    GenerateResult r = generate(L.model, s, L.tok, ids, opt, [&](std::string_view t) { route(t); });
    route.finish();
    std::fputc('\n', stdout);
    print_stats(r);
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
