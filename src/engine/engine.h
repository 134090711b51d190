#pragma once
// The engine API: the one door through which apps (the CLI, the bench, later the server) use a
// DeepSeek-V4 model. An Engine holds what is loaded once (weights on a backend, tokenizer);
// Sequences hold per-sequence state (caches, position, the tokens consumed).
//
//   Engine e({.model_dir = "m"});
//   Sequence a = e.new_sequence(), b = e.new_sequence();
//   auto out = e.step({{&a, prompt_a, Rows::Last}, {&b, {tok}, Rows::Last}});  // one batched step
//   e.truncate(a, a.pos() - 3);   // rewind (cheap up to kCheapRewind tokens)
//   Sequence c = e.fork(a);       // continues from a's state without re-prefilling
//
// Batched steps: one step takes tokens of several sequences, each at its own position, prefill
// chunks and single decode tokens mixed; every weight is read once per step. A sequence's
// logits are bit-identical whatever else is in the step.
//
// Errors: dsv4::Error (core/error.h) with a kind a server maps to a status. Exception safety of
// a step: every check that can fail on the request (token ids, sequence ownership, duplicates,
// context limit, MTP inputs) runs before any state is touched, so a refused step changes
// nothing. A failure after that (out of memory, a device error) leaves the sequences of that
// step half-written: they are marked broken and every later use of them throws; other sequences
// are untouched. Broken internal invariants abort (DSV4_CHECK).
//
// Not thread-safe: one thread drives an Engine and its sequences (the server's scheduler).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/rows.h"
#include "text/tokenizer.h"

namespace dsv4 {

class Model;
class Sampler;  // engine/sampler.h
struct SequenceState;
struct SnapshotImage;  // engine/snapshot_file.h

enum class Device { Cpu, Cuda };
// How checkpoint bytes get into memory: Auto reads them into anonymous memory when they take at
// most half of the available memory, else maps the files.
enum class WeightLoad { Auto, Mmap, Read };
// Multi-process runs (mpirun -np N; docs/parallel.md): None = one process; Ep = the routed
// experts split by id across the ranks; Tp = the attention heads (by output group) and the
// head's vocabulary rows split; EpTp = both. What is not split is replicated.
enum class Parallel { None, Ep, Tp, EpTp };

struct EngineOptions {
  std::string model_dir;
  WeightLoad load = WeightLoad::Auto;
  Device device = Device::Cpu;
  int threads = 0;          // CPU threads (0 = all cores)
  int64_t context = 0;      // positions a sequence may hold (0 = the model's max_position_embeddings)
  std::string tokenizer{};  // tokenizer.json or its directory ("" = <model_dir>/tokenizer.json when present)
  // For apps that encode text with the tokenizer: it must be there and its ids must be inputs the
  // model has (vocab_size), both checked before the weights load. Without it a larger tokenizer
  // is accepted (the tiny test models take ids, and decode theirs with the real tokenizer).
  bool require_tokenizer = false;
  // The tokenizer check_model_dir returned for these options: the Engine takes it instead of
  // reading the file again (a real tokenizer.json takes ~0.5 s to parse). Rank 0's only.
  std::shared_ptr<Tokenizer> checked_tokenizer{};
  // Bytes the sequences' caches may reserve together (see SequenceOptions::max_positions):
  // 0 = no limit, kAutoMemoryBudget = 90% of the memory available once the weights are loaded.
  // Applies to the CPU backend's host caches (the CUDA backend sizes its device caches at load).
  int64_t memory_budget = 0;
  // Under mpirun with more than one process: how the ranks split the model. Rank 0's Engine
  // drives; the other ranks' Engines follow it (engine/cluster.h) and must be given the same
  // options. None under mpirun with N > 1 is an error.
  Parallel parallel = Parallel::None;
  // cuda: decode steps as CUDA graphs, captured once per batch of sequences and replayed
  // (docs/cuda.md "Decode step as one graph"); off runs every step eagerly (batches that change
  // every step would capture every step).
  bool cuda_graphs = true;
};

constexpr int64_t kAutoMemoryBudget = -1;

// What apps may know about the loaded model.
struct ModelInfo {
  std::string dir, format, device, load;  // format: e.g. "native (FP8 + MXFP4 experts)"; load: mmap | read
  int64_t vocab = 0, dim = 0, n_layers = 0, hc = 0, window = 0;
  int64_t context = 0;        // positions a sequence may hold
  int64_t bos = 0, eos = 1;
  bool has_mtp = false;
  int64_t hidden_size = 0;    // floats in one row of final hidden state (hc * dim)
  double weight_bytes = 0;    // bytes of the checkpoint's tensors
  int world = 1, rank = 0;    // processes of a parallel run and this one's rank
  std::string parallel;       // "none" | "ep" | "tp" | "ep+tp"
  int64_t memory_budget = 0;  // bytes the sequences' caches may reserve together (0 = no limit)
  // The most candidates (top-k, or the vocabulary when top-k is 0) a StepRequest::sampler may
  // pick from: the vocabulary on cpu; on cuda min(vocabulary, 4096), the device sort's limit.
  int64_t sample_candidates = 0;
};

// Tokens a truncate may drop without recomputing (speculative decoding rewinds every step).
// Deeper rewinds replay the kept tokens from the start (a prefill of `pos` tokens).
constexpr int64_t kCheapRewind = 16;

class Engine;
class Cluster;
struct Lockstep;

// A sequence's state. Move-only; belongs to the Engine that made it and must not outlive it.
class Sequence {
 public:
  Sequence();
  ~Sequence();
  Sequence(Sequence&&) noexcept;
  Sequence& operator=(Sequence&&) noexcept;

  int64_t pos() const;                        // main-model tokens consumed
  int64_t mtp_pos() const;                    // MTP block positions consumed
  const std::vector<int32_t>& tokens() const; // the main-model tokens consumed, in order
  size_t cache_bytes() const;                 // bytes of cache this sequence references
  bool broken() const;                        // a failed step left it half-written
  bool mtp() const;                           // SequenceOptions::mtp
  int64_t max_positions() const;              // SequenceOptions::max_positions (resolved)

  struct Impl;  // opaque (engine/engine.cpp)

 private:
  friend class Engine;
  std::unique_ptr<Impl> impl_;
};

// An immutable copy of a sequence's state to continue from later (prefix cache, n > 1
// completions). Costs the window rows and compressor rows; compressed entries are shared.
class Snapshot {
 public:
  Snapshot();
  ~Snapshot();
  Snapshot(const Snapshot&);
  Snapshot& operator=(const Snapshot&);
  int64_t pos() const;
  const std::vector<int32_t>& tokens() const;
  size_t bytes() const;         // bytes this snapshot holds on its own (not shared with its origin)

  struct Impl;  // opaque (engine/engine.cpp)

 private:
  friend class Engine;
  std::shared_ptr<const Impl> impl_;
};

// Per-sequence options.
struct SequenceOptions {
  // Keep the MTP block in step with the main model (MODEL.md "MTP block"): after every step
  // the block consumes each position whose next token is known, so it can draft (Engine::draft)
  // and report its logits (StepRequest::mtp_logits). Costs one MTP block pass per token.
  bool mtp = false;
  // The most positions this sequence will hold (0 = the engine's context). The engine reserves
  // the cache this can take (Engine::sequence_bytes) against the memory budget when the
  // sequence is made, so a sequence that would not fit is refused up front (ResourceExhausted)
  // instead of running out of memory mid-generation; steps beyond it are refused.
  int64_t max_positions = 0;
};

// One sequence's part of a step.
struct StepRequest {
  Sequence* seq = nullptr;
  std::vector<int32_t> tokens;  // fed at positions seq->pos()..
  Rows logits = Rows::Last;     // None / Last ([1, vocab]) / All ([n, vocab])
  bool hidden = false;          // also return the final hc state of every row ([n, hc*dim])
  bool mtp_logits = false;      // also return the MTP block's logits of the positions it consumed
  // Return the greedy token of each logits row (StepResult::ids) instead of the logits: on cuda
  // only the ids leave the device.
  bool ids_only = false;
  // Like ids_only, but each logits row's token is this sampler's next pick (Sampler::row: one
  // draw per non-greedy row, in row order; the same token Sampler::sample would pick from the
  // row's logits). On cuda the pick runs on the device and only the ids come back. Checked before
  // the step: the sampler has no penalties (they need the history: sample from the logits
  // instead) and at most ModelInfo::sample_candidates candidates. Not owned; not sent to the
  // followers of a parallel run (the leader picks).
  Sampler* sampler = nullptr;
};

struct StepResult {
  std::vector<float> logits;      // [rows, vocab] (empty with StepRequest::ids_only)
  std::vector<int32_t> ids;       // [rows] with ids_only: the first largest logit's index; with sampler: its picks
  std::vector<float> hidden;      // [n, hc*dim] when asked
  // MTP sequences, when asked: the block's logits for positions [mtp_first, mtp_first + rows),
  // row t = the block at position t given token t+1, predicting token t+2.
  std::vector<float> mtp_logits;
  int64_t mtp_first = 0;
};

// Greedy drafts for speculative decoding: `next` is the token that will be fed next (sampled
// from the last logits); the MTP block drafts the n tokens after it, each from its own
// previous output.
struct DraftRequest {
  Sequence* seq = nullptr;
  int32_t next = 0;
  int64_t n = 1;  // 1..kCheapRewind
};

class Engine {
 public:
  explicit Engine(const EngineOptions& o);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ModelInfo& info() const { return info_; }
  bool has_tokenizer() const { return tokenizer_ != nullptr; }
  const Tokenizer& tokenizer() const;  // throws Error when the model has no tokenizer.json

  // Throws ResourceExhausted when the sequence's reservation does not fit the memory budget.
  Sequence new_sequence(const SequenceOptions& o = {});
  // fork / restore reserve like new_sequence; max_positions 0 = that of the origin.
  Sequence fork(const Sequence& s, int64_t max_positions = 0);
  Snapshot snapshot(const Sequence& s);
  Sequence restore(const Snapshot& snap, int64_t max_positions = 0);
  // Snapshots on disk (the server's prefix cache across restarts). A file holds the snapshot's
  // tokens and state, bound by a fingerprint to this model, this executable and the kernels' ISA
  // (engine/snapshot_file.h): another engine's file is never misread. cpu, one process only
  // (Unsupported otherwise). save writes path + ".tmp", then renames it over path.
  void save_snapshot(const Snapshot& s, const std::string& path);
  // save_snapshot in two halves: the file's contents gathered here (a copy of the state), to be
  // written by write_snapshot_file on any thread, so the engine's thread does not wait on a disk.
  SnapshotImage snapshot_image(const Snapshot& s);
  // Throws Error (BadInput) naming the file and what is wrong when it is damaged, truncated or
  // another engine's.
  Snapshot load_snapshot(const std::string& path);
  // The tokens of a snapshot file, read from its header; nullopt when it is another engine's.
  // Throws Error when it is not a snapshot file.
  std::optional<std::vector<int32_t>> snapshot_file_tokens(const std::string& path);

  // Drops the tokens at positions >= pos (and the MTP positions that depend on them): feeding
  // new tokens afterwards gives exactly what a fresh sequence fed the new stream gives.
  void truncate(Sequence& s, int64_t pos);

  // One batched step. Results in request order.
  std::vector<StepResult> step(const std::vector<StepRequest>& reqs);
  // Drafts for each request's sequence (SequenceOptions::mtp), batched: n MTP passes.
  std::vector<std::vector<int32_t>> draft(const std::vector<DraftRequest>& reqs);

  // The most cache bytes a sequence of up to `positions` positions reserves (0 on cuda).
  size_t sequence_bytes(int64_t positions, bool mtp = false) const;
  int64_t reserved_bytes() const;  // reserved by the live sequences

  struct Budget;  // opaque (engine/engine.cpp)

  // Bytes this process has sent to the other ranks of a parallel run so far (0 alone).
  uint64_t bytes_sent() const;

 private:
  friend class Cluster;
  // A follower rank: runs the leader's requests until its engine ends (engine/cluster.cpp).
  void follow();
  void check_seq(const Sequence& s, const char* what) const;
  void validate(const std::vector<StepRequest>& reqs) const;
  void run_step(const std::vector<StepRequest>& reqs, std::vector<StepResult>& out);
  void rebuild(Sequence& s, int64_t pos);
  void truncate_checked(Sequence& s, int64_t pos);
  // Parallel runs: the id of a sequence or snapshot made from `from` (the leader first tells the
  // followers to make the same); 0 alone.
  uint64_t announce(int cmd, uint64_t from, int64_t max_positions);
  void reserve(Sequence::Impl& q, int64_t max_positions, const char* what);
  template <class From>
  Sequence continue_from(const From& f, const char* what, const char* noun, int cmd, int64_t max_positions);

  std::unique_ptr<Model> model_;
  std::shared_ptr<Tokenizer> tokenizer_;
  ModelInfo info_;
  std::shared_ptr<Budget> budget_;
  std::shared_ptr<Lockstep> lockstep_;  // parallel runs
  uint64_t fingerprint_ = 0;            // of snapshot files, computed when first needed
  uint64_t snapshot_fingerprint(const char* what);
};

WeightLoad parse_weight_load(const std::string& s);  // "auto" | "mmap" | "read"; throws Error
Device parse_device(const std::string& s);           // "cpu" | "cuda"; throws Error
Parallel parse_parallel(const std::string& s);       // "none" | "ep" | "tp" | "ep+tp"; throws Error
// Whether this build can run on `d` here; when not, `why` says why.
bool device_usable(Device d, std::string* why);

// What the Engine's constructor reads and checks before the weights, alone: config.json, then
// the tokenizer (with require_tokenizer's checks), throwing the same errors. For apps that must
// refuse a wrong --model or tokenizer before anything else (dsv4 serve, before it listens).
// Returns the tokenizer (nullptr when there is none and none is required), to be handed to the
// Engine as EngineOptions::checked_tokenizer.
std::shared_ptr<Tokenizer> check_model_dir(const EngineOptions& o);

}  // namespace dsv4
