// The CPU reference backend: the steps of model/backend.h on the CPU ops (model/ops.h, cpu/),
// activations in the calling thread's arena (core/arena.h), caches in SequenceState::layers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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
// Scope Model::step holds, the temporaries of attention and MoE in one Scope per call and per
// expert, so after the first chunk no step maps fresh memory. raw(): not zero-filled, for
// buffers written in full (or, like the window ring, read only where written); buffers that
// are accumulated into are cleared where they are used.
using Buf = Floats;
Buf raw(int64_t n) { return thread_arena().take(n, /*zero=*/false); }

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
    for (int64_t l = 0; l < c.n_layers + (w_.mtp ? 1 : 0); ++l) rope_.push_back(layer_rope(c, l));
  }

  const char* name() const override { return "cpu"; }
  SequenceState new_sequence() const override { return make_sequence_state(w_.cfg, w_.mtp.has_value()); }
  SequenceState fork(const SequenceState& st) const override {
    check_mine(st);
    return fork_host_state(st);
  }
  void truncate(SequenceState& st, int64_t pos, Stack stack) const override {
    check_mine(st);
    truncate_host_state(st, w_.cfg.n_layers, pos, stack == Stack::Mtp);
  }

  Step begin(const StepPlan& plan) override {
    const ModelConfig& c = w_.cfg;
    const int64_t D = c.dim, hc = c.hc, T = plan.T();
    for (const StepSeq& q : plan.seqs) check_mine(*q.st);
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
      rmsnorm(e.data() + t * D, m.enorm.data(), D, c.eps, e.data() + t * D);
      for (int64_t i = 0; i < hc; ++i) {
        const int64_t r = t * hc + i;
        rmsnorm(plan.hidden + r * D, m.hnorm.data(), D, c.eps, h.data() + r * D);
      }
    });
    matmul(m.e_proj, e.data(), T, ep.data());
    matmul(m.h_proj, h.data(), T * hc, hp.data());
    for_each_token(T, [&](int64_t t) {
      for (int64_t i = 0; i < hc; ++i)
        for (int64_t d = 0; d < D; ++d) s.X[(t * hc + i) * D + d] = ep[t * D + d] + hp[(t * hc + i) * D + d];
    });
    return s;
  }

  void hc_pre(int64_t l, Sub sub, Step& s) override {
    const LayerW& L = layer(l);
    dsv4::hc_pre(w_.cfg, sub == Sub::Attn ? L.hc_attn : L.hc_ffn, s.X, s.T, s.x, s.post, s.comb);
  }

  void norm(int64_t l, Sub sub, Step& s) override {
    const ModelConfig& c = w_.cfg;
    const int64_t D = c.dim;
    const float* w = (sub == Sub::Attn ? layer(l).attn_norm : layer(l).ffn_norm).data();
    float* x = s.x;
    for_each_token(s.T, [&](int64_t t) { rmsnorm(x + t * D, w, D, c.eps, x + t * D); });
  }

  void hc_post(Step& s) override { dsv4::hc_post(w_.cfg, s.f, s.post, s.comb, s.X, s.T); }

  void attention(int64_t l, Step& s) override { run_attention(l, s); }

  void moe(int64_t l, Step& s) override {
    std::fill(s.f, s.f + s.T * w_.cfg.dim, 0.0f);  // the experts accumulate into it
    run_moe(layer(l), s.x, s.plan->tokens.data(), s.T, s.f);
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
    matmul(f32_weight(mix.fn.data(), hc, n), Xo.data(), nt, mixes.data());
    for_each_token(nt, [&](int64_t t) {
      const float* xf = Xo.data() + t * n;
      const float rs = inv_rms(xf, n, c.eps);
      for (int64_t i = 0; i < hc; ++i) {
        float p = sigmoid(mixes[t * hc + i] * rs * mix.scale[0] + mix.base[i]) + static_cast<float>(c.hc_eps);
        for (int64_t d = 0; d < D; ++d) y[t * D + d] += p * xf[i * D + d];
      }
    });
  }

  void final_norm(Stack stack, Step& s, int64_t nt) override {
    const ModelConfig& c = w_.cfg;
    const int64_t D = c.dim;
    const float* w = (stack == Stack::Main ? w_.norm : w_.mtp->norm).data();
    float* y = s.x;
    for_each_token(nt, [&](int64_t t) { rmsnorm(y + t * D, w, D, c.eps, y + t * D); });
  }

  void logits(Step& s, int64_t nt, float* out) override { matmul(w_.head, s.x, nt, out); }

 private:
  const LayerW& layer(int64_t l) const { return l < w_.cfg.n_layers ? w_.layers[l] : w_.mtp->block; }
  void check_mine(const SequenceState& st) const {
    const size_t want = static_cast<size_t>(w_.cfg.n_layers + (w_.mtp ? 1 : 0));
    if (st.layers.size() != want || st.device) throw Error("sequence state does not belong to this model", ErrorKind::Internal);
  }
  void run_attention(int64_t l, Step& s) const;
  void attend_sequence(const LayerW& L, const RopeTable& rope, LayerState& ls, const StepSeq& q, const float* qs, const float* kv,
                       const float* qi, const float* wi, const std::vector<RopeTable::At>& rot, float* o) const;
  void run_moe(const LayerW& L, const float* x, const int32_t* tokens, int64_t T, float* out) const;

  const ModelWeights& w_;
  std::vector<RopeTable> rope_;  // one per layer (main layers, then the MTP block)
};

void CpuBackend::run_attention(int64_t l, Step& s) const {
  const ModelConfig& c = w_.cfg;
  const LayerW& L = layer(l);
  const RopeTable& rope = rope_[l];
  const AttentionW& A = L.attn;
  const StepPlan& plan = *s.plan;
  const int64_t T = s.T, H = c.n_heads, d = c.head_dim, Qr = c.q_lora, r = c.rope_dim;
  const int64_t HI = c.index_heads, dI = c.index_dim;
  const float eps = static_cast<float>(c.eps);
  const float* x = s.x;

  // Every projection runs over all rows of the step (each weight read once); per-row work
  // takes the row's own position.
  // Queries: low-rank path, unweighted per-head norm, RoPE.
  Arena::Scope scope(thread_arena());
  Buf qr = raw(T * Qr), q = raw(T * H * d), kv = raw(T * d);
  matmul(A.wq_a, x, T, qr.data());
  for_each_token(T, [&](int64_t t) { rmsnorm(qr.data() + t * Qr, A.q_norm.data(), Qr, eps, qr.data() + t * Qr); });
  matmul(A.wq_b, qr.data(), T, q.data());
  std::vector<RopeTable::At> rot(static_cast<size_t>(T));  // per row, shared by every head and vector
  for_each_token(T, [&](int64_t t) {
    rot[t] = rope.at(plan.pos[t]);
    for (int64_t h = 0; h < H; ++h) {
      float* qh = q.data() + (t * H + h) * d;
      rmsnorm(qh, nullptr, d, eps, qh);
      rot[t].apply(qh, d);
    }
  });
  // The single KV head: norm, RoPE, FP8 simulation of the non-rope part.
  matmul(A.wkv, x, T, kv.data());
  for_each_token(T, [&](int64_t t) {
    float* k = kv.data() + t * d;
    rmsnorm(k, A.kv_norm.data(), d, eps, k);
    rot[t].apply(k, d);
    fp8sim(k, static_cast<size_t>(d - r), 64);
  });

  // Compressor rows (CSA / HCA) and indexer queries and head weights (CSA).
  const LayerKind kind = L.kind();
  Buf ca, cg, ia, ig, qi, wi;
  if (kind != LayerKind::Window) {
    const int64_t width = A.comp->coff * A.comp->out_dim;
    ca = raw(T * width);
    cg = raw(T * width);
    compress_project(*A.comp, x, T, ca.data(), cg.data());
  }
  if (kind == LayerKind::CSA) {
    const IndexerW& ix = *A.indexer;
    const int64_t iwidth = ix.comp.coff * ix.comp.out_dim;
    ia = raw(T * iwidth);
    ig = raw(T * iwidth);
    compress_project(ix.comp, x, T, ia.data(), ig.data());
    qi = raw(T * HI * dI);
    wi = raw(T * HI);
    matmul(ix.wq_b, qr.data(), T, qi.data());
    for_each_token(T, [&](int64_t t) {
      for (int64_t h = 0; h < HI; ++h) {
        float* v = qi.data() + (t * HI + h) * dI;
        rot[t].apply(v, dI);
        hadamard(v, dI);
        fp4sim(v, static_cast<size_t>(dI), 32);
      }
    });
    matmul(ix.weights_proj, x, T, wi.data());
    const float ws = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dI)) / std::sqrt(static_cast<double>(HI)));
    for (float& v : wi) v *= ws;
  }

  // Per sequence: its compressed entries for blocks closing in its rows (visible to its later
  // queries of the step), then its queries over its own keys.
  Buf o = raw(T * H * d);  // every row's heads are written by its sequence's attention
  for (const StepSeq& qs : plan.seqs) {
    LayerState& ls = qs.st->layers[l];
    if (kind != LayerKind::Window) {
      const int64_t width = A.comp->coff * A.comp->out_dim;
      std::vector<float> fresh;
      const int64_t added = compress_feed(c, *A.comp, ls.comp, rope, ca.data() + qs.t0 * width, cg.data() + qs.t0 * width, qs.n,
                                          qs.p0, false, fresh);
      for (int64_t i = 0; i < added; ++i) ls.kv.encode(fresh.data() + i * d, ls.entries.append());
      if (kind == LayerKind::CSA) {
        const CompressorW& ic = A.indexer->comp;
        const int64_t iwidth = ic.coff * ic.out_dim;
        fresh.clear();
        const int64_t added_i = compress_feed(c, ic, ls.index_comp, rope, ia.data() + qs.t0 * iwidth, ig.data() + qs.t0 * iwidth,
                                              qs.n, qs.p0, true, fresh);
        DSV4_CHECK(added_i == added);
        for (int64_t i = 0; i < added; ++i) ls.index.encode(fresh.data() + i * dI, ls.index_keys.append());
      }
    }
    attend_sequence(L, rope, ls, qs, q.data() + qs.t0 * H * d, kv.data() + qs.t0 * d,
                    kind == LayerKind::CSA ? qi.data() + qs.t0 * HI * dI : nullptr,
                    kind == LayerKind::CSA ? wi.data() + qs.t0 * HI : nullptr, rot, o.data() + qs.t0 * H * d);
  }
  for_each_token(T, [&](int64_t t) {
    for (int64_t h = 0; h < H; ++h) rot[t].apply(o.data() + (t * H + h) * d, d, /*inverse=*/true);
  });

  // Grouped low-rank output projection.
  const int64_t G = c.o_groups, Ro = c.o_lora, gw = H * d / G;
  Buf z = raw(T * G * Ro);  // each group writes its Ro columns
  for (int64_t g = 0; g < G; ++g) matmul(A.wo_a, g * Ro, (g + 1) * Ro, o.data() + g * gw, H * d, T, z.data() + g * Ro, G * Ro);
  matmul(A.wo_b, z.data(), T, s.f);
}

// One sequence's queries (rows q.t0 .. q.t0 + q.n of the step, at positions q.p0..) over its
// window and compressed entries; writes their heads to o and its window ring.
void CpuBackend::attend_sequence(const LayerW& L, const RopeTable& rope, LayerState& ls, const StepSeq& qs, const float* qv,
                                 const float* kv, const float* qi, const float* wi, const std::vector<RopeTable::At>& rot,
                                 float* o) const {
  const ModelConfig& c = w_.cfg;
  const AttentionW& A = L.attn;
  const int64_t H = c.n_heads, d = c.head_dim, W = c.window, T = qs.n, p0 = qs.p0;
  const int64_t HI = c.index_heads, dI = c.index_dim;
  const int64_t ratio = L.ratio;
  const LayerKind kind = L.kind();
  const int64_t n_entries = ls.entries.size();

  // Cached vectors decoded once per chunk where every query reads them: the window ring (only
  // positions before the chunk), all entries of an HCA layer, all indexer keys.
  const int64_t ring_n = std::min(W, p0);
  Buf ring = raw(ls.ring * d);  // only the decoded slots are read: window keys start at p0 - ring_n or later
  for (int64_t j = p0 - ring_n; j < p0; ++j) ls.kv.decode(ls.window_slot(j), ring.data() + (j % ls.ring) * d);
  // CSA entries too when a chunk has many queries (each reads up to top-k of them) and they are
  // few enough to hold decoded; else each query decodes the ones it selected.
  Buf ent, ikeys;
  const bool all_entries = kind == LayerKind::HCA || (kind == LayerKind::CSA && T > 1 && n_entries * d <= kMaxDecodedEntryFloats);
  if (all_entries) {
    ent = raw(n_entries * d);
    for_each_token(n_entries, [&](int64_t bb) { ls.kv.decode(ls.entries.row(bb), ent.data() + bb * d); });
  }
  if (kind == LayerKind::CSA) {
    ikeys = raw(n_entries * dI);
    for_each_token(n_entries, [&](int64_t bb) { ls.index.decode(ls.index_keys.row(bb), ikeys.data() + bb * dI); });
  }

  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  // Each query attends over its own keys in its own order: the window (chunk or ring), then the
  // visible compressed entries (CSA: in the indexer's top-k order). The scores of a block of
  // kQueryBlock queries are one product against the union of their keys (the block's queries as
  // the F32 weight, the keys as tokens: each score is the same canonical dot either way round),
  // then every query takes its softmax and weighted sum over its own keys.
  constexpr int64_t kQueryBlock = 16;
  std::vector<float> uk, sc, p, keys;
  std::vector<std::vector<int32_t>> top;
  std::vector<int32_t> uni, slot(static_cast<size_t>(std::max<int64_t>(n_entries, 1)), -1);
  const float* ent_src = all_entries ? ent.data() : nullptr;
  for (int64_t t0 = 0; t0 < T; t0 += kQueryBlock) {
    const int64_t B = std::min(kQueryBlock, T - t0), BH = B * H;
    const int64_t pos0 = p0 + t0, last = pos0 + B - 1;
    const int64_t first0 = std::max<int64_t>(0, pos0 - W + 1), nwin = last - first0 + 1;
    top.assign(static_cast<size_t>(B), {});
    uni.clear();
    for (int64_t b = 0; b < B; ++b) {
      const int64_t vis = ratio > 0 ? (pos0 + b + 1) / ratio : 0;  // entries whose block has closed
      if (kind == LayerKind::CSA) {
        top[b] = indexer_topk(qi + (t0 + b) * HI * dI, wi + (t0 + b) * HI, ikeys.data(), vis, HI, dI, c.index_topk);
      } else {
        top[b].resize(static_cast<size_t>(vis));
        for (int64_t i = 0; i < vis; ++i) top[b][i] = static_cast<int32_t>(i);
      }
      uni.insert(uni.end(), top[b].begin(), top[b].end());
    }
    // A block of one query (decode) keeps its own order, so its keys are the union as built.
    if (B > 1) {
      std::sort(uni.begin(), uni.end());
      uni.erase(std::unique(uni.begin(), uni.end()), uni.end());
    }
    // The union's keys: the block's window positions, then its entries.
    const int64_t nu = nwin + static_cast<int64_t>(uni.size());
    uk.resize(static_cast<size_t>(nu * d));
    float* kp = uk.data();
    for (int64_t j = first0; j <= last; ++j, kp += d) {
      const float* src = j >= p0 ? kv + (j - p0) * d : ring.data() + (j % ls.ring) * d;
      std::copy(src, src + d, kp);
    }
    for (size_t u = 0; u < uni.size(); ++u, kp += d) {
      slot[uni[u]] = static_cast<int32_t>(nwin + static_cast<int64_t>(u));
      if (ent_src != nullptr) {
        std::copy(ent_src + uni[u] * d, ent_src + (uni[u] + 1) * d, kp);
      } else {
        ls.kv.decode(ls.entries.row(uni[u]), kp);
      }
    }
    // sc[u * BH + b*H + h] = q_{b,h} . key_u
    sc.resize(static_cast<size_t>(nu * BH));
    query_key_scores(qv + t0 * H * d, BH, uk.data(), nu, d, sc.data());
    // Each query's softmax and weighted sum over its own keys in its own order. A block of one
    // (decode) uses the union as its keys and spreads its heads over the pool; a larger block
    // runs whole queries in parallel, each gathering its keys on its thread (the gathers and
    // the many small products were serial, or one pool job each). Same bits either way.
    auto attend_query = [&](int64_t b, bool on_pool, std::vector<float>& pb, std::vector<float>& kb) {
      const int64_t pos = pos0 + b, first = std::max<int64_t>(0, pos - W + 1);
      const int64_t n = pos - first + 1 + static_cast<int64_t>(top[b].size());
      const bool own = B == 1;
      pb.resize(static_cast<size_t>(H * n));
      if (!own) kb.resize(static_cast<size_t>(n * d));
      int64_t j = 0;
      auto take = [&](int64_t u) {
        for (int64_t h = 0; h < H; ++h) pb[h * n + j] = sc[u * BH + b * H + h];
        if (!own) std::copy(uk.data() + u * d, uk.data() + (u + 1) * d, kb.data() + j * d);
        ++j;
      };
      for (int64_t k = first; k <= pos; ++k) take(k - first0);
      for (int32_t e : top[b]) take(slot[e]);
      count_matmul_flops(static_cast<uint64_t>(2 * H * n * d));  // this query's scores
      attend_scores(pb.data(), H, own ? uk.data() : kb.data(), n, d, A.sink.data(), scale, o + (t0 + b) * H * d, on_pool);
    };
    if (B == 1) {
      attend_query(0, /*on_pool=*/true, p, keys);
    } else {
      thread_pool().parallel_for(B, [&](int64_t bb, int64_t be) {
        thread_local std::vector<float> pb, kb;
        for (int64_t b = bb; b < be; ++b) attend_query(b, /*on_pool=*/false, pb, kb);
      }, static_cast<int>(B));
    }
  }

  // The window ring keeps the last W + kRewind positions for later chunks.
  for (int64_t t = std::max<int64_t>(0, T - ls.ring); t < T; ++t) ls.kv.encode(kv + t * d, ls.window_slot(p0 + t));
}

void CpuBackend::run_moe(const LayerW& L, const float* x, const int32_t* tokens, int64_t T, float* out) const {
  const ModelConfig& c = w_.cfg;
  const MoEW& F = L.ffn;
  const int64_t D = c.dim, E = c.n_experts, k = c.n_active, I = c.moe_inter;
  const float lim = static_cast<float>(c.swiglu_limit);

  Arena::Scope scope(thread_arena());
  Buf logits = raw(T * E);
  matmul(F.gate, x, T, logits.data());
  // Routing: per expert, the tokens it serves and their weights.
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(E));
  std::vector<int32_t> ids(static_cast<size_t>(k));
  std::vector<float> wts(static_cast<size_t>(k));
  for (int64_t t = 0; t < T; ++t) {
    route_token(logits.data() + t * E, E, k, L.hash ? nullptr : F.bias.data(), L.hash ? F.tid2eid.data() + tokens[t] * k : nullptr,
                c.route_scale, ids.data(), wts.data());
    for (int64_t j = 0; j < k; ++j) routed[ids[j]].push_back({t, wts[j]});
  }

  auto run_expert = [&](const ExpertW& ew, const std::vector<std::pair<int64_t, float>>& toks) {
    const int64_t n = static_cast<int64_t>(toks.size());
    if (n == 0) return;
    Arena::Scope expert_scope(thread_arena());
    Buf xs = raw(n * D), g = raw(n * I), u = raw(n * I), y = raw(n * D);
    for_each_token(n, [&](int64_t i) { std::copy(x + toks[i].first * D, x + (toks[i].first + 1) * D, xs.begin() + i * D); });
    matmul(ew.w1, xs.data(), n, g.data());
    matmul(ew.w3, xs.data(), n, u.data());
    for_each_token(n, [&](int64_t i) { swiglu_clamped(g.data() + i * I, u.data() + i * I, I, lim, toks[i].second); });
    matmul(ew.w2, g.data(), n, y.data());
    // An expert serves each token at most once: rows of out are distinct.
    for_each_token(n, [&](int64_t i) {
      for (int64_t dd = 0; dd < D; ++dd) out[toks[i].first * D + dd] += y[i * D + dd];
    });
  };
  for (int64_t e = 0; e < E; ++e) run_expert(F.experts[e], routed[e]);
  std::vector<std::pair<int64_t, float>> all;
  for (int64_t t = 0; t < T; ++t) all.push_back({t, 1.0f});
  run_expert(F.shared, all);
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const ModelWeights& w) { return std::make_unique<CpuBackend>(w); }

}  // namespace dsv4
