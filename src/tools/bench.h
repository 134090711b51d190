#pragma once
// `dsv4 bench`: prefill and decode speed of a model on this machine, reported against the
// memory-bandwidth and FMA limits measured in the same run.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace dsv4 {

struct BenchOptions {
  std::string model_dir;
  int64_t prompt_len = 512;
  int64_t gen = 16;
  int64_t chunk = 0;  // prefill chunk (0 = the whole prompt in one step)
  int threads = 0;
  bool json = false;
  WeightLoad load = WeightLoad::Auto;
  // On another device than the CPU the host's bandwidth / FMA limits and the CPU matmul
  // counters do not apply: those fields (and the roofline ratios) stay 0.
  Device device = Device::Cpu;
  // Decode batch sizes: for each B, B sequences forked from the prefilled one (each then fed
  // its own first token, so they route to different experts) decode `gen` steps together.
  std::vector<int64_t> batches = {1};
  // Speculative decode with the MTP block: for each n, a fork of an MTP sequence (prefilled
  // like the main one) decodes `gen` greedy steps of n drafts each, as `generate --draft n`
  // does, against the batch-1 decode (which must be among `batches`).
  std::vector<int64_t> drafts;
  // CPU: also time every matmul by weight format and shape (two clock reads per call).
  bool profile = false;
  int64_t memory_budget = 0;  // EngineOptions::memory_budget
  Parallel parallel = Parallel::None;  // EngineOptions::parallel (mpirun)
};

// Time inside matmul for one weight format and shape (`--profile`).
struct BenchProfileRow {
  std::string what;  // e.g. "FP8Block 32768x1024 T=1"
  int64_t calls = 0;
  double seconds = 0;
  uint64_t weight_bytes = 0, flops = 0;
};

// Time of a stage outside matmul that grows with the context (`--profile`): the indexer's scan,
// attention per layer kind, the compressors.
struct BenchStageRow {
  std::string what;
  int64_t calls = 0;
  double seconds = 0;
};

struct BenchResult {
  int threads = 0;
  int64_t prompt_len = 0, gen = 0;
  double prefill_tok_s = 0, decode_tok_s = 0;
  double decode_bytes_per_token = 0;  // weight bytes read per decode step
  double prefill_flops_per_token = 0; // matmul FLOPs per prefill token
  double mem_bw_gb_s = 0, peak_gflop_s = 0;
  double decode_roofline_ratio = 0, prefill_roofline_ratio = 0;
  double peak_rss_mb = 0, mapped_weights_mb = 0;
  // Parallel runs (mpirun): processes, mode, and the bytes rank 0 sent per batch-1 decode token.
  int world = 1;
  std::string parallel = "none";
  double decode_sent_per_token = 0;
  std::string isa;
  std::string load;  // how the weights were loaded: mmap | read
  std::string device = "cpu";
  double prefill_s = 0, decode_s = 0;  // wall time of the prefill and of all decode steps
  // Per decode batch size (BenchOptions::batches): aggregate tok/s, weight bytes one step read
  // (each matrix once per step, the routed experts: the union the batch touched) and the
  // bandwidth ratio of those bytes.
  struct BatchRow {
    int64_t batch = 0;
    double tok_s = 0, step_s = 0, bytes_per_step = 0, bw_ratio = 0;
    // With BenchOptions::profile: this batch size's decode steps alone.
    std::vector<BenchProfileRow> profile;
    std::vector<BenchStageRow> stages;
  };
  std::vector<BatchRow> batch_rows;
  // Per draft count (BenchOptions::drafts): time per speculative step (drafting + the step that
  // checks the drafts + the rewind), of which drafting; drafts made and accepted; tokens/s; the
  // step's cost in plain batch-1 steps (what the tokens per step must reach to break even), and
  // the per-draft acceptance rate a at which it does: (1 - a^(n+1)) / (1 - a) tokens per step
  // if each draft is right with probability a once its predecessor was (0 when the step costs
  // no more than a plain one, 2 when even n + 1 tokens fall short).
  struct DraftRow {
    int64_t n = 0, drafted = 0, accepted = 0;
    double step_s = 0, draft_s = 0, tok_s = 0, cost = 0, break_even = 0;
  };
  std::vector<DraftRow> draft_rows;
  // With BenchOptions::profile: time inside matmul per weight and shape, per phase (decode: the
  // batch-1 steps, or the first batch size's without them; every size's in batch_rows).
  std::vector<BenchProfileRow> prefill_profile, decode_profile;
  std::vector<BenchStageRow> prefill_stages, decode_stages;
  // The decoded sequence's cache at the end (positions, bytes it references) and the bound
  // Engine::sequence_bytes gives for that many positions (CPU).
  int64_t kv_positions = 0;
  double kv_bytes = 0, kv_bound_bytes = 0;
};

BenchResult run_bench(const BenchOptions& o);
std::string bench_json(const BenchResult& r);
std::string bench_table(const BenchResult& r);

}  // namespace dsv4
