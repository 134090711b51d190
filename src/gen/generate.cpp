#include "gen/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace dsv4 {

Session new_session(const Model& m) { return Session{m.new_sequence(), {}}; }

namespace {

// Streams text while watching for stop strings: `pending` holds text not yet emitted because
// its tail might be the start of a stop string.
class StopFilter {
 public:
  StopFilter(const std::vector<std::string>& stops, const TextSink& sink, std::string& out)
      : stops_(stops), sink_(sink), out_(out) {}

  // Returns true when a stop string completed; text before it has been emitted.
  bool push(const std::string& text) {
    pending_ += text;
    size_t cut = std::string::npos;
    for (const auto& s : stops_) {
      size_t at = s.empty() ? std::string::npos : pending_.find(s);
      if (at != std::string::npos) cut = std::min(cut, at);
    }
    if (cut != std::string::npos) {
      emit(pending_.substr(0, cut));
      pending_.clear();
      return true;
    }
    size_t hold = 0;  // longest suffix of pending that is a proper prefix of a stop string
    for (const auto& s : stops_)
      for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n)
        if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
          hold = n;
          break;
        }
    // Never split a UTF-8 character when holding back.
    size_t end = pending_.size() - hold;
    while (end > 0 && end < pending_.size() && (static_cast<unsigned char>(pending_[end]) & 0xC0) == 0x80) --end;
    emit(pending_.substr(0, end));
    pending_.erase(0, end);
    return false;
  }
  void finish() {
    emit(pending_);
    pending_.clear();
  }

 private:
  void emit(const std::string& t) {
    if (t.empty()) return;
    out_ += t;
    if (sink_) sink_(t);
  }
  const std::vector<std::string>& stops_;
  const TextSink& sink_;
  std::string& out_;
  std::string pending_;
};

}  // namespace

GenerateResult generate(const Model& m, Session& s, const Tokenizer& tok, const std::vector<int32_t>& prompt,
                        const GenerateOptions& opt, const TextSink& sink) {
  const ModelConfig& c = m.config();
  const int64_t V = c.vocab;
  const int64_t limit = opt.context_limit > 0 ? opt.context_limit : (c.max_positions > 0 ? c.max_positions : INT64_MAX);
  if (prompt.empty()) throw Error("generate: empty prompt");
  if (static_cast<int64_t>(prompt.size()) >= limit)
    throw Error("prompt has " + std::to_string(prompt.size()) + " tokens; the context limit is " + std::to_string(limit) +
                " (no room to generate)");
  if (opt.max_new_tokens < 0) throw Error("max new tokens must be >= 0");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= V)
      throw Error("prompt token id " + std::to_string(prompt[i]) + " at index " + std::to_string(i) + " is outside the model's vocabulary [0, " +
                  std::to_string(V) + ")");

  // Reuse the consumed prefix when the new prompt extends it; otherwise start over.
  bool extends = s.fed.size() < prompt.size() && std::equal(s.fed.begin(), s.fed.end(), prompt.begin());
  if (!extends) s = new_session(m);
  std::vector<int32_t> pending(prompt.begin() + static_cast<std::ptrdiff_t>(s.fed.size()), prompt.end());

  GenerateResult r;
  r.prompt_tokens = static_cast<int64_t>(pending.size());
  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits(static_cast<size_t>(V));
  const int64_t chunk = opt.prefill_chunk > 0 ? opt.prefill_chunk : static_cast<int64_t>(pending.size());
  for (size_t p = 0; p < pending.size(); p += static_cast<size_t>(chunk)) {
    int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(pending.size() - p));
    const bool last = p + static_cast<size_t>(n) == pending.size();
    m.forward(s.state, pending.data() + p, n, last ? logits.data() : nullptr, Model::Logits::Last);
  }
  s.fed.insert(s.fed.end(), pending.begin(), pending.end());
  auto t1 = std::chrono::steady_clock::now();

  Sampler sampler(opt.sampling);
  StreamDecoder dec(tok);
  StopFilter filter(opt.stop_strings, sink, r.text);
  std::vector<int32_t> history = s.fed;
  r.stop_reason = "max_tokens";
  for (int64_t i = 0; i < opt.max_new_tokens; ++i) {
    int32_t id = sampler.sample(logits.data(), V, history);
    if (id == c.eos) {
      r.stop_reason = "eos";
      break;
    }
    if (std::find(opt.stop_tokens.begin(), opt.stop_tokens.end(), id) != opt.stop_tokens.end()) {
      r.stop_reason = "stop_token";
      break;
    }
    r.tokens.push_back(id);
    history.push_back(id);
    if (filter.push(dec.push(id))) {
      r.stop_reason = "stop_string";
      break;
    }
    if (i + 1 == opt.max_new_tokens) break;  // no need to run the model for a token we will not sample
    if (static_cast<int64_t>(s.fed.size()) + 1 >= limit) {
      r.stop_reason = "context_limit";
      break;
    }
    m.forward(s.state, &id, 1, logits.data());
    s.fed.push_back(id);
  }
  if (r.stop_reason != "stop_string") filter.push(dec.flush()), filter.finish();
  r.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  r.decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return r;
}

}  // namespace dsv4
