// The attention sublayer (MODEL.md "Attention"): low-rank queries, one KV head, the compressed
// entries of CSA / HCA layers, the CSA indexer, sparse attention with a sink, grouped output.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/arena.h"
#include "model/layers.h"
#include "parallel/comm.h"

namespace dsv4 {

namespace {

// A CSA layer's indexer inputs over all rows of the step: its compressor's rows, its queries
// (from the query path's low-rank qr: RoPE, Hadamard, fp4 simulation) and head weights; and
// room for each query's top-k selection.
struct IndexerRows {
  float *a = nullptr, *g = nullptr, *q = nullptr, *w = nullptr;
  int32_t *sel = nullptr, *sel_n = nullptr;
};

// The indexer's temporaries, and its projections of x (added to `mm`: they run with the
// layer's other projections of x, indexer_queries then takes qr).
IndexerRows indexer_rows(Backend& be, const ModelConfig& c, const IndexerW& ix, Backend::Step& s, std::vector<Matmul>& mm) {
  const int64_t T = s.T, HI = c.index_heads, dI = c.index_dim, width = ix.comp.coff * ix.comp.out_dim;
  IndexerRows r;
  r.a = be.tmp(s, Tmp::IndexA, T * width);
  r.g = be.tmp(s, Tmp::IndexG, T * width);
  r.q = be.tmp(s, Tmp::IndexQ, T * HI * dI);
  r.w = be.tmp(s, Tmp::IndexW, T * HI);
  mm.push_back({&ix.comp.wkv, s.x, T, r.a});
  mm.push_back({&ix.comp.wgate, s.x, T, r.g});
  mm.push_back({&ix.weights_proj, s.x, T, r.w});
  r.sel = be.tmp_ints(s, Tmp::Sel, T * std::max<int64_t>(c.index_topk, 1));
  r.sel_n = be.tmp_ints(s, Tmp::SelN, T);
  return r;
}

// After the projections: the indexer's queries (RoPE, Hadamard, FP4 simulation) and its head
// weights' scale.
void indexer_queries(Backend& be, const ModelConfig& c, int64_t l, const IndexerRows& r, Backend::Step& s) {
  const int64_t T = s.T, HI = c.index_heads, dI = c.index_dim;
  be.vec_ops(s, {.v = r.q, .heads = HI, .dim = dI, .rope = RopeDir::Forward, .layer = l, .sim = QuantSim::HadamardFp4});
  be.scale(s, r.w, T * HI, static_cast<float>(1.0 / std::sqrt(static_cast<double>(dI)) / std::sqrt(static_cast<double>(HI))));
}

}  // namespace

void attention_layer(Backend& be, const ModelConfig& c, int64_t l, const LayerW& L, Backend::Step& s, const Shard* shard) {
  const AttentionW& A = L.attn;
  const LayerKind kind = L.kind();
  const int64_t T = s.T, d = c.head_dim, Qr = c.q_lora;
  // Tensor parallelism (docs/parallel.md): this rank's output groups [g0, g1) and their heads
  // [h0, h0 + H); every dot product is still computed whole (only output rows are split).
  const int64_t G = c.o_groups, Ro = c.o_lora, gw = c.n_heads * d / G;
  const bool tp = shard && shard->tp;
  const int64_t g0 = tp ? shard->part(G, shard->rank) : 0, g1 = tp ? shard->part(G, shard->rank + 1) : G;
  const int64_t h0 = g0 * c.n_heads / G, H = (g1 - g0) * c.n_heads / G;
  const double eps = static_cast<float>(c.eps);  // attention's norms take eps rounded to float32

  // Projections run over all rows of the step (each weight read once); per-row stages take the
  // row's own position. The CPU's temporaries of the sublayer are given back at the end.
  Arena::Scope scope(thread_arena());
  float* qr = be.tmp(s, Tmp::Qr, T * Qr);
  float* q = be.tmp(s, Tmp::Q, T * H * d);
  float* kv = be.tmp(s, Tmp::Kv, T * d);
  // Every projection of x as one matmuls call (one job on the CPU): the low-rank query path's
  // first half, the single KV head, the compressor's rows (CSA / HCA) and the indexer's (CSA).
  std::vector<Matmul> mm;
  mm.push_back({&A.wq_a, s.x, T, qr});
  mm.push_back({&A.wkv, s.x, T, kv});
  float *ca = nullptr, *cg = nullptr;
  if (kind != LayerKind::Window) {
    const int64_t width = A.comp->coff * A.comp->out_dim;
    ca = be.tmp(s, Tmp::CompA, T * width);
    cg = be.tmp(s, Tmp::CompG, T * width);
    mm.push_back({&A.comp->wkv, s.x, T, ca});
    mm.push_back({&A.comp->wgate, s.x, T, cg});
  }
  const IndexerRows ix = kind == LayerKind::CSA ? indexer_rows(be, c, *A.indexer, s, mm) : IndexerRows{};
  be.matmuls(s, mm.data(), static_cast<int64_t>(mm.size()));
  // Queries: unweighted norm of qr, then the heads' and the indexer's queries from it together;
  // per-head norm and RoPE.
  be.rmsnorm(s, {qr, T, Qr, &A.q_norm, eps});
  mm.clear();
  if (H > 0)  // a TP rank may hold no group when there are more ranks than groups
    mm.push_back({.w = &A.wq_b, .x = qr, .T = T, .y = q, .r0 = h0 * d, .r1 = (h0 + H) * d});
  if (kind == LayerKind::CSA) mm.push_back({&A.indexer->wq_b, qr, T, ix.q});
  be.matmuls(s, mm.data(), static_cast<int64_t>(mm.size()));
  if (H > 0)
    be.vec_ops(s, {.v = q, .heads = H, .dim = d, .norm = VecNorm::Rms, .eps = eps, .rope = RopeDir::Forward, .layer = l});
  // The single KV head: norm, RoPE, FP8 simulation of the non-RoPE part.
  be.vec_ops(s, {.v = kv, .dim = d, .norm = VecNorm::Rms, .weight = &A.kv_norm, .eps = eps, .rope = RopeDir::Forward,
                 .layer = l, .sim = QuantSim::Fp8});
  if (kind == LayerKind::CSA) indexer_queries(be, c, l, ix, s);

  // Per sequence: its compressed entries for blocks closing in its rows (visible to its later
  // queries of the step), CSA's top-k entries per query, then its queries over its own keys.
  float* o = be.tmp(s, Tmp::O, T * H * d);  // every row's heads are written by its sequence's attend
  for (const StepSeq& seq : s.plan->seqs) {
    if (kind != LayerKind::Window) be.compress(s, {&seq, l, Comp::Kv, ca, cg});
    if (kind == LayerKind::CSA) {
      be.compress(s, {&seq, l, Comp::Index, ix.a, ix.g});
      be.index_topk(s, {&seq, l, ix.q, ix.w, ix.sel, ix.sel_n});
    }
    be.attend(s, {.seq = &seq, .layer = l, .q = q, .kv = kv, .sel = ix.sel, .sel_n = ix.sel_n, .out = o, .h0 = h0,
                  .heads = tp ? H : -1});
  }
  if (H > 0) be.vec_ops(s, {.v = o, .heads = H, .dim = d, .rope = RopeDir::Inverse, .layer = l});

  // Grouped low-rank output projection: group g's heads through rows [g*Ro, (g+1)*Ro) of wo_a.
  float* z = be.tmp(s, Tmp::Z, T * G * Ro);  // each group writes its Ro columns
  if (!tp) {
    mm.clear();
    for (int64_t g = 0; g < G; ++g)
      mm.push_back({.w = &A.wo_a, .x = o + g * gw, .T = T, .y = z + g * Ro, .r0 = g * Ro, .r1 = (g + 1) * Ro, .ldx = H * d,
                    .ldy = G * Ro});
    be.matmuls(s, mm.data(), G);
  } else {
    // Each group's [T, Ro] block contiguous (group after group), so a rank's groups are one run
    // of rows for the allgather; then the blocks go to their columns of z.
    float* zg = be.tmp(s, Tmp::ZGroups, G * T * Ro);
    for (int64_t g = g0; g < g1; ++g)
      be.matmul(s, {.w = &A.wo_a, .x = o + (g - g0) * gw, .T = T, .y = zg + g * T * Ro, .r0 = g * Ro, .r1 = (g + 1) * Ro,
                    .ldx = H * d, .ldy = Ro});
    std::vector<int64_t> count(static_cast<size_t>(shard->world)), displ(static_cast<size_t>(shard->world));
    for (int r = 0; r < shard->world; ++r) {
      displ[r] = shard->part(G, r) * T;
      count[r] = shard->part(G, r + 1) * T - displ[r];
    }
    shard->comm->allgather_rows(zg, Ro, count, displ);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t t = 0; t < T; ++t) std::copy(zg + (g * T + t) * Ro, zg + (g * T + t + 1) * Ro, z + t * G * Ro + g * Ro);
  }
  if (!tp) return be.matmul(s, {&A.wo_b, z, T, s.f});
  // wo_b by its output rows too: this rank's [T, D_r] block of f, the blocks back to back (each
  // T * D_r floats: one allgather in units of T floats), then spread into f [T, D].
  const int64_t D = c.dim, d0 = shard->part(D, shard->rank), d1 = shard->part(D, shard->rank + 1);
  float* fb = be.tmp(s, Tmp::OutRows, T * D);
  if (d1 > d0) be.matmul(s, {.w = &A.wo_b, .x = z, .T = T, .y = fb + T * d0, .r0 = d0, .r1 = d1});
  std::vector<int64_t> count(static_cast<size_t>(shard->world)), displ(static_cast<size_t>(shard->world));
  for (int r = 0; r < shard->world; ++r) {
    displ[r] = shard->part(D, r);
    count[r] = shard->part(D, r + 1) - displ[r];
  }
  shard->comm->allgather_rows(fb, T, count, displ);
  for (int r = 0; r < shard->world; ++r)
    for (int64_t t = 0; t < T; ++t)
      std::copy(fb + T * displ[r] + t * count[r], fb + T * displ[r] + (t + 1) * count[r], s.f + t * D + displ[r]);
}

}  // namespace dsv4
