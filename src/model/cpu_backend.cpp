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
#include "model/attention.h"
#include "model/backend.h"
#include "model/compressor.h"
#include "model/mhc.h"
#include "model/moe.h"
#include "model/ops.h"

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

// Appends n vectors (floats, back to back) to a byte cache in the codec's compact form.
template <class Codec>
void append_encoded(const Codec& codec, const std::vector<float>& v, int64_t n, std::vector<uint8_t>& cache) {
  const size_t at = cache.size(), nb = codec.bytes(), dim = v.size() / static_cast<size_t>(std::max<int64_t>(n, 1));
  cache.resize(at + static_cast<size_t>(n) * nb);
  for (int64_t i = 0; i < n; ++i) codec.encode(v.data() + i * dim, cache.data() + at + i * nb);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const ModelWeights& w) : w_(w) {
    const ModelConfig& c = w_.cfg;
    for (int64_t l = 0; l < c.n_layers; ++l) rope_.push_back(layer_rope(c, l));
  }

  const char* name() const override { return "cpu"; }
  SequenceState new_sequence() const override { return make_sequence_state(w_.cfg); }

  Step begin(SequenceState& st, const int32_t* tokens, int64_t T) override {
    const ModelConfig& c = w_.cfg;
    const int64_t D = c.dim, hc = c.hc;
    if (static_cast<int64_t>(st.layers.size()) != c.n_layers || st.device)
      throw Error("sequence state does not belong to this model");
    Step s;
    s.T = T;
    s.p0 = st.pos;
    s.tokens = tokens;
    s.X = raw(T * hc * D).data();
    s.x = raw(T * D).data();
    s.post = raw(T * hc).data();
    s.comb = raw(T * hc * hc).data();
    s.f = raw(T * D).data();  // attention writes it in full; moe zeroes it first
    std::vector<float> e(static_cast<size_t>(D));
    for (int64_t t = 0; t < T; ++t) {
      dequant_row(w_.embed, tokens[t], e.data());
      for (int64_t i = 0; i < hc; ++i) std::copy(e.begin(), e.end(), s.X + (t * hc + i) * D);
    }
    return s;
  }

  void hc_pre(int64_t l, Sub sub, Step& s) override {
    const LayerW& L = w_.layers[l];
    dsv4::hc_pre(w_.cfg, sub == Sub::Attn ? L.hc_attn : L.hc_ffn, s.X, s.T, s.x, s.post, s.comb);
  }

  void norm(int64_t l, Sub sub, Step& s) override {
    const ModelConfig& c = w_.cfg;
    const int64_t D = c.dim;
    const float* w = (sub == Sub::Attn ? w_.layers[l].attn_norm : w_.layers[l].ffn_norm).data();
    float* x = s.x;
    for_each_token(s.T, [&](int64_t t) { rmsnorm(x + t * D, w, D, c.eps, x + t * D); });
  }

  void hc_post(Step& s) override { dsv4::hc_post(w_.cfg, s.f, s.post, s.comb, s.X, s.T); }

  void attention(int64_t l, SequenceState& st, Step& s) override {
    run_attention(w_.layers[l], rope_[l], st.layers[l], s.x, s.T, s.p0, s.f);
  }

  void moe(int64_t l, Step& s) override {
    std::fill(s.f, s.f + s.T * w_.cfg.dim, 0.0f);  // the experts accumulate into it
    run_moe(w_.layers[l], s.x, s.tokens, s.T, s.f);
  }

  void hc_head(Step& s, int64_t t0, int64_t nt) override {
    const ModelConfig& c = w_.cfg;
    const int64_t D = c.dim, hc = c.hc, n = hc * D;
    float* y = s.x;
    std::fill(y, y + nt * D, 0.0f);
    Buf mixes = raw(nt * hc);  // in the step's Scope
    const float* Xo = s.X + t0 * n;
    matmul(f32_weight(w_.hc_head.fn.data(), hc, n), Xo, nt, mixes.data());
    for_each_token(nt, [&](int64_t t) {
      const float* xf = Xo + t * n;
      const float rs = inv_rms(xf, n, c.eps);
      for (int64_t i = 0; i < hc; ++i) {
        float p = sigmoid(mixes[t * hc + i] * rs * w_.hc_head.scale[0] + w_.hc_head.base[i]) + static_cast<float>(c.hc_eps);
        for (int64_t d = 0; d < D; ++d) y[t * D + d] += p * xf[i * D + d];
      }
    });
  }

  void final_norm(Step& s, int64_t nt) override {
    const ModelConfig& c = w_.cfg;
    const int64_t D = c.dim;
    float* y = s.x;
    for_each_token(nt, [&](int64_t t) { rmsnorm(y + t * D, w_.norm.data(), D, c.eps, y + t * D); });
  }

  void logits(Step& s, int64_t nt, float* out) override { matmul(w_.head, s.x, nt, out); }

 private:
  void run_attention(const LayerW& L, const RopeTable& rope, LayerState& ls, const float* x, int64_t T, int64_t p0, float* out) const;
  void run_moe(const LayerW& L, const float* x, const int32_t* tokens, int64_t T, float* out) const;

  const ModelWeights& w_;
  std::vector<RopeTable> rope_;  // one per main layer
};

void CpuBackend::run_attention(const LayerW& L, const RopeTable& rope, LayerState& ls, const float* x, int64_t T, int64_t p0,
                               float* out) const {
  const ModelConfig& c = w_.cfg;
  const AttentionW& A = L.attn;
  const int64_t H = c.n_heads, d = c.head_dim, W = c.window, Qr = c.q_lora, r = c.rope_dim;
  const float eps = static_cast<float>(c.eps);

  // Queries: low-rank path, unweighted per-head norm, RoPE.
  Arena::Scope scope(thread_arena());
  Buf qr = raw(T * Qr), q = raw(T * H * d), kv = raw(T * d);
  matmul(A.wq_a, x, T, qr.data());
  for_each_token(T, [&](int64_t t) { rmsnorm(qr.data() + t * Qr, A.q_norm.data(), Qr, eps, qr.data() + t * Qr); });
  matmul(A.wq_b, qr.data(), T, q.data());
  std::vector<RopeTable::At> rot(static_cast<size_t>(T));  // per token of the chunk, shared by every head and vector
  for_each_token(T, [&](int64_t t) {
    rot[t] = rope.at(p0 + t);
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

  // Compressed entries for blocks closing in this chunk (visible to later queries of the chunk).
  const int64_t ratio = L.ratio;
  if (ratio > 0) {
    std::vector<float> fresh;
    const int64_t added = compress(c, *A.comp, ls.comp, rope, x, T, p0, false, fresh);
    append_encoded(ls.kv, fresh, added, ls.entries);
    if (ratio == 4) {
      fresh.clear();
      const int64_t added_i = compress(c, A.indexer->comp, ls.index_comp, rope, x, T, p0, true, fresh);
      if (added_i != added) throw Error("internal: indexer and main compressor disagree");
      append_encoded(ls.index, fresh, added, ls.index_keys);
    }
    ls.n_entries += added;
  }

  // Indexer queries and head weights (ratio 4 only).
  const int64_t HI = c.index_heads, dI = c.index_dim;
  Buf qi, wi;
  if (ratio == 4) {
    const IndexerW& ix = *A.indexer;
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

  // Cached vectors decoded once per chunk where every query reads them: the window ring (only
  // positions before the chunk), all entries of a plain-compressed layer, all indexer keys.
  const size_t kvb = ls.kv.bytes();
  const int64_t ring_n = std::min(W, p0);
  Buf ring = raw(W * d);  // only the decoded slots are read: window keys start at p0 - ring_n or later
  for (int64_t j = p0 - ring_n; j < p0; ++j) ls.kv.decode(ls.window_kv.data() + (j % W) * kvb, ring.data() + (j % W) * d);
  // CSA entries too when a chunk has many queries (each reads up to top-k of them) and they are
  // few enough to hold decoded; else each query decodes the ones it selected.
  Buf ent, ikeys;
  const bool all_entries = ratio > 0 && (ratio != 4 || (T > 1 && ls.n_entries * d <= kMaxDecodedEntryFloats));
  if (all_entries) {
    ent = raw(ls.n_entries * d);
    for_each_token(ls.n_entries, [&](int64_t bb) { ls.kv.decode(ls.entries.data() + bb * kvb, ent.data() + bb * d); });
  }
  if (ratio == 4) {
    ikeys = raw(ls.n_entries * dI);
    for_each_token(ls.n_entries, [&](int64_t bb) { ls.index.decode(ls.index_keys.data() + bb * ls.index.bytes(), ikeys.data() + bb * dI); });
  }

  Buf o = raw(T * H * d);  // attend_scores writes every query's heads
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  // Each query attends over its own keys in its own order: the window (chunk or ring), then the
  // visible compressed entries (CSA: in the indexer's top-k order). The scores of a block of
  // kQueryBlock queries are one product against the union of their keys (the block's queries as
  // the F32 weight, the keys as tokens: each score is the same canonical dot either way round),
  // then every query takes its softmax and weighted sum over its own keys.
  constexpr int64_t kQueryBlock = 16;
  std::vector<float> uk, sc, p, keys;
  std::vector<std::vector<int32_t>> top;
  std::vector<int32_t> uni, slot(static_cast<size_t>(std::max<int64_t>(ls.n_entries, 1)), -1);
  const float* ent_src = all_entries || ratio != 4 ? ent.data() : nullptr;
  for (int64_t t0 = 0; t0 < T; t0 += kQueryBlock) {
    const int64_t B = std::min(kQueryBlock, T - t0), BH = B * H;
    const int64_t pos0 = p0 + t0, last = pos0 + B - 1;
    const int64_t first0 = std::max<int64_t>(0, pos0 - W + 1), nwin = last - first0 + 1;
    top.assign(static_cast<size_t>(B), {});
    uni.clear();
    for (int64_t b = 0; b < B; ++b) {
      const int64_t vis = ratio > 0 ? (pos0 + b + 1) / ratio : 0;  // entries whose block has closed
      if (ratio == 4) {
        top[b] = indexer_topk(qi.data() + (t0 + b) * HI * dI, wi.data() + (t0 + b) * HI, ikeys.data(), vis, HI, dI, c.index_topk);
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
      const float* src = j >= p0 ? kv.data() + (j - p0) * d : ring.data() + (j % W) * d;
      std::copy(src, src + d, kp);
    }
    for (size_t u = 0; u < uni.size(); ++u, kp += d) {
      slot[uni[u]] = static_cast<int32_t>(nwin + static_cast<int64_t>(u));
      if (ent_src != nullptr) {
        std::copy(ent_src + uni[u] * d, ent_src + (uni[u] + 1) * d, kp);
      } else {
        ls.kv.decode(ls.entries.data() + uni[u] * kvb, kp);
      }
    }
    // sc[u * BH + b*H + h] = q_{b,h} . key_u
    sc.resize(static_cast<size_t>(nu * BH));
    query_key_scores(q.data() + t0 * H * d, BH, uk.data(), nu, d, sc.data());
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
      attend_scores(pb.data(), H, own ? uk.data() : kb.data(), n, d, A.sink.data(), scale, o.data() + (t0 + b) * H * d, on_pool);
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
  for_each_token(T, [&](int64_t t) {
    for (int64_t h = 0; h < H; ++h) rot[t].apply(o.data() + (t * H + h) * d, d, /*inverse=*/true);
  });

  // The window ring keeps the last W positions for later chunks.
  for (int64_t t = std::max<int64_t>(0, T - W); t < T; ++t) ls.kv.encode(kv.data() + t * d, ls.window_kv.data() + ((p0 + t) % W) * kvb);

  // Grouped low-rank output projection.
  const int64_t G = c.o_groups, Ro = c.o_lora, gw = H * d / G;
  Buf z = raw(T * G * Ro);  // each group writes its Ro columns
  for (int64_t g = 0; g < G; ++g) matmul(A.wo_a, g * Ro, (g + 1) * Ro, o.data() + g * gw, H * d, T, z.data() + g * Ro, G * Ro);
  matmul(A.wo_b, z.data(), T, out);
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
