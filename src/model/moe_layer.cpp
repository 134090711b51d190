// The MoE sublayer (MODEL.md "MoE"): gate, routing, the routed experts over the rows each one
// serves (every expert's weights read once per step), the shared expert over all rows.
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/error.h"
#include "model/layers.h"
#include "parallel/comm.h"

namespace dsv4 {

namespace {

// One expert's clamped SwiGLU FFN: over the rows listed (n of them, each scaled by its routing
// weight), or over every row (rows null: the shared expert, weight 1). The output rows go into
// `out` when given (expert parallelism: combined later), else they are added into s.f.
void run_expert(Backend& be, const ModelConfig& c, const ExpertW& w, Backend::Step& s, const int32_t* rows,
                const float* weights, int64_t n, float* out = nullptr) {
  const int64_t D = c.dim, I = c.moe_inter;
  Arena::Scope scope(thread_arena());
  const float* in = s.x;
  if (rows) {
    float* xs = be.tmp(s, Tmp::ExpertIn, n * D);
    be.gather(s, s.x, rows, n, D, xs);
    in = xs;
  }
  float* g = be.tmp(s, Tmp::ExpertGate, n * I);
  float* u = be.tmp(s, Tmp::ExpertUp, n * I);
  float* y = out ? out : be.tmp(s, Tmp::ExpertOut, n * D);
  be.matmul(s, {&w.w1, in, n, g});
  be.matmul(s, {&w.w3, in, n, u});
  be.swiglu(s, {g, u, n, I, static_cast<float>(c.swiglu_limit), weights});
  be.matmul(s, {&w.w2, g, n, y});
  if (out) return;
  if (rows) {
    be.scatter_add(s, y, rows, n, D, s.f);
  } else {
    be.add(s, s.f, y, n * D);
  }
}

}  // namespace

void moe_layer(Backend& be, const ModelConfig& c, const LayerW& L, Backend::Step& s, const Shard* shard) {
  const MoEW& F = L.ffn;
  const int64_t T = s.T, E = c.n_experts, k = c.n_active, Tk = T * k;

  Arena::Scope scope(thread_arena());
  float* logits = be.tmp(s, Tmp::GateLogits, T * E);
  be.matmul(s, {&F.gate, s.x, T, logits});
  const RouteBy by = L.hash ? RouteBy::Hash : RouteBy::Score;
  if (be.moe_on_device(s)) {
    be.routed_experts(s, {&F, by, logits});
    run_expert(be, c, F.shared, s, nullptr, nullptr, T);
    return;
  }
  std::vector<int32_t> ids(static_cast<size_t>(Tk));
  std::vector<float> wts(static_cast<size_t>(Tk));
  be.route(s, {&F, by, logits, ids.data(), wts.data()});

  // Per expert, the rows it serves in ascending order and their weights, expert after expert
  // (a counting sort of the routing).
  std::vector<int64_t> first(static_cast<size_t>(E + 1), 0);
  for (int32_t e : ids) {
    DSV4_CHECK_MSG(e >= 0 && e < E, "routing gave expert id " + std::to_string(e));
    ++first[e + 1];
  }
  for (int64_t e = 0; e < E; ++e) first[e + 1] += first[e];
  std::vector<int32_t> rows(static_cast<size_t>(Tk));
  std::vector<float> row_w(static_cast<size_t>(Tk));
  std::vector<int64_t> at(first.begin(), first.end() - 1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      rows[at[e]] = static_cast<int32_t>(t);
      row_w[at[e]++] = wts[t * k + j];
    }
  const RowList lists = be.dispatch(s, rows, row_w);

  // Experts in ascending id, then the shared expert, each adding into f: per output the same
  // sequence of float additions on every backend and in every batch.
  be.zero_f(s);
  if (!shard || !shard->ep) {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = first[e + 1] - first[e];
      if (n > 0) run_expert(be, c, F.experts[e], s, lists.rows + first[e], lists.weights + first[e], n);
    }
  } else {
    // Expert parallelism (docs/parallel.md): this rank runs its experts into their block of
    // the expert-ordered rows Y (each expert's output rows computed whole, as one process
    // would), the allgather brings every rank's block, and every rank adds all experts into f
    // in ascending id with the same scatter_add as above: the same additions in the same order.
    const ExpertSplit sp{shard->rank, shard->world, E};
    float* Y = be.tmp(s, Tmp::ExpertAll, Tk * c.dim);
    for (int64_t e = sp.begin(); e < sp.end(); ++e) {
      const int64_t n = first[e + 1] - first[e];
      if (n > 0) run_expert(be, c, F.experts[e], s, lists.rows + first[e], lists.weights + first[e], n, Y + first[e] * c.dim);
    }
    std::vector<int64_t> count(static_cast<size_t>(sp.world)), displ(static_cast<size_t>(sp.world));
    for (int r = 0; r < sp.world; ++r) {
      displ[r] = first[sp.first(r)];
      count[r] = first[sp.first(r + 1)] - displ[r];
    }
    shard->comm->allgather_rows(Y, c.dim, count, displ);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = first[e + 1] - first[e];
      if (n > 0) be.scatter_add(s, Y + first[e] * c.dim, lists.rows + first[e], n, c.dim, s.f);
    }
  }
  run_expert(be, c, F.shared, s, nullptr, nullptr, T);
}

}  // namespace dsv4
