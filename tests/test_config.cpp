// config.json parsing (HF and native reference keys), validation errors, the HF export, and the
// native -> HF tensor-name mapping checked against the golden checkpoints' real tensor names.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/config.h"
#include "io/names.h"
#include "io/safetensors.h"

using namespace dsv4;
using nlohmann::json;

namespace {

const std::string kGolden = std::string(DSV4_TEST_DATA) + "/golden";

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

json golden_json() { return read_json(kGolden + "/tiny-native/model/config.json"); }

void expect_same(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rope_dim, b.rope_dim);
  EXPECT_EQ(a.q_lora, b.q_lora);
  EXPECT_EQ(a.o_groups, b.o_groups);
  EXPECT_EQ(a.o_lora, b.o_lora);
  EXPECT_EQ(a.window, b.window);
  EXPECT_EQ(a.compress_ratios, b.compress_ratios);
  EXPECT_EQ(a.n_experts, b.n_experts);
  EXPECT_EQ(a.n_active, b.n_active);
  EXPECT_EQ(a.n_shared, b.n_shared);
  EXPECT_EQ(a.moe_inter, b.moe_inter);
  EXPECT_EQ(a.n_hash, b.n_hash);
  EXPECT_EQ(a.hc, b.hc);
  EXPECT_EQ(a.sinkhorn_iters, b.sinkhorn_iters);
  EXPECT_EQ(a.index_heads, b.index_heads);
  EXPECT_EQ(a.index_dim, b.index_dim);
  EXPECT_EQ(a.index_topk, b.index_topk);
  EXPECT_EQ(a.n_mtp, b.n_mtp);
  EXPECT_EQ(a.eps, b.eps);
  EXPECT_EQ(a.hc_eps, b.hc_eps);
  EXPECT_EQ(a.route_scale, b.route_scale);
  EXPECT_EQ(a.swiglu_limit, b.swiglu_limit);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.compress_rope_theta, b.compress_rope_theta);
  EXPECT_EQ(a.yarn_factor, b.yarn_factor);
  EXPECT_EQ(a.yarn_beta_fast, b.yarn_beta_fast);
  EXPECT_EQ(a.yarn_beta_slow, b.yarn_beta_slow);
  EXPECT_EQ(a.yarn_original, b.yarn_original);
  EXPECT_EQ(a.max_positions, b.max_positions);
  EXPECT_EQ(a.bos, b.bos);
  EXPECT_EQ(a.eos, b.eos);
  EXPECT_EQ(a.score_func, b.score_func);
}

// parse_config(j) must throw dsv4::Error whose message names `key` (and the `where` prefix).
void expect_error(const json& j, const std::string& key) {
  try {
    parse_config(j, "cfg.json");
    ADD_FAILURE() << "no error for a config that should fail on " << key;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(key), std::string::npos) << "message does not name " << key << ": " << msg;
    EXPECT_NE(msg.find("cfg.json"), std::string::npos) << msg;
  }
}

}  // namespace

TEST(Config, GoldenValues) {
  const ModelConfig c = load_config(kGolden + "/tiny-native/model/config.json");
  EXPECT_EQ(c.vocab, 1024);
  EXPECT_EQ(c.dim, 256);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.q_lora, 128);
  EXPECT_EQ(c.o_groups, 2);
  EXPECT_EQ(c.o_lora, 128);
  EXPECT_EQ(c.window, 16);
  EXPECT_EQ(c.compress_ratios, (std::vector<int64_t>{0, 4, 16, 4, 16, 0}));
  EXPECT_EQ(c.n_experts, 8);
  EXPECT_EQ(c.n_active, 2);
  EXPECT_EQ(c.n_shared, 1);
  EXPECT_EQ(c.moe_inter, 128);
  EXPECT_EQ(c.n_hash, 2);
  EXPECT_EQ(c.hc, 4);
  EXPECT_EQ(c.hc_mix(), 24);
  EXPECT_EQ(c.sinkhorn_iters, 20);
  EXPECT_EQ(c.index_heads, 4);
  EXPECT_EQ(c.index_dim, 128);
  EXPECT_EQ(c.index_topk, 4);
  EXPECT_EQ(c.n_mtp, 1);
  EXPECT_EQ(c.eps, 1e-6);
  EXPECT_EQ(c.hc_eps, 1e-6);
  EXPECT_EQ(c.route_scale, 2.5);
  EXPECT_EQ(c.swiglu_limit, 10.0);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_EQ(c.yarn_factor, 16.0);
  EXPECT_EQ(c.yarn_original, 65536);
  EXPECT_EQ(c.yarn_beta_fast, 32.0);
  EXPECT_EQ(c.yarn_beta_slow, 1.0);
  EXPECT_EQ(c.max_positions, 1048576);
  EXPECT_EQ(c.bos, 0);
  EXPECT_EQ(c.eos, 1);
  EXPECT_EQ(c.score_func, "sqrtsoftplus");
  EXPECT_EQ(c.ratio(1), 4);
  EXPECT_EQ(c.layer_kind(0), "window");
  EXPECT_EQ(c.layer_kind(1), "CSA(4)");
  EXPECT_EQ(c.layer_kind(2), "HCA(16)");
  // The HF golden checkpoint carries the same model.
  expect_same(load_config(kGolden + "/tiny-hf-bf16-sharded/model/config.json"), c);
}

TEST(Config, NativeKeys) {
  // The reference code's own key names give the same config.
  const json hf = golden_json();
  json j = hf;
  auto rename = [&](const char* from, const char* to) {
    ASSERT_TRUE(j.contains(from)) << from;
    j[to] = j[from];
    j.erase(from);
  };
  rename("hidden_size", "dim");
  rename("num_hidden_layers", "n_layers");
  rename("num_attention_heads", "n_heads");
  rename("sliding_window", "window_size");
  rename("qk_rope_head_dim", "rope_head_dim");
  rename("moe_intermediate_size", "moe_inter_dim");
  rename("num_experts_per_tok", "n_activated_experts");
  rename("num_hash_layers", "n_hash_layers");
  rename("rms_norm_eps", "norm_eps");
  rename("routed_scaling_factor", "route_scale");
  rename("scoring_func", "score_func");
  rename("max_position_embeddings", "max_seq_len");
  const json rs = j["rope_scaling"];
  j.erase("rope_scaling");
  j["rope_factor"] = rs["factor"];
  j["original_seq_len"] = rs["original_max_position_embeddings"];
  j["beta_fast"] = rs["beta_fast"];
  j["beta_slow"] = rs["beta_slow"];
  ASSERT_FALSE(j.contains("hidden_size"));
  expect_same(parse_config(j, "native"), parse_config(hf, "hf"));

  // Distinct values, so a key read from the wrong place would show.
  j["rope_factor"] = 8;
  j["original_seq_len"] = 4096;
  j["beta_fast"] = 16;
  j["beta_slow"] = 2;
  j["norm_eps"] = 1e-5;
  j["route_scale"] = 1.5;
  j["window_size"] = 32;
  j["n_hash_layers"] = 1;
  const ModelConfig c = parse_config(j, "native");
  EXPECT_EQ(c.yarn_factor, 8.0);
  EXPECT_EQ(c.yarn_original, 4096);
  EXPECT_EQ(c.yarn_beta_fast, 16.0);
  EXPECT_EQ(c.yarn_beta_slow, 2.0);
  EXPECT_EQ(c.eps, 1e-5);
  EXPECT_EQ(c.route_scale, 1.5);
  EXPECT_EQ(c.window, 32);
  EXPECT_EQ(c.n_hash, 1);
}

TEST(Config, RoundTrip) {
  const ModelConfig c = parse_config(golden_json(), "golden");
  const json j = config_to_json(c);
  const ModelConfig back = parse_config(j, "round trip");
  expect_same(back, c);
  EXPECT_EQ(config_to_json(back), j);
  // Non-default values of every optional key survive too.
  ModelConfig d = c;
  d.n_hash = 0;
  d.n_mtp = 0;
  d.swiglu_limit = 0;
  d.route_scale = 1.5;
  d.rope_theta = 50000;
  d.compress_rope_theta = 20000;
  d.yarn_factor = 4;
  d.yarn_original = 4096;
  d.yarn_beta_fast = 16;
  d.yarn_beta_slow = 2;
  d.sinkhorn_iters = 3;
  d.hc_eps = 1e-5;
  d.eps = 1e-5;
  d.bos = 7;
  d.eos = 9;
  d.max_positions = 8192;
  expect_same(parse_config(config_to_json(d), "round trip 2"), d);
}

TEST(Config, ShortCompressRatiosGetWindowMtp) {
  json j = golden_json();
  j["compress_ratios"] = {0, 4, 16, 4, 16};  // L entries: the MTP layer is window-only
  const ModelConfig c = parse_config(j, "cfg");
  EXPECT_EQ(c.compress_ratios, (std::vector<int64_t>{0, 4, 16, 4, 16, 0}));
}

TEST(Config, ValidationErrors) {
  const json base = golden_json();
  {
    json j = base;
    j.erase("hidden_size");
    expect_error(j, "hidden_size");
  }
  {
    json j = base;
    j["compress_ratios"] = {0, 4, 16};
    expect_error(j, "compress_ratios");
  }
  {
    json j = base;
    j["compress_ratios"] = {0, 4, 16, 4, 16, 0, 0};
    expect_error(j, "compress_ratios");
  }
  {
    json j = base;
    j.erase("compress_ratios");
    expect_error(j, "compress_ratios");
  }
  {
    json j = base;
    j["o_groups"] = 3;  // 4 heads
    expect_error(j, "o_groups");
    expect_error(j, "num_attention_heads");
  }
  {
    json j = base;
    j["num_experts_per_tok"] = 9;  // 8 experts
    expect_error(j, "num_experts_per_tok");
    expect_error(j, "n_routed_experts");
  }
  for (int hd : {64, 32}) {
    json j = base;
    j["head_dim"] = hd;  // rope dim 64
    expect_error(j, "head_dim");
  }
  {
    json j = base;
    j["scoring_func"] = "softmax";
    expect_error(j, "scoring_func");
  }
  {
    json j = base;
    j["hidden_size"] = 256.5;
    expect_error(j, "hidden_size");
  }
  {
    json j = base;
    j["hidden_size"] = "256";
    expect_error(j, "hidden_size");
  }
  {
    json j = base;
    j["num_hidden_layers"] = true;
    expect_error(j, "num_hidden_layers");
  }
  {
    json j = base;
    j["compress_ratios"] = {0, 4.5, 16, 4, 16, 0};
    expect_error(j, "compress_ratios");
  }
  {
    json j = base;
    j["rms_norm_eps"] = "tiny";
    expect_error(j, "rms_norm_eps");
  }
  {
    json j = base;
    j["hidden_size"] = 0;
    expect_error(j, "hidden_size");
  }
  // Beyond int64 (as a float, a cast would be undefined: found by the checkpoint fuzzer; as an
  // unsigned, it would wrap): refused, naming the key.
  for (const json& big : {json(4.4e98), json(-1e19), json(18446744073709551615ull)}) {
    json j = base;
    j["hidden_size"] = big;
    expect_error(j, "hidden_size");
  }
  // A nested object's errors name it. The message is built from `where + " rope_scaling"`, a
  // temporary the reader once held by reference (the checkpoint fuzzer's stack-use-after-scope).
  for (const json& bad : {json(6.5e98), json("16"), json(2.5)}) {
    json j = base;
    j["rope_scaling"] = {{"type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", bad}};
    expect_error(j, "cfg.json rope_scaling: key original_max_position_embeddings");
  }
  // A whole-number float is an integer.
  json j = base;
  j["hidden_size"] = 256.0;
  EXPECT_EQ(parse_config(j, "cfg").dim, 256);
  EXPECT_THROW(parse_config(json::array(), "cfg"), Error);
}

// ---- tensor names -------------------------------------------------------------------------------

TEST(Names, NativeToHfPairs) {
  const std::map<std::string, std::string> pairs = {
      {"embed.weight", "model.embed_tokens.weight"},
      {"head.weight", "lm_head.weight"},
      {"norm.weight", "model.norm.weight"},
      {"hc_head_fn", "model.hc_head.hc_fn"},
      {"hc_head_scale", "model.hc_head.hc_scale"},
      {"layers.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"},
      {"layers.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight"},
      {"layers.0.hc_attn_fn", "model.layers.0.attn_hc.fn"},
      {"layers.3.hc_ffn_scale", "model.layers.3.ffn_hc.scale"},
      {"layers.0.attn.attn_sink", "model.layers.0.self_attn.sinks"},
      {"layers.0.attn.wq_a.weight", "model.layers.0.self_attn.q_a_proj.weight"},
      {"layers.0.attn.q_norm.weight", "model.layers.0.self_attn.q_a_norm.weight"},
      {"layers.0.attn.wo_b.weight", "model.layers.0.self_attn.o_b_proj.weight"},
      {"layers.1.attn.compressor.ape", "model.layers.1.self_attn.compressor.position_bias"},
      {"layers.1.attn.compressor.norm.weight", "model.layers.1.self_attn.compressor.kv_norm.weight"},
      {"layers.1.attn.indexer.compressor.wkv.weight", "model.layers.1.self_attn.compressor.indexer.kv_proj.weight"},
      {"layers.1.attn.indexer.compressor.ape", "model.layers.1.self_attn.compressor.indexer.position_bias"},
      {"layers.1.attn.indexer.wq_b.weight", "model.layers.1.self_attn.compressor.indexer.q_b_proj.weight"},
      {"layers.1.attn.indexer.weights_proj.weight", "model.layers.1.self_attn.compressor.indexer.weights_proj.weight"},
      {"layers.2.ffn.gate.bias", "model.layers.2.mlp.gate.e_score_correction_bias"},
      {"layers.0.ffn.gate.tid2eid", "model.layers.0.mlp.gate.tid2eid"},
      {"layers.0.ffn.experts.3.w1.weight", "model.layers.0.mlp.experts.3.gate_proj.weight"},
      {"layers.4.ffn.experts.7.w2.weight", "model.layers.4.mlp.experts.7.down_proj.weight"},
      {"layers.0.ffn.shared_experts.w3.weight", "model.layers.0.mlp.shared_experts.up_proj.weight"},
      {"mtp.0.e_proj.weight", "mtp.0.e_proj.weight"},
      {"mtp.0.enorm.weight", "mtp.0.enorm.weight"},
      {"mtp.0.hc_head_fn", "mtp.0.hc_head.hc_fn"},
      {"mtp.0.hc_attn_base", "mtp.0.attn_hc.base"},
      {"mtp.0.attn.wkv.weight", "mtp.0.self_attn.kv_proj.weight"},
      // FP8 block scales.
      {"layers.0.attn.wq_a.scale", "model.layers.0.self_attn.q_a_proj.weight_scale_inv"},
      {"layers.0.ffn.experts.3.w2.scale", "model.layers.0.mlp.experts.3.down_proj.weight_scale_inv"},
      {"mtp.0.h_proj.scale", "mtp.0.h_proj.weight_scale_inv"},
  };
  const json index = read_json(kGolden + "/tiny-hf-bf16-sharded/model/model.safetensors.index.json");
  const json& wm = index.at("weight_map");
  for (const auto& [native, hf] : pairs) {
    EXPECT_EQ(layout_tensor_name(Layout::HF, native), hf) << native;
    EXPECT_EQ(layout_tensor_name(Layout::Native, native), native);
    if (hf.find("weight_scale_inv") == std::string::npos) { EXPECT_TRUE(wm.contains(hf)) << hf << " not in the HF golden index"; }
  }
}

TEST(Names, GoldenNativeMapsOntoGoldenHf) {
  // Every non-scale tensor of the native golden checkpoint maps to a tensor of the (BF16) HF
  // golden checkpoint of the same model, and the two name sets are equal.
  const auto st = SafeTensorsFile::open(kGolden + "/tiny-native/model/model.safetensors");
  const json index = read_json(kGolden + "/tiny-hf-bf16-sharded/model/model.safetensors.index.json");
  std::set<std::string> hf;
  for (const auto& [name, file] : index.at("weight_map").items()) hf.insert(name);
  std::set<std::string> mapped;
  size_t scales = 0;
  for (const auto& [name, info] : st->tensors()) {
    if (info.dtype == DType::F8_E8M0) {  // FP8 / MXFP4 block scales: absent from a BF16 export
      EXPECT_TRUE(name.ends_with(".scale")) << name;
      ++scales;
      continue;
    }
    const std::string h = layout_tensor_name(Layout::HF, name);
    EXPECT_TRUE(hf.count(h)) << name << " -> " << h << " is not in the HF index";
    EXPECT_TRUE(mapped.insert(h).second) << "two native names map to " << h;
  }
  EXPECT_GT(scales, 0u);
  EXPECT_GT(mapped.size(), 100u);
  EXPECT_EQ(mapped, hf);
}
