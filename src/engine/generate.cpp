#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/error.h"
#include "engine/stop_filter.h"

namespace dsv4 {

Session new_session(Engine& e, const GenerateOptions& opt) {
  SequenceOptions so;
  so.mtp = opt.draft > 0;
  so.max_positions = opt.context_limit;  // reserved against the engine's memory budget
  return Session{e.new_sequence(so), {}};
}

namespace {

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// Puts into s.seq the longest reusable state for `prompt`, leaving at least its last token to
// feed (its logits start the generation). Returns the tokens reused.
int64_t reuse_prefix(Engine& e, Session& s, const std::vector<int32_t>& prompt, const GenerateOptions& opt) {
  const size_t cap = prompt.size() - 1;
  const size_t live = std::min(common_prefix(s.seq.tokens(), prompt), cap);
  const size_t snap = std::min(common_prefix(s.prompt_end.tokens(), prompt), cap);
  const bool live_ok = s.seq.pos() - static_cast<int64_t>(live) <= kCheapRewind && !s.seq.broken();
  const bool snap_ok = s.prompt_end.pos() > 0 && s.prompt_end.pos() - static_cast<int64_t>(snap) <= kCheapRewind;
  if (snap_ok && (!live_ok || snap > live)) {
    s.seq = e.restore(s.prompt_end);
    e.truncate(s.seq, static_cast<int64_t>(snap));
  } else if (live_ok && live > 0) {
    e.truncate(s.seq, static_cast<int64_t>(live));
  } else {
    s = new_session(e, opt);  // nothing cheap to reuse: prefill from the start
  }
  if (s.seq.mtp() != (opt.draft > 0)) s = new_session(e, opt);
  return s.seq.pos();
}

}  // namespace

int64_t check_drafts(const std::function<int32_t(const float* row)>& pick, const float* logits, int64_t V,
                     const std::vector<int32_t>& drafts, const std::function<bool(int32_t id, int64_t rows)>& take) {
  const int64_t n = static_cast<int64_t>(drafts.size());
  int64_t rows = 0;
  for (;;) {
    const int32_t id = pick(logits + rows * V);
    ++rows;
    // A right draft: its row's logits are the next ones.
    if (!take(id, rows) || rows > n || id != drafts[static_cast<size_t>(rows - 1)]) return rows;
  }
}

GenerateResult generate(Engine& e, Session& s, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                        const TextSink& sink) {
  const ModelInfo& info = e.info();
  const Tokenizer& tok = e.tokenizer();
  const int64_t V = info.vocab;
  const int64_t limit = opt.context_limit > 0 ? std::min(opt.context_limit, info.context) : info.context;
  if (prompt.empty()) throw Error("generate: empty prompt");
  if (static_cast<int64_t>(prompt.size()) >= limit)
    throw Error("prompt has " + std::to_string(prompt.size()) + " tokens; the context limit is " + std::to_string(limit) +
                " (no room to generate)");
  if (opt.max_new_tokens < 0) throw Error("max new tokens must be >= 0");
  if (opt.draft < 0 || opt.draft > kCheapRewind)
    throw Error("draft must be in [0, " + std::to_string(kCheapRewind) + "], got " + std::to_string(opt.draft));
  if (opt.draft > 0 && !info.has_mtp) throw Error(info.dir + " has no MTP block to draft with", ErrorKind::Unsupported);
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= V)
      throw Error("prompt token id " + std::to_string(prompt[i]) + " at index " + std::to_string(i) + " is outside the model's vocabulary [0, " +
                  std::to_string(V) + ")");

  GenerateResult r;
  r.reused_tokens = reuse_prefix(e, s, prompt, opt);
  std::vector<int32_t> pending(prompt.begin() + r.reused_tokens, prompt.end());
  r.prompt_tokens = static_cast<int64_t>(pending.size());
  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits;
  // An MTP sequence's step holds every row's final hc state (hc * dim floats per token) for the
  // block: long prompts go in chunks of 512 so that stays bounded (chunking changes no bits).
  constexpr int64_t kMtpChunk = 512;
  const int64_t chunk = opt.prefill_chunk > 0 ? opt.prefill_chunk
                        : opt.draft > 0       ? kMtpChunk
                                              : static_cast<int64_t>(pending.size());
  for (size_t p = 0; p < pending.size(); p += static_cast<size_t>(chunk)) {
    const size_t n = std::min<size_t>(static_cast<size_t>(chunk), pending.size() - p);
    const bool last = p + n == pending.size();
    StepRequest req;
    req.seq = &s.seq;
    req.tokens.assign(pending.begin() + static_cast<std::ptrdiff_t>(p), pending.begin() + static_cast<std::ptrdiff_t>(p + n));
    req.logits = last ? Rows::Last : Rows::None;
    std::vector<StepResult> out = e.step({req});
    if (last) logits = std::move(out[0].logits);
  }
  s.prompt_end = e.snapshot(s.seq);
  auto t1 = std::chrono::steady_clock::now();

  Sampler sampler(opt.sampling);
  StreamDecoder dec(tok);
  StopFilter filter(opt.stop_strings, sink);
  std::vector<int32_t> history = s.seq.tokens();
  r.stop_reason = "max_tokens";
  // Takes one sampled token, `consumed` tokens having been fed before it: false when
  // generation ends with it.
  auto take = [&](int32_t id, int64_t consumed) {
    if (id == info.eos) return r.stop_reason = "eos", false;
    if (std::find(opt.stop_tokens.begin(), opt.stop_tokens.end(), id) != opt.stop_tokens.end()) return r.stop_reason = "stop_token", false;
    r.tokens.push_back(id);
    history.push_back(id);
    if (filter.push(dec.push(id))) return r.stop_reason = "stop_string", false;
    if (static_cast<int64_t>(r.tokens.size()) == opt.max_new_tokens) return false;  // no need to run the model for it
    if (consumed + 1 >= limit) return r.stop_reason = "context_limit", false;
    return true;
  };
  // A JSON answer picks from masked logits (engine/json_constraint.h).
  std::optional<JsonConstraint> json;
  if (opt.json) json.emplace(std::make_shared<const JsonVocab>(tok, V, info.eos), opt.json, opt.json_after_reasoning);
  std::vector<float> scratch;
  auto pick = [&](const float* l) {
    return json ? adjusted_pick(sampler, l, V, history, {}, &*json, scratch) : sampler.sample(l, V, history);
  };
  int32_t id = opt.max_new_tokens > 0 ? pick(logits.data()) : 0;
  bool go = opt.max_new_tokens > 0 && take(id, s.seq.pos());
  // Plain greedy needs only the argmax: just the token id comes back (on cuda; on the CPU it
  // saves the copy). Any penalty needs the logits and the history, a JSON answer the logits, so
  // neither is plain.
  // Sampling without penalties runs inside the step on cuda when the kernel takes its
  // candidates (StepRequest::sampler; ModelInfo::sample_candidates), again only the id coming
  // back; the CPU picks from the logits (the same sample_logits either way).
  const SamplingParams& sp = opt.sampling;
  const bool plain = !sampler.penalised() && !json;
  const bool greedy = sp.temperature == 0.0f && plain;
  const bool device_pick = !greedy && plain && info.device == "cuda" && sampler.candidates(V) <= info.sample_candidates;
  while (go) {
    if (opt.draft == 0) {
      StepRequest req;
      req.seq = &s.seq;
      req.tokens = {id};
      req.ids_only = greedy;
      req.sampler = device_pick ? &sampler : nullptr;
      StepResult out = std::move(e.step({req})[0]);
      ++r.steps;
      id = greedy || device_pick ? out.ids[0] : pick(out.logits.data());
      go = take(id, s.seq.pos());
      continue;
    }
    // Speculative: drafts d1..dn after `id`; the main model scores id, d1..dn in one step; the
    // drafts are kept while they equal what the sampler picks; the rest are rewound.
    const int64_t room = limit - 1 - s.seq.pos() - 1;  // positions left after feeding id
    const int64_t n = std::min<int64_t>(opt.draft, std::max<int64_t>(room, 0));
    std::vector<int32_t> drafts;
    if (n > 0) drafts = e.draft({{&s.seq, id, n}})[0];
    StepRequest req;
    req.seq = &s.seq;
    req.tokens = {id};
    req.tokens.insert(req.tokens.end(), drafts.begin(), drafts.end());
    req.logits = Rows::All;
    const int64_t base = s.seq.pos();
    logits = std::move(e.step({req})[0].logits);
    ++r.steps;
    r.drafted += n;
    const int64_t used = check_drafts(pick, logits.data(), V, drafts, [&](int32_t picked, int64_t rows) {
      id = picked;
      return go = take(picked, base + rows);
    });
    r.accepted += used - 1;
    // The sequence keeps id's predecessor and the accepted drafts: base + used positions.
    if (s.seq.pos() > base + used) e.truncate(s.seq, base + used);
  }
  if (r.stop_reason != "stop_string") filter.push(dec.flush()), filter.finish();
  r.text = filter.text();
  r.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  r.decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return r;
}

}  // namespace dsv4
