#pragma once
// Random DeepSeek-V4 checkpoints at small dimensions, in any of the published layouts, for
// tests, demos and benchmarks. Every layer kind is present: window-only, CSA (ratio 4 +
// indexer), HCA, hash-routed MoE, and an mtp.0 block.
#include <cstdint>
#include <string>

#include "io/config.h"

namespace dsv4 {

struct TinyOptions {
  std::string out_dir;
  std::string preset = "tiny";    // tiny | small | demo
  std::string format = "native";  // native | nvfp4 | hf-bf16
  uint64_t seed = 0;
  int shards = 1;
  std::string tokenizer_dir;  // optional: tokenizer.json (file or directory) copied into out_dir
};

// The configuration a preset stands for (throws dsv4::Error for an unknown preset).
ModelConfig tiny_preset(const std::string& preset);

// Writes config.json + safetensors (sharded when shards > 1) into out_dir (created if needed).
void make_tiny(const TinyOptions& opt);

}  // namespace dsv4
