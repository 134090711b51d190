#pragma once
// Model hyper-parameters from config.json. Accepts the HF keys of the official release
// (hidden_size, num_hidden_layers, rope_scaling, ...) and the reference code's native keys
// (dim, n_layers, window_size, ...). Symbols follow shared/spec/MODEL.md.
#include <cstdint>
#include <string>
#include <vector>

// The forward declarations only: this header is in nearly every file of the build, and the full
// nlohmann header costs ~1.8 s of compile time in each (files that use json include it).
#include <nlohmann/json_fwd.hpp>

namespace dsv4 {

// What a layer's attention reads besides its sliding window (MODEL.md "Attention"): nothing,
// CSA entries (ratio 4: overlapping compressor + indexer top-k), or HCA entries (any other ratio).
enum class LayerKind { Window, CSA, HCA };
constexpr int64_t kCsaRatio = 4;

struct ModelConfig {
  int64_t vocab = 0;           // V
  int64_t dim = 0;             // D
  int64_t n_layers = 0;        // L
  int64_t n_heads = 0;         // H
  int64_t head_dim = 0;        // d
  int64_t rope_dim = 0;        // r
  int64_t q_lora = 0;          // Qr
  int64_t o_groups = 0;        // G
  int64_t o_lora = 0;          // Ro
  int64_t window = 0;          // W
  std::vector<int64_t> compress_ratios;  // L + 1 entries; the last is the MTP layer's
  int64_t n_experts = 0;       // E
  int64_t n_active = 0;        // k
  int64_t n_shared = 1;
  int64_t moe_inter = 0;       // I
  int64_t n_hash = 0;          // n_hash
  int64_t hc = 0;              // hc_mult
  int64_t sinkhorn_iters = 0;
  int64_t index_heads = 0;     // HI
  int64_t index_dim = 0;       // dI
  int64_t index_topk = 0;      // K_I
  int64_t n_mtp = 0;           // num_nextn_predict_layers
  double eps = 1e-6, hc_eps = 1e-6;
  double route_scale = 1.0, swiglu_limit = 0.0;
  double rope_theta = 10000.0, compress_rope_theta = 160000.0;
  double yarn_factor = 1.0, yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;
  int64_t yarn_original = 0;   // original_max_position_embeddings
  int64_t max_positions = 0;
  int64_t bos = 0, eos = 1;
  std::string score_func = "sqrtsoftplus";

  int64_t ratio(int64_t layer) const { return compress_ratios[layer]; }  // layer n_layers: the MTP block
  LayerKind kind(int64_t layer) const { return kind_of_ratio(ratio(layer)); }
  static LayerKind kind_of_ratio(int64_t r) { return r == 0 ? LayerKind::Window : r == kCsaRatio ? LayerKind::CSA : LayerKind::HCA; }
  int64_t hc_mix() const { return (2 + hc) * hc; }  // M, rows of hc_*_fn
  std::string layer_kind(int64_t layer) const { return kind_name(ratio(layer)); }
  static std::string kind_name(int64_t ratio);       // "window", "CSA(4)", "HCA(16)"
};

// Parses and validates (positive dims, divisibility: H*d % G, d > r, r even, d % 64 for the
// fp8 blocks of the non-rope part, dI power of two, compress_ratios length L+1, k <= E,
// n_hash <= L, ...). Throws dsv4::Error naming the key; `where` prefixes messages.
ModelConfig parse_config(const nlohmann::json& j, const std::string& where);
ModelConfig load_config(const std::string& path);

// HF-style config.json (the keys of the official release) for a config.
nlohmann::json config_to_json(const ModelConfig& c);

}  // namespace dsv4
