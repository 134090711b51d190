#include "tools/inspect.h"

#include <cstdarg>
#include <cstdio>
#include <map>
#include <vector>

#include "io/safetensors.h"
#include "kv/state.h"
#include "model/tensors.h"
#include "model/weights.h"
#include "parallel/partition.h"

namespace dsv4 {

namespace {
// printf into `out`.
#define P(...) (std::snprintf(buf, sizeof buf, __VA_ARGS__), out += buf)
}  // namespace

std::string inspect_model(const std::string& dir, int world, bool ep, bool tp) {
  std::string out;
  char buf[512];
  ModelWeights w = load_model(dir, LoadMode::Mmap);  // looks at headers only
  const ModelConfig& c = w.cfg;
  P("model:     %s\n", dir.c_str());
  P("format:    %s\n", w.format_summary().c_str());
  P("files:     %zu safetensors file(s)\n", w.store.files().size());
  P("config:    vocab %lld, hidden %lld, layers %lld, heads %lld x %lld (rope %lld), q_lora %lld, o %lldx%lld\n",
              (long long)c.vocab, (long long)c.dim, (long long)c.n_layers, (long long)c.n_heads, (long long)c.head_dim,
              (long long)c.rope_dim, (long long)c.q_lora, (long long)c.o_groups, (long long)c.o_lora);
  P("           window %lld, experts %lld (top %lld, inter %lld, hash layers %lld), hc %lld, index %lldx%lld top %lld, mtp %lld\n",
              (long long)c.window, (long long)c.n_experts, (long long)c.n_active, (long long)c.moe_inter, (long long)c.n_hash,
              (long long)c.hc, (long long)c.index_heads, (long long)c.index_dim, (long long)c.index_topk, (long long)c.n_mtp);
  P("layers:\n");
  for (int64_t l = 0; l < c.n_layers; ++l)
    P("  %3lld  %-9s %s\n", (long long)l, c.layer_kind(l).c_str(), w.layers[l].hash ? "hash-routed" : "score-routed");
  if (w.mtp) P("  mtp  %-9s score-routed\n", c.layer_kind(c.n_layers).c_str());
  P("KV cache (FP8 + scale per 64 for non-RoPE dims, F32 RoPE dims; FP4 indexer keys):\n");
  std::map<int64_t, bool> kinds;
  for (int64_t l = 0; l < c.n_layers; ++l) kinds[c.ratio(l)] = true;
  for (const auto& [ratio, _] : kinds) {
    CacheCost k = layer_cache_cost(c, ratio);
    P("  %-9s %8.1f bytes/token + %zu bytes fixed (window ring, compressor rows)\n",
                ModelConfig::kind_name(ratio).c_str(), k.bytes_per_token,
                k.fixed_bytes);
  }
  std::map<std::string, std::pair<size_t, size_t>> by_dtype;
  size_t total = 0;
  for (const auto& f : w.store.files())
    for (const auto& [name, t] : f->tensors()) {
      auto& e = by_dtype[dtype_name(t.dtype)];
      e.first += 1;
      e.second += t.nbytes;
      total += t.nbytes;
    }
  P("bytes per dtype:\n");
  for (const auto& [k, v] : by_dtype) P("  %-8s %6zu tensors %14zu bytes\n", k.c_str(), v.first, v.second);
  P("  total    %14zu bytes\n", total);
  // What the engine holds, from the tensor list: linears in their stored form (what a backend
  // uploads), small tensors converted to 4-byte values.
  const WeightBytes held = weight_bytes(w);
  P("weights by part (linears as stored, small tensors as 4-byte values):\n");
  P("  %-15s %7s %14s %7s %14s\n", "part", "tensors", "bytes", "MTP", "MTP bytes");
  for (int p = 0; p < kNumParts; ++p) {
    const WeightBytes::Row &m = held.main[p], &t = held.mtp[p];
    if (m.tensors + t.tensors == 0) continue;
    P("  %-15s %7zu %14zu %7zu %14zu\n", part_name(static_cast<Part>(p)), m.tensors, m.bytes, t.tensors, t.bytes);
  }
  P("  %-15s %7s %14zu %7s %14zu\n", "total", "", held.main_bytes(), "", held.mtp_bytes());
  if (world > 1) {
    // EP: the routed experts split by id; TP: the rows of the attention's wq_b / wo_a (by output
    // group), wo_b (by output row) and the head (by vocabulary row); the rest on every rank.
    const int64_t E = c.n_experts, G = c.o_groups, V = c.vocab;
    auto ends = [](const std::string& n, const std::string& suffix) {
      return n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    std::vector<size_t> resident(static_cast<size_t>(world), 0);
    size_t replicated = 0;
    for_each_tensor(w, [&](const TensorDesc& t, TensorTarget<true> x) {
      const size_t b = x.linear ? x.linear->stored_bytes() : x.floats ? x.floats->size() * 4 : x.ids ? x.ids->size() * 4 : 0;
      const bool wo_b = ends(t.name, ".attn.wo_b.weight");
      const bool rows = tp && (ends(t.name, ".attn.wq_b.weight") || ends(t.name, ".attn.wo_a.weight") || wo_b || t.name == "head.weight");
      if (!(ep && t.expert >= 0) && !rows) replicated += b;
      for (int r = 0; r < world; ++r) {
        const Share sh{r, world, ep, tp};
        if (ep && t.expert >= 0) {
          if (ExpertSplit{r, world, E}.owns(t.expert)) resident[r] += b;
        } else if (rows) {
          const int64_t n = t.name == "head.weight" ? V : wo_b ? c.dim : G;  // by vocabulary row, output row or group
          resident[r] += static_cast<size_t>(static_cast<double>(b) * static_cast<double>(sh.part(n, r + 1) - sh.part(n, r)) / static_cast<double>(n));
        } else {
          resident[r] += b;
        }
      }
    });
    // Per decoded token, rank r sends to the other world - 1 ranks: EP, the token's expert output
    // rows (D floats) of its experts in every MoE layer of the main model (expected with routing
    // spread evenly); TP, its groups' z blocks (o_lora floats each) and its output rows of wo_b
    // in every layer, and its vocabulary rows of the logits; rank 0 also the step request (under 64 bytes).
    const double fl = 4.0, others = world - 1, L = static_cast<double>(c.n_layers);
    P("--parallel %s over %d ranks (the replicated part, %.1f MiB, on every rank):\n", ep && tp ? "ep+tp" : ep ? "ep" : "tp", world,
      static_cast<double>(replicated) / (1 << 20));
    P("  %4s %11s %11s %16s %22s\n", "rank", "experts", "groups", "resident bytes", "sent / decoded token");
    for (int r = 0; r < world; ++r) {
      const Share sh{r, world, ep, tp};
      const ExpertSplit es = ep ? ExpertSplit{r, world, E} : ExpertSplit{0, 1, E};
      const int64_t g0 = tp ? sh.part(G, r) : 0, g1 = tp ? sh.part(G, r + 1) : G;
      double sent = r == 0 ? 64.0 * others : 0.0;
      if (ep) sent += L * static_cast<double>(c.n_active) * static_cast<double>(es.end() - es.begin()) / static_cast<double>(E) * static_cast<double>(c.dim) * fl * others;
      if (tp)
        sent += (L * static_cast<double>((g1 - g0) * c.o_lora + sh.part(c.dim, r + 1) - sh.part(c.dim, r)) +
                 static_cast<double>(sh.part(V, r + 1) - sh.part(V, r))) * fl * others;
      char ex[48], gr[48];
      std::snprintf(ex, sizeof ex, "%lld-%lld", (long long)es.begin(), (long long)es.end() - 1);
      if (g1 > g0) std::snprintf(gr, sizeof gr, "%lld-%lld", (long long)g0, (long long)g1 - 1);
      else std::snprintf(gr, sizeof gr, "none");
      P("  %4d %11s %11s %16zu %20.0f B\n", r, ex, gr, resident[r], sent);
    }
    P("  (one process: %zu bytes)\n", held.main_bytes() + held.mtp_bytes());
  }
  return out;
}


#undef P

}  // namespace dsv4
