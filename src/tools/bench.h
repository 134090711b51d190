#pragma once
// `dsv4 bench`: prefill and decode speed of a model on this machine, reported against the
// memory-bandwidth and FMA limits measured in the same run.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/forward.h"
#include "model/ops.h"

namespace dsv4 {

struct BenchOptions {
  std::string model_dir;
  int64_t prompt_len = 512;
  int64_t gen = 16;
  int threads = 0;
  bool json = false;
  LoadMode load = LoadMode::Auto;
  // Another device than the CPU: its name and how to build the Model on it. On such a device
  // the host's bandwidth / FMA limits and the CPU matmul counters do not apply: those fields
  // (and the roofline ratios) stay 0.
  std::string device = "cpu";
  std::function<Model(ModelWeights)> make_model;
  // CPU: also time every matmul by weight format and shape (two clock reads per call).
  bool profile = false;
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
  std::string isa;
  std::string load;  // how the weights were loaded: mmap | read
  std::string device = "cpu";
  double prefill_s = 0, decode_s = 0;  // wall time of the prefill and of all decode steps
  // With BenchOptions::profile: time inside matmul per weight and shape, per phase.
  std::vector<MatmulProfileRow> prefill_profile, decode_profile;
};

BenchResult run_bench(const BenchOptions& o);
std::string bench_json(const BenchResult& r);
std::string bench_table(const BenchResult& r);

}  // namespace dsv4
