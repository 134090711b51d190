// The CPU reference backend: the ops of model/backend.h on the CPU ops (backends/cpu/ops.h,
// kernels/cpu), activations in the calling thread's arena (core/arena.h), caches in
// SequenceState::layers.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/arena.h"
#include "core/error.h"
#include "core/formats.h"
#include "core/threads.h"
#include "backends/cpu/attention.h"
#include "model/backend.h"
#include "backends/cpu/compressor.h"
#include "backends/cpu/mhc.h"
#include "backends/cpu/moe.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/cpu_backend.h"

namespace dsv4 {

namespace {

// Activations live in the calling thread's arena (core/arena.h): the step's buffers in the
// Scope Model::step holds, the sublayers' temporaries (Backend::tmp) in the Scope each
// sublayer and each expert holds (model/attention_layer.cpp, moe_layer.cpp), an op's own
// scratch in a Scope of the op, so after the first chunk no step maps fresh memory. raw(): not zero-filled, for
// buffers written in full (or, like the window ring, read only where written); buffers that
// are accumulated into are cleared where they are used.
using Buf = Floats;
Buf raw(int64_t n) { return thread_arena().take(n, /*zero=*/false); }

// Element-wise work up to this many floats runs on the calling thread (scatter_add).
constexpr int64_t kInlineFloats = 16384;

// Decoded CSA entries held at once for a chunk (floats): 64 MiB.
constexpr int64_t kMaxDecodedEntryFloats = int64_t{16} << 20;

// fn(t) for t in [0, n) over the pool: for per-token work whose results do not depend on how
// the tokens are split.
template <class Fn>
void for_each_token(int64_t n, Fn&& fn) {
  thread_pool().parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) fn(t);
  });
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const ModelWeights& w) : w_(w) {
    const ModelConfig& c = w_.cfg;
    for (int64_t l = 0; l < c.n_layers + (w_.mtp ? 1 : 0); ++l) {
      rope_.push_back(layer_rope(c, l));
      int64_t same = 0;  // the first layer with the same table (layers share their step's rotations)
      while (rope_[same].freq != rope_[l].freq) ++same;
      if (same == l) rot_.emplace_back();
      rot_of_.push_back(same == l ? static_cast<int64_t>(rot_.size()) - 1 : rot_of_[same]);
    }
  }

  const char* name() const override { return "cpu"; }
  SequenceState new_sequence() const override { return make_sequence_state(w_.cfg, w_.mtp.has_value()); }
  SequenceState fork(const SequenceState& st) const override {
    check_mine(st);
    return fork_host_state(st);
  }
  void truncate(SequenceState& st, int64_t pos, Stack stack) const override {
    check_mine(st);
    truncate_host_state(st, w_.cfg.n_layers, pos, stack);
  }

  Step begin(const StepPlan& plan) override {
    const ModelConfig& c = w_.cfg;
    const int64_t D = c.dim, hc = c.hc, T = plan.T();
    for (const StepSeq& q : plan.seqs) check_mine(*q.st);
    ++step_;  // the cached rotations are of the previous step
    Step s;
    s.plan = &plan;
    s.T = T;
    s.X = raw(T * hc * D).data();
    s.x = raw(T * D).data();
    s.post = raw(T * hc).data();
    s.comb = raw(T * hc * hc).data();
    s.f = raw(T * D).data();  // attention writes it in full; moe zeroes it first
    if (plan.stack == Stack::Main) {
      for_each_token(T, [&](int64_t t) {
        float* x0 = s.X + t * hc * D;
        dequant_row(w_.embed, plan.tokens[t], x0);
        for (int64_t i = 1; i < hc; ++i) std::copy(x0, x0 + D, x0 + i * D);
      });
      return s;
    }
    // MTP block input (MODEL.md "MTP block"): e_proj . RMSNorm(embed[u], enorm) broadcast to
    // every copy, plus h_proj . RMSNorm(h_i, hnorm) per copy of the main model's final state.
    DSV4_CHECK(w_.mtp && plan.hidden);
    const MtpW& m = *w_.mtp;
    Arena::Scope scope(thread_arena());
    Buf e = raw(T * D), h = raw(T * hc * D), ep = raw(T * D), hp = raw(T * hc * D);
    for_each_token(T, [&](int64_t t) {
      dequant_row(w_.embed, plan.tokens[t], e.data() + t * D);
      dsv4::rmsnorm(e.data() + t * D, m.enorm.data(), D, c.eps, e.data() + t * D);
      for (int64_t i = 0; i < hc; ++i) {
        const int64_t r = t * hc + i;
        dsv4::rmsnorm(plan.hidden + r * D, m.hnorm.data(), D, c.eps, h.data() + r * D);
      }
    });
    dsv4::matmul(m.e_proj, e.data(), T, ep.data());
    dsv4::matmul(m.h_proj, h.data(), T * hc, hp.data());
    for_each_token(T, [&](int64_t t) {
      for (int64_t i = 0; i < hc; ++i)
        for (int64_t d = 0; d < D; ++d) s.X[(t * hc + i) * D + d] = ep[t * D + d] + hp[(t * hc + i) * D + d];
    });
    return s;
  }

  float* tmp(Step&, Tmp, int64_t n) override { return raw(n).data(); }
  // int32 views of arena floats (same size and alignment; only ever accessed as int32).
  int32_t* tmp_ints(Step&, Tmp, int64_t n) override { return reinterpret_cast<int32_t*>(raw(n).data()); }

  void hc_pre(int64_t l, Sub sub, Step& s) override {
    const LayerW& L = w_.layer(l);
    dsv4::hc_pre(w_.cfg, sub == Sub::Attn ? L.hc_attn : L.hc_ffn, s.X, s.T, s.x, s.post, s.comb);
  }
  void hc_post(Step& s) override { dsv4::hc_post(w_.cfg, s.f, s.post, s.comb, s.X, s.T); }

  void matmul(Step&, const Matmul& m) override {
    const int64_t r1 = m.r1 < 0 ? m.w->rows : m.r1;
    dsv4::matmul(*m.w, m.r0, r1, m.x, m.ldx < 0 ? m.w->cols : m.ldx, m.T, m.y, m.ldy < 0 ? r1 - m.r0 : m.ldy);
  }

  void matmuls(Step&, const Matmul* m, int64_t n) override { dsv4::matmul_many(m, n); }
  // A decode step's routed rows all at once (T * k: 48 at batch 8), so that its experts' matmuls
  // make one job; from 512 rows on, as many as a step's own rows (larger experts run the GEMM
  // path one by one anyway, and the temporaries stay ~25 MB).
  int64_t expert_rows_at_once(const Step& s) const override { return std::max<int64_t>(s.T, 512); }

  void rmsnorm(Step&, const RmsNorm& n) override {
    const float* w = n.weight ? n.weight->data() : nullptr;
    for_each_token(n.rows, [&](int64_t t) { dsv4::rmsnorm(n.x + t * n.dim, w, n.dim, n.eps, n.x + t * n.dim); });
  }

  void vec_ops(Step& s, const VecOps& v) override {
    const std::vector<RopeTable::At>* rot = v.rope == RopeDir::None ? nullptr : &rotations(v.layer, s);
    const float* w = v.weight ? v.weight->data() : nullptr;
    const int64_t nope = v.dim - w_.cfg.rope_dim;
    for_each_token(s.T, [&](int64_t t) {
      for (int64_t h = 0; h < v.heads; ++h) {
        float* x = v.v + (t * v.heads + h) * v.dim;
        if (v.norm == VecNorm::Rms) dsv4::rmsnorm(x, w, v.dim, v.eps, x);
        if (rot) (*rot)[t].apply(x, v.dim, v.rope == RopeDir::Inverse);
        if (v.sim == QuantSim::Fp8) fp8sim(x, static_cast<size_t>(nope), 64);
        if (v.sim == QuantSim::HadamardFp4) {
          hadamard(x, v.dim);
          fp4sim(x, static_cast<size_t>(v.dim), 32);
        }
      }
    });
  }

  void scale(Step&, float* x, int64_t n, float factor) override {
    for (int64_t i = 0; i < n; ++i) x[i] *= factor;
  }

  void compress(Step& s, const CompressFeed& f) override;
  void index_topk(Step& s, const IndexTopk& k) override;
  void attend(Step& s, const Attend& a) override;

  void route(Step& s, const Route& r) override {
    const ModelConfig& c = w_.cfg;
    const int64_t E = c.n_experts, k = c.n_active;
    const bool hash = r.by == RouteBy::Hash;
    for (int64_t t = 0; t < s.T; ++t)
      route_token(r.logits + t * E, E, k, hash ? nullptr : r.w->bias.data(),
                  hash ? r.w->tid2eid.data() + s.plan->tokens[t] * k : nullptr, c.route_scale, r.ids + t * k, r.weights + t * k);
  }
  RowList dispatch(Step&, const std::vector<int32_t>& rows, const std::vector<float>& weights) override {
    return {rows.data(), weights.data()};  // already in the CPU's memory
  }
  void zero_f(Step& s) override { std::fill(s.f, s.f + s.T * w_.cfg.dim, 0.0f); }
  void gather(Step&, const float* x, const int32_t* rows, int64_t n, int64_t dim, float* y) override {
    for_each_token(n, [&](int64_t i) { std::copy(x + rows[i] * dim, x + (rows[i] + 1) * dim, y + i * dim); });
  }
  void scatter_add(Step&, const float* y, const int32_t* rows, int64_t n, int64_t dim, float* out) override {
    // One expert's rows of a decode step (1-3 of them) on the calling thread: a few thousand
    // additions cost less than a meeting of the pool, and a batch-8 step has ~100 of these.
    if (n * dim <= kInlineFloats) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < dim; ++j) out[rows[i] * dim + j] += y[i * dim + j];
      return;
    }
    for_each_token(n, [&](int64_t i) {
      for (int64_t j = 0; j < dim; ++j) out[rows[i] * dim + j] += y[i * dim + j];
    });
  }
  void swiglu(Step&, const Swiglu& g) override {
    for_each_token(g.rows, [&](int64_t i) { swiglu_clamped(g.g + i * g.n, g.u + i * g.n, g.n, g.limit, g.w ? g.w[i] : 1.0f); });
  }
  void add(Step&, float* y, const float* x, int64_t n) override {
    thread_pool().parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) y[i] += x[i];
    });
  }

  void read_hidden(Step& s, const std::vector<int64_t>& rows, float* out) override {
    const int64_t n = w_.cfg.hc * w_.cfg.dim;
    for (size_t i = 0; i < rows.size(); ++i) std::copy(s.X + rows[i] * n, s.X + (rows[i] + 1) * n, out + i * n);
  }

  void hc_head(Stack stack, Step& s, const std::vector<int64_t>& rows) override {
    const ModelConfig& c = w_.cfg;
    const int64_t D = c.dim, hc = c.hc, n = hc * D, nt = static_cast<int64_t>(rows.size());
    const HcMixW& mix = stack == Stack::Main ? w_.hc_head : w_.mtp->hc_head;
    // The wanted rows of X, gathered (in the step's Scope): x may alias none of them.
    Buf Xo = raw(nt * n), mixes = raw(nt * hc);
    for_each_token(nt, [&](int64_t t) { std::copy(s.X + rows[t] * n, s.X + (rows[t] + 1) * n, Xo.data() + t * n); });
    float* y = s.x;
    std::fill(y, y + nt * D, 0.0f);
    dsv4::matmul(f32_weight(mix.fn.data(), hc, n), Xo.data(), nt, mixes.data());
    for_each_token(nt, [&](int64_t t) {
      const float* xf = Xo.data() + t * n;
      const float rs = inv_rms(xf, n, c.eps);
      for (int64_t i = 0; i < hc; ++i) {
        float p = sigmoid(mixes[t * hc + i] * rs * mix.scale[0] + mix.base[i]) + static_cast<float>(c.hc_eps);
        for (int64_t d = 0; d < D; ++d) y[t * D + d] += p * xf[i * D + d];
      }
    });
  }

  void logits(Step& s, int64_t nt, float* out) override { dsv4::matmul(w_.head, s.x, nt, out); }

 private:
  void block_entries(const Attend& a, const LayerW& L, int64_t row0, int64_t pos0, int64_t B,
                     std::vector<std::vector<int32_t>>& top, std::vector<int32_t>& uni) const;
  void check_mine(const SequenceState& st) const {
    const size_t want = static_cast<size_t>(w_.cfg.n_layers + (w_.mtp ? 1 : 0));
    if (st.layers.size() != want || st.device) throw Error("sequence state does not belong to this model", ErrorKind::Internal);
  }
  // The rotations of the step's rows with layer l's table: cos/sin (in double) made once per
  // step and table, shared by the queries, KV, indexer queries and outputs of every layer with it.
  const std::vector<RopeTable::At>& rotations(int64_t l, const Step& s) {
    Rotations& r = rot_[rot_of_[l]];
    if (r.step != step_) {
      r.rot.resize(static_cast<size_t>(s.T));
      for_each_token(s.T, [&](int64_t t) { r.rot[t] = rope_[l].at(s.plan->pos[t]); });
      r.step = step_;
    }
    return r.rot;
  }

  const ModelWeights& w_;
  std::vector<RopeTable> rope_;  // one per layer (main layers, then the MTP block)
  struct Rotations {
    uint64_t step = 0;
    std::vector<RopeTable::At> rot;  // [T]
  };
  std::vector<Rotations> rot_;   // one per distinct table
  std::vector<int64_t> rot_of_;  // per layer: its entry of rot_
  uint64_t step_ = 0;            // steps begun
};

void CpuBackend::compress(Step&, const CompressFeed& f) {
  const StageTimer timer("compressor", f.which == Comp::Index ? "(indexer keys)" : "(entries)");
  const ModelConfig& c = w_.cfg;
  const AttentionW& A = w_.layer(f.layer).attn;
  const StepSeq& q = *f.seq;
  LayerState& ls = q.st->layers[f.layer];
  const bool index = f.which == Comp::Index;
  const CompressorW& cw = index ? A.indexer->comp : *A.comp;
  const int64_t width = cw.coff * cw.out_dim, dout = cw.out_dim;
  std::vector<float> fresh;
  const int64_t added = compress_feed(c, cw, index ? ls.index_comp : ls.comp, rope_[f.layer], f.a + q.t0 * width,
                                      f.g + q.t0 * width, q.n, q.p0, f.which, fresh);
  for (int64_t i = 0; i < added; ++i) {
    if (index) {
      ls.index.encode(fresh.data() + i * dout, ls.index_keys.append());
    } else {
      ls.kv.encode(fresh.data() + i * dout, ls.entries.append());
    }
  }
  if (index) DSV4_CHECK(ls.index_keys.size() == ls.entries.size());  // one key per entry
}

void CpuBackend::index_topk(Step& s, const IndexTopk& k) {
  const StageTimer timer("indexer scan + top-k");
  const ModelConfig& c = w_.cfg;
  const StepSeq& q = *k.seq;
  const LayerState& ls = q.st->layers[k.layer];
  const int64_t HI = c.index_heads, dI = c.index_dim, K = c.index_topk, ratio = w_.layer(k.layer).ratio;
  // The keys as cached (FP4), page by page; queries in blocks of kIndexerBlock share one scan.
  thread_local std::vector<const uint8_t*> pages;  // grows to the longest context, then reused
  pages.resize(static_cast<size_t>(ls.index_keys.pages()));
  for (int64_t p = 0; p < ls.index_keys.pages(); ++p) pages[p] = ls.index_keys.row(p * RowStore::kRowsPerPage);
  const Fp4Keys keys{pages.data(), RowStore::kRowsPerPage, static_cast<int64_t>(ls.index_keys.row_bytes())};
  constexpr int64_t kIndexerBlock = 16;
  int64_t vis[kIndexerBlock];
  for (int64_t t0 = q.t0; t0 < q.t0 + q.n; t0 += kIndexerBlock) {
    const int64_t nq = std::min(kIndexerBlock, q.t0 + q.n - t0);
    for (int64_t i = 0; i < nq; ++i) vis[i] = (s.plan->pos[t0 + i] + 1) / ratio;  // entries whose block has closed
    indexer_select(k.q + t0 * HI * dI, k.w + t0 * HI, nq, vis, keys, HI, dI, K, k.sel + t0 * K, k.sel_n + t0);
  }
}

// The compressed entries each of the B queries from step row `row0` (position pos0) reads, in
// its order: the indexer's top-k (CSA), else every entry whose block has closed; `uni` gets
// their union, sorted, or (a block of one query: decode) as the query's own order.
void CpuBackend::block_entries(const Attend& a, const LayerW& L, int64_t row0, int64_t pos0, int64_t B,
                               std::vector<std::vector<int32_t>>& top, std::vector<int32_t>& uni) const {
  const int64_t K = w_.cfg.index_topk;
  top.assign(static_cast<size_t>(B), {});
  uni.clear();
  for (int64_t b = 0; b < B; ++b) {
    if (a.sel) {
      const int64_t row = row0 + b;
      top[b].assign(a.sel + row * K, a.sel + row * K + a.sel_n[row]);
    } else {
      const int64_t vis = L.kind() != LayerKind::Window ? (pos0 + b + 1) / L.ratio : 0;
      top[b].resize(static_cast<size_t>(vis));
      for (int64_t i = 0; i < vis; ++i) top[b][i] = static_cast<int32_t>(i);
    }
    uni.insert(uni.end(), top[b].begin(), top[b].end());
  }
  if (B > 1) {
    std::sort(uni.begin(), uni.end());
    uni.erase(std::unique(uni.begin(), uni.end()), uni.end());
  }
}

// One sequence's queries (rows q.t0 .. q.t0 + q.n of the step, at positions q.p0..) over its
// window and compressed entries; writes their heads to out and its window ring.
void CpuBackend::attend(Step&, const Attend& a) {
  const ModelConfig& c = w_.cfg;
  const LayerW& L = w_.layer(a.layer);
  const StageTimer timer("attend", L.kind() == LayerKind::Window ? "window" : L.kind() == LayerKind::CSA ? "CSA" : "HCA");
  const StepSeq& qs = *a.seq;
  LayerState& ls = qs.st->layers[a.layer];
  const int64_t H = a.heads < 0 ? c.n_heads : a.heads, d = c.head_dim, W = c.window, T = qs.n, p0 = qs.p0;
  const float* sink = L.attn.sink.data() + a.h0;
  const LayerKind kind = L.kind();
  const int64_t n_entries = ls.entries.size();
  const float* qv = a.q + qs.t0 * H * d;
  const float* kv = a.kv + qs.t0 * d;
  float* o = a.out + qs.t0 * H * d;

  // Cached vectors decoded once per chunk where every query reads them: the window ring (only
  // positions before the chunk), all entries of an HCA layer.
  Arena::Scope scope(thread_arena());
  const int64_t ring_n = std::min(W, p0);
  Buf ring = raw(ls.ring * d);  // only the decoded slots are read: window keys start at p0 - ring_n or later
  for (int64_t j = p0 - ring_n; j < p0; ++j) ls.kv.decode(ls.window_slot(j), ring.data() + (j % ls.ring) * d);
  // CSA entries too when a chunk has many queries (each reads up to top-k of them) and they are
  // few enough to hold decoded; else each query decodes the ones it selected.
  Buf ent;
  const bool all_entries = kind == LayerKind::HCA || (kind == LayerKind::CSA && T > 1 && n_entries * d <= kMaxDecodedEntryFloats);
  if (all_entries) {
    ent = raw(n_entries * d);
    for_each_token(n_entries, [&](int64_t bb) { ls.kv.decode(ls.entries.row(bb), ent.data() + bb * d); });
  }

  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  // Each query attends over its own keys in its own order: the window (chunk or ring), then the
  // visible compressed entries (CSA: in the indexer's top-k order). The scores of a block of
  // kQueryBlock queries are one product against the union of their keys (query_key_scores: each
  // score is one fma chain over d, the same float in any product), then every query takes its
  // softmax and weighted sum over its own keys.
  constexpr int64_t kQueryBlock = 16;
  // Per-query scoring is taken when the union's product has at least this many times more dots
  // (its products are smaller: bench/attention_bench, docs/perf.md "Session 35").
  constexpr int64_t kOwnScoresCost = 2;
  // The union's keys are read where they lie (the chunk, the ring, the decoded entries) through
  // row pointers; only entries not decoded up front are decoded, into dec.
  std::vector<float> sc, p, dec;
  std::vector<const float*> ur, rows;
  std::vector<std::vector<int32_t>> top;
  std::vector<int32_t> uni, slot(static_cast<size_t>(std::max<int64_t>(n_entries, 1)), -1);
  const float* ent_src = all_entries ? ent.data() : nullptr;
  for (int64_t t0 = 0; t0 < (H > 0 ? T : 0); t0 += kQueryBlock) {  // H = 0: a rank without heads (TP)
    const int64_t B = std::min(kQueryBlock, T - t0), BH = B * H;
    const int64_t pos0 = p0 + t0, last = pos0 + B - 1;
    const int64_t first0 = std::max<int64_t>(0, pos0 - W + 1), nwin = last - first0 + 1;
    block_entries(a, L, qs.t0 + t0, pos0, B, top, uni);
    // The union's keys: the block's window positions, then its entries.
    const int64_t nu = nwin + static_cast<int64_t>(uni.size());
    ur.resize(static_cast<size_t>(nu));
    for (int64_t j = first0; j <= last; ++j) ur[j - first0] = j >= p0 ? kv + (j - p0) * d : ring.data() + (j % ls.ring) * d;
    if (ent_src == nullptr) dec.resize(uni.size() * static_cast<size_t>(d));
    for (size_t u = 0; u < uni.size(); ++u) {
      slot[uni[u]] = static_cast<int32_t>(nwin + static_cast<int64_t>(u));
      if (ent_src != nullptr) {
        ur[nwin + u] = ent_src + uni[u] * d;
      } else {
        ls.kv.decode(ls.entries.row(uni[u]), dec.data() + u * d);
        ur[nwin + u] = dec.data() + u * d;
      }
    }
    // Scoring the block's queries against the union of their keys costs B x nu dots; each query
    // against its own keys, the sum of their counts. At long contexts the CSA queries' top-k
    // differ (the union grows towards B x top-k) and the union wastes most of its product; there
    // each query is scored on its own (the same dots: the same bits).
    int64_t own_keys = 0;
    for (int64_t b = 0; b < B; ++b) own_keys += pos0 + b - std::max<int64_t>(0, pos0 + b - W + 1) + 1 + static_cast<int64_t>(top[b].size());
    const bool per_query = B > 1 && own_keys * kOwnScoresCost <= nu * B;
    if (!per_query) {
      // sc[(b*H + h) * nu + u] = q_{b,h} . key_u
      sc.resize(static_cast<size_t>(nu * BH));
      query_key_scores(qv + t0 * H * d, BH, ur.data(), nu, d, sc.data());
    }
    // Each query's softmax and weighted sum over its own keys in its own order (row pointers into
    // the union's; the keys themselves are not copied). A block of one (decode) spreads its heads
    // over the pool; a larger block runs whole queries in parallel, each on its thread (the many
    // small products were serial, or one pool job each). Same bits either way.
    // Per query, its scores are either taken from the block's product or (per_query: the
    // query on the pool, one at a time) computed over its own keys.
    auto attend_query = [&](int64_t b, RunOn where, std::vector<float>& pb, std::vector<const float*>& kr) {
      const int64_t pos = pos0 + b, first = std::max<int64_t>(0, pos - W + 1);
      const int64_t n = pos - first + 1 + static_cast<int64_t>(top[b].size());
      pb.resize(static_cast<size_t>(H * n));
      kr.resize(static_cast<size_t>(n));
      int64_t j = 0;
      auto take = [&](int64_t u) {
        if (!per_query)
          for (int64_t h = 0; h < H; ++h) pb[h * n + j] = sc[(b * H + h) * nu + u];
        kr[j++] = ur[u];
      };
      for (int64_t k = first; k <= pos; ++k) take(k - first0);
      for (int32_t e : top[b]) take(slot[e]);
      if (per_query) query_key_scores(qv + (t0 + b) * H * d, H, kr.data(), n, d, pb.data());  // pb[h * n + j]
      count_matmul_flops(static_cast<uint64_t>(2 * H * n * d));  // this query's scores
      attend_scores(pb.data(), H, kr.data(), n, d, sink, scale, o + (t0 + b) * H * d, where);
    };
    if (B == 1) {
      attend_query(0, RunOn::Pool, p, rows);
    } else if (per_query) {
      for (int64_t b = 0; b < B; ++b) attend_query(b, RunOn::Pool, p, rows);
    } else {
      thread_pool().parallel_for(B, [&](int64_t bb, int64_t be) {
        thread_local std::vector<float> pb;
        thread_local std::vector<const float*> kr;
        for (int64_t b = bb; b < be; ++b) attend_query(b, RunOn::Caller, pb, kr);
      }, static_cast<int>(B));
    }
  }

  // The window ring keeps the last W + kRewind positions for later chunks.
  for (int64_t t = std::max<int64_t>(0, T - ls.ring); t < T; ++t) ls.kv.encode(kv + t * d, ls.window_slot(p0 + t));
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const ModelWeights& w) { return std::make_unique<CpuBackend>(w); }

}  // namespace dsv4
