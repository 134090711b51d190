#include "model/forward.h"

#include <algorithm>

#include "core/arena.h"
#include "core/error.h"
#include "model/layers.h"
#include "parallel/comm.h"

namespace dsv4 {

void Model::step(Stack stack, const std::vector<SeqInput>& in) const {
  const int64_t cap = backend_->max_rows();
  int64_t total = 0;
  for (const SeqInput& s : in) total += s.n;
  if (in.empty() || total == 0) return;
  if ((backend_->batched() || in.size() == 1) && (cap <= 0 || total <= cap)) return run(stack, in);
  // One sequence at a time, in pieces of at most `cap` rows (the pass is chunk-invariant).
  const int64_t V = w_->cfg.vocab, Hs = hidden_size();
  for (const SeqInput& s : in) {
    const int64_t piece = cap > 0 ? cap : s.n;
    for (int64_t t0 = 0; t0 < s.n; t0 += piece) {
      SeqInput p = s;
      p.n = std::min(piece, s.n - t0);
      p.tokens = s.tokens + t0;
      const bool last = t0 + p.n == s.n;
      if (s.logits == Rows::All && s.logits_out) p.logits_out = s.logits_out + t0 * V;
      if (s.logits == Rows::All && s.argmax_out) p.argmax_out = s.argmax_out + t0;
      if (s.logits == Rows::All && s.sample) p.sample = s.sample + t0;
      if (s.logits == Rows::Last && !last) p.logits = Rows::None;
      if (s.hidden_out) p.hidden_out = s.hidden_out + t0 * Hs;
      if (s.hidden_in) p.hidden_in = s.hidden_in + t0 * Hs;
      run(stack, {p});
    }
  }
}

namespace {

// A decode step padded to the backend's batch bucket (Backend::decode_bucket): the caller's
// inputs, then padding rows on the backend's scratch sequence, and the host buffers that take
// the outputs nobody asked for.
struct Padded {
  std::vector<SeqInput> inputs;
  std::vector<float> logits, hidden_in;
  std::vector<int32_t> ids;
  int32_t token = 0;  // every padding row's token
};

// Pads `in` when it is a decode step (one row per sequence) and the backend buckets; returns
// whether it did. A recorded step replays the same ops, so the step's shape must depend on the
// bucket and its tail only: when any row wants the head, every row gets it (the rows that did
// not ask, and the padding rows, into scratch buffers).
bool pad_to_bucket(Backend& be, Stack stack, const std::vector<SeqInput>& in, int64_t V, int64_t Hs, Padded& p) {
  const int64_t n = static_cast<int64_t>(in.size());
  for (const SeqInput& si : in)
    if (si.n != 1) return false;
  const int64_t B = be.decode_bucket(n);
  if (B <= 0) return false;
  DSV4_CHECK(B >= n);
  bool any_rows = false, ids_only = true;
  for (const SeqInput& si : in) {
    any_rows = any_rows || si.logits != Rows::None;
    ids_only = ids_only && (si.logits == Rows::None || (!si.logits_out && si.argmax_out));
  }
  int64_t extra = B - n;
  for (const SeqInput& si : in) extra += any_rows && si.logits == Rows::None;
  p.ids.resize(static_cast<size_t>(extra));
  if (any_rows && !ids_only) p.logits.resize(static_cast<size_t>(extra * V));
  if (stack == Stack::Mtp) p.hidden_in.assign(static_cast<size_t>(Hs), 0.0f);
  int64_t k = 0;
  // Sends row `si`'s head output to scratch slot k.
  auto to_scratch = [&](SeqInput& si) {
    si.logits = Rows::Last;
    si.logits_out = ids_only ? nullptr : p.logits.data() + k * V;
    si.argmax_out = ids_only ? p.ids.data() + k : nullptr;
    si.sample = nullptr;  // a greedy pick into scratch (it asked for no row: its sample has none)
    ++k;
  };
  p.inputs = in;
  for (SeqInput& si : p.inputs)
    if (any_rows && si.logits == Rows::None) to_scratch(si);
  for (int64_t i = n; i < B; ++i) {
    SeqInput si;
    si.st = &be.padding_sequence();
    si.tokens = &p.token;
    si.n = 1;
    si.logits = Rows::None;
    si.hidden_in = stack == Stack::Mtp ? p.hidden_in.data() : nullptr;
    if (any_rows) to_scratch(si);
    p.inputs.push_back(si);
  }
  return true;
}

}  // namespace

void Model::run(Stack stack, const std::vector<SeqInput>& given) const {
  Backend& be = *backend_;
  using Sub = Backend::Sub;
  const ModelConfig& c = w_->cfg;
  const int64_t Hs = hidden_size();
  Padded padded;
  const std::vector<SeqInput>& in = pad_to_bucket(be, stack, given, c.vocab, Hs, padded) ? padded.inputs : given;

  StepPlan plan;
  plan.stack = stack;
  std::vector<float> hidden;  // MTP: the inputs' hidden rows, back to back
  for (const SeqInput& s : in) {
    const int64_t p0 = stack == Stack::Main ? s.st->pos : s.st->mtp_pos;
    plan.seqs.push_back({s.st, plan.T(), s.n, p0});
    for (int64_t t = 0; t < s.n; ++t) {
      plan.tokens.push_back(s.tokens[t]);
      plan.pos.push_back(p0 + t);
    }
    if (stack == Stack::Mtp) hidden.insert(hidden.end(), s.hidden_in, s.hidden_in + s.n * Hs);
  }
  plan.hidden = stack == Stack::Mtp ? hidden.data() : nullptr;
  // Only the ids (greedy, or sampled when some row has sampling parameters) when no input wants
  // the logits themselves. Under TP the head's rows are split across the ranks and gathered by
  // Model::logits, which the followers (they run the leader's requests without knowing which
  // want only ids) always call: the leader must too, so it picks its ids on the host.
  bool any_rows = false, ids_only = true, sampled = false;
  for (const SeqInput& si : in) {
    any_rows = any_rows || si.logits != Rows::None;
    ids_only = ids_only && (si.logits == Rows::None || (!si.logits_out && si.argmax_out));
    sampled = sampled || (si.logits != Rows::None && si.sample);
  }
  const bool tp = shard() && shard()->tp;
  plan.tail = !any_rows             ? StepPlan::Tail::None
              : !ids_only || tp     ? StepPlan::Tail::Logits
              : sampled             ? StepPlan::Tail::Sample
                                    : StepPlan::Tail::Ids;
  // The sampled tail's rows, in head-row order (a row without parameters is greedy), in the plan
  // before begin(): a device uploads them with the token ids.
  if (plan.tail == StepPlan::Tail::Sample)
    for (const SeqInput& si : in) {
      const int64_t k = si.logits == Rows::All ? si.n : si.logits == Rows::Last ? 1 : 0;
      for (int64_t r = 0; r < k; ++r) plan.sample.push_back(si.sample ? si.sample[r] : SampleRow{});
    }
  for (const SeqInput& si : in) plan.reads_hidden = plan.reads_hidden || si.hidden_out;

  // Host temporaries of the step (all of the CPU backend's activations) are given back here.
  Arena::Scope scope(thread_arena());
  Backend::Step s = be.begin(plan);
  const int64_t l0 = stack == Stack::Main ? 0 : c.n_layers, l1 = stack == Stack::Main ? c.n_layers : c.n_layers + 1;
  for (int64_t l = l0; l < l1; ++l) {
    const LayerW& L = w_->layer(l);
    be.hc_pre(l, Sub::Attn, s);
    be.rmsnorm(s, {s.x, s.T, c.dim, &L.attn_norm, c.eps});
    attention_layer(be, c, l, L, s, shard());
    be.hc_post(s);

    be.hc_pre(l, Sub::Ffn, s);
    be.rmsnorm(s, {s.x, s.T, c.dim, &L.ffn_norm, c.eps});
    moe_layer(be, c, L, s, shard());
    be.hc_post(s);
  }
  // The caller's sequences only: padding rows leave the padding sequence at position 0.
  for (const SeqInput& si : given) (stack == Stack::Main ? si.st->pos : si.st->mtp_pos) += si.n;

  // The final hc state of the rows asked for, then hc_head -> final norm -> head, only for the
  // rows whose logits are wanted (the head is the largest single matrix).
  std::vector<int64_t> rows;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].hidden_out) continue;
    rows.clear();
    for (int64_t t = 0; t < in[i].n; ++t) rows.push_back(plan.seqs[i].t0 + t);
    be.read_hidden(s, rows, in[i].hidden_out);
  }
  rows.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    const StepSeq& q = plan.seqs[i];
    if (in[i].logits == Rows::All)
      for (int64_t t = 0; t < q.n; ++t) rows.push_back(q.t0 + t);
    if (in[i].logits == Rows::Last) rows.push_back(q.t0 + q.n - 1);
  }
  if (rows.empty()) return be.end(s);
  const int64_t n = static_cast<int64_t>(rows.size()), V = c.vocab;
  be.hc_head(stack, s, rows);
  be.rmsnorm(s, {s.x, n, c.dim, stack == Stack::Main ? &w_->norm : &w_->mtp->norm, c.eps});  // the final norm
  if (plan.tail == StepPlan::Tail::Ids || plan.tail == StepPlan::Tail::Sample) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    if (plan.tail == StepPlan::Tail::Ids) be.argmax(s, n, V, ids.data());
    else be.sample(s, n, V, ids.data());
    be.end(s);
    const int32_t* src = ids.data();
    for (const SeqInput& si : in) {
      const int64_t k = si.logits == Rows::All ? si.n : si.logits == Rows::Last ? 1 : 0;
      std::copy(src, src + k, si.argmax_out);
      src += k;
    }
    return;
  }
  // Straight into the callers' buffers when there is only one; else through one host buffer.
  if (in.size() == 1 && in[0].logits_out && !in[0].argmax_out) {
    logits(s, n, in[0].logits_out);
    return be.end(s);
  }
  std::vector<float> out(static_cast<size_t>(n * V));
  logits(s, n, out.data());
  be.end(s);
  const float* src = out.data();
  for (const SeqInput& si : in) {
    const int64_t k = si.logits == Rows::All ? si.n : si.logits == Rows::Last ? 1 : 0;
    if (si.logits_out) std::copy(src, src + k * V, si.logits_out);
    for (int64_t r = 0; r < k && si.argmax_out; ++r)
      si.argmax_out[r] = si.sample ? sample_logits(src + r * V, V, si.sample[r])
                                   : static_cast<int32_t>(std::max_element(src + r * V, src + (r + 1) * V) - (src + r * V));
    src += k * V;
  }
}

void Model::logits(Backend::Step& s, int64_t n, float* out) const {
  const Shard* sh = shard();
  if (!sh || !sh->tp) return backend_->logits(s, n, out);
  // TP: this rank's vocabulary rows, as rank blocks [n, V_r] back to back (each block n * V_r
  // floats, so one allgather in units of n floats moves them), then spread into [n, V].
  const int64_t V = w_->cfg.vocab;
  float* blk = backend_->tmp(s, Tmp::HeadRows, n * V);
  const int64_t v0 = sh->part(V, sh->rank), v1 = sh->part(V, sh->rank + 1);
  if (v1 > v0) backend_->matmul(s, {.w = &w_->head, .x = s.x, .T = n, .y = blk + n * v0, .r0 = v0, .r1 = v1});
  std::vector<int64_t> count(static_cast<size_t>(sh->world)), displ(static_cast<size_t>(sh->world));
  for (int r = 0; r < sh->world; ++r) {
    displ[r] = sh->part(V, r);
    count[r] = sh->part(V, r + 1) - displ[r];
  }
  sh->comm->allgather_rows(blk, n, count, displ);
  for (int r = 0; r < sh->world; ++r) {
    const float* b = blk + n * displ[r];
    for (int64_t t = 0; t < n; ++t) std::copy(b + t * count[r], b + (t + 1) * count[r], out + t * V + displ[r]);
  }
}

}  // namespace dsv4
