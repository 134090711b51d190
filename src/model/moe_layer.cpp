// The MoE sublayer (MODEL.md "MoE"): gate, routing, the routed experts over the rows each one
// serves (every expert's weights read once per step), the shared expert over all rows.
#include <algorithm>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/error.h"
#include "model/layers.h"
#include "parallel/comm.h"

namespace dsv4 {

namespace {

// The shared expert's clamped SwiGLU FFN over every row of the step, added into s.f.
void run_shared_expert(Backend& be, const ModelConfig& c, const ExpertW& w, Backend::Step& s) {
  const int64_t D = c.dim, I = c.moe_inter, T = s.T;
  Arena::Scope scope(thread_arena());
  float* g = be.tmp(s, Tmp::ExpertGate, T * I);
  float* u = be.tmp(s, Tmp::ExpertUp, T * I);
  float* y = be.tmp(s, Tmp::ExpertOut, T * D);
  const Matmul up[2] = {{&w.w1, s.x, T, g}, {&w.w3, s.x, T, u}};
  be.matmuls(s, up, 2);
  be.swiglu(s, {g, u, T, I, static_cast<float>(c.swiglu_limit), nullptr});
  be.matmul(s, {&w.w2, g, T, y});
  be.add(s, s.f, y, T * D);
}

// Routed experts [e0, e1) (ascending id) taken together: their rows (lists from first[e0],
// expert after expert, each row scaled by its routing weight) gathered once, every w1 and w3 in
// one matmuls call, one clamped SwiGLU over all the rows, every w2 in one call. Each expert's
// rows are computed as they would be alone. The output rows go into `out` (expert-ordered, the
// row of first[e0] first) when given (expert parallelism: combined later), else each expert's
// rows are added into s.f in ascending id.
void run_experts(Backend& be, const ModelConfig& c, const MoEW& F, Backend::Step& s, const RowList& lists,
                 const int64_t* first, int64_t e0, int64_t e1, float* out) {
  const int64_t D = c.dim, I = c.moe_inter, n = first[e1] - first[e0];
  if (n == 0) return;
  Arena::Scope scope(thread_arena());
  float* xs = be.tmp(s, Tmp::ExpertIn, n * D);
  be.gather(s, s.x, lists.rows + first[e0], n, D, xs);
  float* g = be.tmp(s, Tmp::ExpertGate, n * I);
  float* u = be.tmp(s, Tmp::ExpertUp, n * I);
  float* y = out ? out : be.tmp(s, Tmp::ExpertOut, n * D);
  std::vector<Matmul> mm;
  mm.reserve(static_cast<size_t>(2 * (e1 - e0)));
  for (int64_t e = e0; e < e1; ++e) {
    const int64_t at = first[e] - first[e0], m = first[e + 1] - first[e];
    if (m == 0) continue;
    mm.push_back({&F.experts[e].w1, xs + at * D, m, g + at * I});
    mm.push_back({&F.experts[e].w3, xs + at * D, m, u + at * I});
  }
  be.matmuls(s, mm.data(), static_cast<int64_t>(mm.size()));
  be.swiglu(s, {g, u, n, I, static_cast<float>(c.swiglu_limit), lists.weights + first[e0]});
  mm.clear();
  for (int64_t e = e0; e < e1; ++e) {
    const int64_t at = first[e] - first[e0], m = first[e + 1] - first[e];
    if (m > 0) mm.push_back({&F.experts[e].w2, g + at * I, m, y + at * D});
  }
  be.matmuls(s, mm.data(), static_cast<int64_t>(mm.size()));
  if (out) return;
  for (int64_t e = e0; e < e1; ++e) {
    const int64_t at = first[e] - first[e0], m = first[e + 1] - first[e];
    if (m > 0) be.scatter_add(s, y + at * D, lists.rows + first[e], m, D, s.f);
  }
}

// Routed experts [e0, e1) in runs of consecutive experts of at most the backend's
// expert_rows_at_once rows each (one expert may exceed it alone: it never exceeds T).
void run_expert_range(Backend& be, const ModelConfig& c, const MoEW& F, Backend::Step& s, const RowList& lists,
                      const int64_t* first, int64_t e0, int64_t e1, float* out) {
  const int64_t cap = std::max<int64_t>(be.expert_rows_at_once(s), 1);
  for (int64_t a = e0; a < e1;) {
    int64_t b = a + 1;
    while (b < e1 && first[b + 1] - first[a] <= cap) ++b;
    run_experts(be, c, F, s, lists, first, a, b, out ? out + (first[a] - first[e0]) * c.dim : nullptr);
    a = b;
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
    run_shared_expert(be, c, F.shared, s);
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
    run_expert_range(be, c, F, s, lists, first.data(), 0, E, nullptr);
  } else {
    // Expert parallelism (docs/parallel.md): this rank runs its experts into their block of
    // the expert-ordered rows Y (each expert's output rows computed whole, as one process
    // would), the allgather brings every rank's block, and every rank adds all experts into f
    // in ascending id with the same scatter_add as above: the same additions in the same order.
    const ExpertSplit sp{shard->rank, shard->world, E};
    float* Y = be.tmp(s, Tmp::ExpertAll, Tk * c.dim);
    run_expert_range(be, c, F, s, lists, first.data(), sp.begin(), sp.end(), Y + first[sp.begin()] * c.dim);
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
  run_shared_expert(be, c, F.shared, s);
}

}  // namespace dsv4
