#pragma once
// The ops of a forward pass that differ between devices (docs/backend.md). Model
// (model/forward.cpp, attention_layer.cpp, moe_layer.cpp) is the one description of the pass:
// the layer loop with its mHC wiring, each sublayer's sequence of stages, the head. It calls a
// Backend for every op that touches activations; a backend binds the weights it needs once, at
// creation, in its own memory and form, and owns each sequence's cache state. Ops name weights
// by their host structs (model/weights.h): a device backend finds its own copy of each.
//
// A step covers the tokens of several sequences at once (docs/design.md "Batched steps"): row
// t of every activation belongs to one sequence at one position. Ops over rows (norms, mHC,
// projections, MoE) run over all rows at once, so each weight is read once per step; the ops
// that take a StepSeq (compressor feed, indexer top-k, attention) run per sequence on its own
// state. Every op computes a row the same way whatever else is in the step (canonical
// summation order), so a sequence's logits do not depend on its batch.
//
// Data-dependent decisions stay in backend memory (the indexer's top-k, which blocks close),
// except MoE routing in the general case: its expert ids come to the host, where the per-expert
// token lists are built; a backend may instead keep it (moe_on_device / routed_experts: the
// CUDA decode step, which a CUDA graph replays without the host).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/sampling.h"
#include "core/threads.h"
#include "kv/state.h"
#include "model/weights.h"

namespace dsv4 {

// One sequence's rows of a step: rows [t0, t0 + n) at positions p0.., state `st`.
struct StepSeq {
  SequenceState* st = nullptr;
  int64_t t0 = 0, n = 0, p0 = 0;
};

// What the host asks of a step (built by Model, validated by the engine).
struct StepPlan {
  Stack stack = Stack::Main;
  std::vector<int32_t> tokens;   // [T] token ids (MTP: the next token of each position)
  std::vector<int64_t> pos;      // [T] each row's position
  std::vector<StepSeq> seqs;     // disjoint row ranges covering [0, T), in row order
  const float* hidden = nullptr; // MTP: [T, hc*D] the main model's final hc state per row
  // How the step ends: no head, logits(), argmax() (greedy ids) or sample() (each head row's
  // token picked with its `sample` row). A device backend that replays recorded steps tells them
  // apart by it.
  enum class Tail { None, Logits, Ids, Sample } tail = Tail::None;
  // Tail::Sample: one row per head row, in head-row order (a greedy row has temperature 0). In
  // the plan, not in sample()'s arguments, so that a device uploads them with the step's token
  // ids at begin() (the only per-step upload; the pick's random number is drawn beforehand).
  std::vector<SampleRow> sample;
  // Whether some sequence reads its rows' final states (read_hidden, before the head): such a
  // step's device work ends there (the states are copied back) and the head runs after it.
  bool reads_hidden = false;
  int64_t T() const { return static_cast<int64_t>(tokens.size()); }
};

// ================================================================ op parameters
// Pointers to activations are backend memory (Backend::tmp or the Step's buffers) unless a
// field says host. "Rows of the step": [T, ...] over every row, in the plan's order.

// Matmul (core/weight.h): y = w[r0, r1) . x over T rows of x; x and y backend memory.

// x[r] = rmsnorm(x[r]) for rows r < rows of `dim` values, in place; weight null: unweighted.
struct RmsNorm {
  float* x = nullptr;
  int64_t rows = 0, dim = 0;
  const std::vector<float>* weight = nullptr;
  double eps = 0;
};

// Per-vector stages on v, rows of the step [T, heads, dim], each vector in this order: an RMS
// norm (weight null: unweighted), RoPE at its row's position with `layer`'s table (the last
// rope_dim values), a simulated quantisation (MODEL.md "Building blocks": the KV cache's fp8 on
// the non-RoPE values in blocks of 64; the indexer's Hadamard + fp4 in blocks of 32).
enum class VecNorm { None, Rms };
enum class RopeDir { None, Forward, Inverse };
enum class QuantSim { None, Fp8, HadamardFp4 };
struct VecOps {
  float* v = nullptr;
  int64_t heads = 1, dim = 0;
  VecNorm norm = VecNorm::None;
  const std::vector<float>* weight = nullptr;
  double eps = 0;
  RopeDir rope = RopeDir::None;
  int64_t layer = 0;
  QuantSim sim = QuantSim::None;
};

// Feeds one sequence's compressor rows (a = wkv.x, g = wgate.x: rows of the step [T, width])
// into its state and appends the entries (Kv) or indexer keys (Index) of the blocks that close
// in its rows, so its later queries of the step see them.
struct CompressFeed {
  const StepSeq* seq = nullptr;
  int64_t layer = 0;
  Comp which = Comp::Kv;
  const float* a = nullptr;
  const float* g = nullptr;
};

// CSA: each of the sequence's queries scores the entries visible at its position with the
// indexer (q [T, HI, dI], w [T, HI], rows of the step) and keeps the top index_topk, best
// first: sel [T, index_topk] and their count sel_n [T] (rows of the step; the sequence's rows
// are written).
struct IndexTopk {
  const StepSeq* seq = nullptr;
  int64_t layer = 0;
  const float* q = nullptr;
  const float* w = nullptr;
  int32_t* sel = nullptr;
  int32_t* sel_n = nullptr;
};

// The sequence's queries (q [T, H, d], rows of the step) over their keys: the window (its own
// earlier positions, then kv [T, d] of this step) and the visible compressed entries, in
// IndexTopk's order where sel is given (CSA), else all of them in order; sink softmax. Writes
// the sequence's rows of out [T, H, d] and its window cache.
struct Attend {
  const StepSeq* seq = nullptr;
  int64_t layer = 0;
  const float* q = nullptr;
  const float* kv = nullptr;
  const int32_t* sel = nullptr;
  const int32_t* sel_n = nullptr;
  float* out = nullptr;
  // Tensor parallelism: q and out hold `heads` heads starting at head h0 (-1: all of them).
  // Each head's attention is independent of the others, so a subset gives the same bits.
  int64_t h0 = 0, heads = -1;
};

// MoE routing of every row from its gate logits [T, E]: the n_active experts (the top scores
// plus bias, or the hash layer's table for the row's token) and their weights, into host
// memory ids / weights [T, n_active].
enum class RouteBy { Score, Hash };
struct Route {
  const MoEW* w = nullptr;
  RouteBy by = RouteBy::Score;
  const float* logits = nullptr;
  int32_t* ids = nullptr;
  float* weights = nullptr;
};

// Routing and the routed experts in one op, for a backend that keeps the routing in its own
// memory (Backend::moe_on_device): f = the sum over each row's experts, in ascending expert id,
// of its routing weight times the expert's clamped SwiGLU FFN of x — the same floats as route +
// dispatch + the expert loop of model/moe_layer.cpp, with no host read of the routing.
struct RoutedExperts {
  const MoEW* w = nullptr;
  RouteBy by = RouteBy::Score;
  const float* logits = nullptr;
};

// Rows of the step, as indices into it (backend memory), with a weight each.
struct RowList {
  const int32_t* rows = nullptr;
  const float* weights = nullptr;
};

// g[r] = silu(min(g[r], limit)) * clamp(u[r], -limit, limit) * w[r] for rows r < rows of n
// values (limit <= 0: no clamp; w null: 1).
struct Swiglu {
  float* g = nullptr;
  const float* u = nullptr;
  int64_t rows = 0, n = 0;
  float limit = 0;
  const float* w = nullptr;
};

// Named temporaries of a sublayer. The CPU takes them from the calling thread's arena (given
// back when the caller's Arena::Scope ends: the sublayers hold one); a device backend hands out
// fixed workspace slots sized for its largest step, so the names must be distinct among the
// temporaries alive at once.
enum class Tmp {
  Qr, Q, Kv, CompA, CompG, IndexA, IndexG, IndexQ, IndexW, Sel, SelN, O, Z,  // attention
  GateLogits, ExpertIn, ExpertGate, ExpertUp, ExpertOut, ExpertAll,         // MoE
  ZGroups, OutRows, HeadRows,                                               // tensor parallelism
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;  // "cpu", "cuda"

  // A fresh sequence whose caches live where this backend computes (with the MTP block's
  // layer when the model has one).
  virtual SequenceState new_sequence() const = 0;
  // A sequence that continues from `st` (shares what it can; docs/design.md). Throws
  // Error(Unsupported) where the backend cannot.
  virtual SequenceState fork(const SequenceState& st) const = 0;
  // Drops positions [pos, current) of the main layers, or of the MTP block; at most kRewind.
  virtual void truncate(SequenceState& st, int64_t pos, Stack stack) const = 0;

  // The longest chunk one step takes in total rows (the caller splits longer ones); 0 = no limit.
  virtual int64_t max_rows() const { return 0; }
  // Whether one step may hold several sequences; if not, the caller runs them one by one.
  virtual bool batched() const { return true; }
  // Batch buckets. A backend that records a decode step once per batch size and replays it for
  // any sequences (the CUDA graphs) returns the rows a decode step of n sequences (one row each)
  // should have, at least n; Model pads the step with rows of padding_sequence(), whose outputs
  // it discards. 0 (the default): no buckets, the step has n rows.
  virtual int64_t decode_bucket(int64_t n) const { return 0; }
  // The scratch sequence padding rows run on: every padding row feeds it one token at position 0
  // (Model never advances it), and nothing of it is ever read back.
  virtual SequenceState& padding_sequence() {
    throw Error(std::string(name()) + " backend: no padding sequence (decode_bucket() is 0)");
  }

  // The activations of one step, in backend memory, valid until the step ends.
  struct Step {
    const StepPlan* plan = nullptr;
    int64_t T = 0;
    float* X = nullptr;     // [T, hc, D] residual stream
    float* x = nullptr;     // [T, D] sublayer input; after the layers, the head's input
    float* post = nullptr;  // [T, hc]
    float* comb = nullptr;  // [T, hc, hc]
    float* f = nullptr;     // [T, D] sublayer output
  };
  // Starts a step: returns its buffers with X holding the embedded tokens (hc copies; MTP: the
  // block's input from the embedding and plan.hidden). The CPU backend takes the buffers from
  // the calling thread's arena, so the caller holds an Arena::Scope for the step.
  virtual Step begin(const StepPlan& plan) = 0;
  // n floats / int32s of backend memory for the temporary `which` (see Tmp).
  virtual float* tmp(Step& s, Tmp which, int64_t n) = 0;
  virtual int32_t* tmp_ints(Step& s, Tmp which, int64_t n) = 0;

  // mHC. Layer index l in [0, n_layers]; n_layers is the MTP block.
  enum class Sub { Attn, Ffn };
  // x, post, comb = hc_pre(layer's mixer for `sub`, X).
  virtual void hc_pre(int64_t layer, Sub sub, Step& s) = 0;
  // X = post * f + comb X.
  virtual void hc_post(Step& s) = 0;

  // Ops over rows (model/attention_layer.cpp, moe_layer.cpp).
  virtual void matmul(Step& s, const Matmul& m) = 0;
  // Several independent matmuls (none reads another's output), with matmul's results; a backend
  // may run them as one piece of work (the CPU: one job of its pool).
  virtual void matmuls(Step& s, const Matmul* m, int64_t n) {
    for (int64_t i = 0; i < n; ++i) matmul(s, m[i]);
  }
  virtual void rmsnorm(Step& s, const RmsNorm& n) = 0;
  virtual void vec_ops(Step& s, const VecOps& v) = 0;
  virtual void scale(Step& s, float* x, int64_t n, float factor) = 0;  // x *= factor
  // Per sequence (each on its own state, in the plan's order).
  virtual void compress(Step& s, const CompressFeed& c) = 0;
  virtual void index_topk(Step& s, const IndexTopk& k) = 0;
  virtual void attend(Step& s, const Attend& a) = 0;
  // MoE.
  virtual void route(Step& s, const Route& r) = 0;
  // The per-expert token lists (host: rows and weights, expert after expert) in backend memory.
  virtual RowList dispatch(Step& s, const std::vector<int32_t>& rows, const std::vector<float>& weights) = 0;
  virtual void zero_f(Step& s) = 0;  // f = 0 (the experts add into it)
  // y[i] = x[rows[i]] / out[rows[i]] += y[i] for i < n, rows of `dim` values (the rows of one
  // scatter are distinct: an expert serves a token once).
  virtual void gather(Step& s, const float* x, const int32_t* rows, int64_t n, int64_t dim, float* y) = 0;
  virtual void scatter_add(Step& s, const float* y, const int32_t* rows, int64_t n, int64_t dim, float* out) = 0;
  virtual void swiglu(Step& s, const Swiglu& g) = 0;
  // The most routed-expert rows the MoE sublayer takes at once (gathered, multiplied and activated
  // together: moe_layer.cpp): its Tmp::Expert* temporaries hold that many rows. A device backend's
  // workspace holds a step's rows (an expert serves a token once, so any one expert fits); the
  // CPU takes every routed row of the step at once.
  virtual int64_t expert_rows_at_once(const Step& s) const { return s.T; }
  virtual void add(Step& s, float* y, const float* x, int64_t n) = 0;  // y += x
  // Whether this step's MoE runs as routed_experts (no host read of the routing; a CUDA decode
  // step) instead of route / dispatch / gather / scatter_add.
  virtual bool moe_on_device(const Step&) const { return false; }
  // Only called when moe_on_device() said yes: a backend that never says so (the CPU one) never
  // gets here, so reaching the default is a broken invariant, not a missing feature.
  virtual void routed_experts(Step&, const RoutedExperts&) {
    DSV4_CHECK_MSG(false, std::string(name()) + " backend: routed_experts called although moe_on_device() is false");
  }

  // The head.
  // out (host, [rows.size(), hc*D]) = X of the given rows.
  virtual void read_hidden(Step& s, const std::vector<int64_t>& rows, float* out) = 0;
  // x[i] = hc_head(X of rows[i]) with the main model's or the MTP block's hc_head, before the
  // final norm.
  virtual void hc_head(Stack stack, Step& s, const std::vector<int64_t>& rows) = 0;
  // out (host, [n, vocab]) = head(x[0..n)).
  virtual void logits(Step& s, int64_t n, float* out) = 0;
  // out (host, [n]) = the index of the first largest value of each row of head(x[0..n)) (vocab
  // values), the greedy token. By default from logits(); a device backend copies back only the ids.
  virtual void argmax(Step& s, int64_t n, int64_t vocab, int32_t* out) {
    std::vector<float> l(static_cast<size_t>(n * vocab));
    logits(s, n, l.data());
    for (int64_t r = 0; r < n; ++r) {
      const float* row = l.data() + r * vocab;
      out[r] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    }
  }
  // out (host, [n]) = each row's token picked from head(x[0..n)) with s.plan->sample[r]
  // (core/sampling.h's sample_logits: what Sampler::sample does after the penalties). By default
  // from logits(); a device backend runs the pick on the device and copies back only the ids.
  virtual void sample(Step& s, int64_t n, int64_t vocab, int32_t* out) {
    DSV4_CHECK(static_cast<int64_t>(s.plan->sample.size()) == n);
    std::vector<float> l(static_cast<size_t>(n * vocab));
    logits(s, n, l.data());
    // Rows are independent, and a pick over every candidate costs 3.5-6 ms at the model's
    // vocabulary: a batch's rows are spread over the pool.
    thread_pool().parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) out[r] = sample_logits(l.data() + r * vocab, vocab, s.plan->sample[static_cast<size_t>(r)]);
    });
  }
  // The most candidates (top-k, or the vocabulary when top-k is 0) a Tail::Sample row may have:
  // a device kernel sorts them in bounded memory (CUDA: topk_rows' 4096).
  virtual int64_t sample_max_candidates(int64_t vocab) const { return vocab; }
  // The step's last call (Model::run): a backend that deferred work (a CUDA graph) runs it now.
  virtual void end(Step&) {}
};

}  // namespace dsv4
