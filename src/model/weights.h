#pragma once
// The DeepSeek-V4 weights bound to a checkpoint directory. Large tensors stay in their stored
// (mmap'd, possibly quantised) form as QWeight views; only small vectors (norms, mHC mixers,
// sinks, biases, routing tables) are converted to float/int at load. Which tensors exist, their
// names and shapes: the one list in model/tensors.h, which also fills these structs.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/weight.h"
#include "io/config.h"
#include "io/names.h"
#include "io/safetensors.h"
#include "parallel/partition.h"

namespace dsv4 {

struct HcMixW {  // one mHC mixer: fn [M or hc, hc*D], base, scale
  std::vector<float> fn, base, scale;
};

struct CompressorW {
  int64_t ratio = 0, coff = 1, out_dim = 0;  // out_dim: d (main) or dI (indexer)
  QWeight wkv, wgate;                        // [coff*out_dim, D]
  std::vector<float> ape;                    // [ratio, coff*out_dim]
  std::vector<float> norm;                   // [out_dim]
};

// Which of a layer's compressors: the one making KV entries (CSA / HCA) or the indexer's keys (CSA).
enum class Comp { Kv, Index };

struct IndexerW {
  QWeight wq_b;          // [HI*dI, Qr]
  QWeight weights_proj;  // [HI, D]
  CompressorW comp;
};

struct AttentionW {
  QWeight wq_a, wq_b, wkv, wo_a, wo_b;
  std::vector<float> q_norm, kv_norm, sink;
  std::optional<CompressorW> comp;  // CSA and HCA layers
  std::optional<IndexerW> indexer;  // CSA layers
};

struct ExpertW {
  QWeight w1, w2, w3;  // gate, down, up
};

struct MoEW {
  QWeight gate;                  // [E, D]
  std::vector<float> bias;       // [E], non-hash layers
  std::vector<int32_t> tid2eid;  // [V, k], hash layers
  std::vector<ExpertW> experts;
  ExpertW shared;
};

struct LayerW {
  int64_t ratio = 0;
  LayerKind kind() const { return ModelConfig::kind_of_ratio(ratio); }
  bool hash = false;
  std::vector<float> attn_norm, ffn_norm;
  HcMixW hc_attn, hc_ffn;
  AttentionW attn;
  MoEW ffn;
};

struct MtpW {
  LayerW block;
  QWeight e_proj, h_proj;
  std::vector<float> enorm, hnorm, norm;
  HcMixW hc_head;
};

struct ModelWeights {
  ModelConfig cfg;
  Layout layout = Layout::Native;
  std::string dir;
  TensorStore store;  // owns the mappings every QWeight points into
  QWeight embed, head;
  std::vector<float> norm;
  HcMixW hc_head;
  std::vector<LayerW> layers;
  std::optional<MtpW> mtp;

  // Layer l in [0, n_layers]: a main layer, or (n_layers) the MTP block.
  const LayerW& layer(int64_t l) const { return l < cfg.n_layers ? layers[l] : mtp->block; }

  // "native (FP8 + MXFP4 experts)", "native (FP8 + NVFP4 experts)", "hf (BF16)", ...
  std::string format_summary() const;
};

// DIR/config.json, read and validated: the first thing load_model does. Throws dsv4::Error naming
// DIR when it holds no config.json (no model directory at all), or the key that is wrong.
ModelConfig load_model_config(const std::string& dir);

// Loads config.json and binds every tensor of the list (model/tensors.h); throws dsv4::Error
// naming the missing tensor or the one whose dtype/shape disagrees with the config. `mode` says
// how the checkpoint bytes get into memory (see LoadMode).
ModelWeights load_model(const std::string& dir, LoadMode mode = LoadMode::Auto);
// A rank of a parallel run: EP binds (and reads) only the routed experts `share` gives this rank,
// the others stay empty QWeights (rows == 0) whose bytes are never touched; TP binds the whole
// attention wq_b / wo_a and head matrices but reads only this rank's rows of them (the rest of
// each stays untouched address space).
ModelWeights load_model(const std::string& dir, LoadMode mode, const Share& share);

}  // namespace dsv4
