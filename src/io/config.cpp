#include "io/config.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4 {

using nlohmann::json;

std::string ModelConfig::kind_name(int64_t ratio) {
  switch (kind_of_ratio(ratio)) {
    case LayerKind::Window: return "window";
    case LayerKind::CSA: return "CSA(" + std::to_string(ratio) + ")";
    case LayerKind::HCA: return "HCA(" + std::to_string(ratio) + ")";
  }
  return "?";
}

namespace {

// Reads the first present key among `keys` (HF name first, then the reference's native name).
class Reader {
 public:
  // `where` is copied: callers pass temporaries such as `where + " rope_scaling"`.
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  const json* find(std::initializer_list<const char*> keys) const {
    for (const char* k : keys) {
      auto it = j_.find(k);
      if (it != j_.end() && !it->is_null()) return &*it;
    }
    return nullptr;
  }

  int64_t integer(std::initializer_list<const char*> keys, const int64_t* def = nullptr) const {
    const json* v = find(keys);
    if (!v) {
      if (def) return *def;
      throw Error(where_ + ": missing key " + *keys.begin());
    }
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      throw Error(where_ + ": key " + *keys.begin() + " is out of range, got " + v->dump());
    if (v->is_number_integer()) return v->get<int64_t>();
    // A whole float inside int64's range (casting one outside it is undefined: the fuzzer's 4e98).
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::trunc(d) == d && d >= -9.2e18 && d <= 9.2e18) return static_cast<int64_t>(d);
    }
    throw Error(where_ + ": key " + *keys.begin() + " must be an integer, got " + v->dump());
  }
  int64_t integer_or(std::initializer_list<const char*> keys, int64_t def) const { return integer(keys, &def); }

  double number(std::initializer_list<const char*> keys, double def) const {
    const json* v = find(keys);
    if (!v) return def;
    if (!v->is_number()) throw Error(where_ + ": key " + *keys.begin() + " must be a number, got " + v->dump());
    return v->get<double>();
  }

 private:
  const json& j_;
  const std::string where_;
};

void require(bool ok, const std::string& where, const std::string& what) {
  if (!ok) throw Error(where + ": " + what);
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

void validate(const ModelConfig& c, const std::string& w) {
  auto pos = [&](int64_t v, const char* key) { require(v > 0, w, std::string(key) + " must be > 0, got " + std::to_string(v)); };
  pos(c.vocab, "vocab_size");
  pos(c.dim, "hidden_size");
  pos(c.n_layers, "num_hidden_layers");
  pos(c.n_heads, "num_attention_heads");
  pos(c.head_dim, "head_dim");
  pos(c.rope_dim, "qk_rope_head_dim");
  pos(c.q_lora, "q_lora_rank");
  pos(c.o_groups, "o_groups");
  pos(c.o_lora, "o_lora_rank");
  pos(c.window, "sliding_window");
  pos(c.n_experts, "n_routed_experts");
  pos(c.n_active, "num_experts_per_tok");
  pos(c.moe_inter, "moe_intermediate_size");
  pos(c.hc, "hc_mult");
  pos(c.sinkhorn_iters, "hc_sinkhorn_iters");
  require(c.hc <= 16, w, "hc_mult must be <= 16, got " + std::to_string(c.hc));
  require(c.rope_dim % 2 == 0, w, "qk_rope_head_dim must be even, got " + std::to_string(c.rope_dim));
  require(c.head_dim > c.rope_dim, w, "head_dim (" + std::to_string(c.head_dim) + ") must exceed qk_rope_head_dim (" + std::to_string(c.rope_dim) + ")");
  require((c.head_dim - c.rope_dim) % 64 == 0, w, "head_dim - qk_rope_head_dim must be a multiple of 64 (fp8 blocks), got " + std::to_string(c.head_dim - c.rope_dim));
  require(c.n_heads % c.o_groups == 0, w, "num_attention_heads (" + std::to_string(c.n_heads) + ") must be divisible by o_groups (" + std::to_string(c.o_groups) + ")");
  require(c.n_active <= c.n_experts, w, "num_experts_per_tok (" + std::to_string(c.n_active) + ") exceeds n_routed_experts (" + std::to_string(c.n_experts) + ")");
  require(c.n_hash >= 0 && c.n_hash <= c.n_layers, w, "num_hash_layers must be in [0, num_hidden_layers], got " + std::to_string(c.n_hash));
  require(c.n_shared == 1, w, "n_shared_experts must be 1, got " + std::to_string(c.n_shared));
  require(c.n_mtp >= 0 && c.n_mtp <= 1, w, "num_nextn_predict_layers must be 0 or 1, got " + std::to_string(c.n_mtp));
  require(static_cast<int64_t>(c.compress_ratios.size()) == c.n_layers + 1 ||
              static_cast<int64_t>(c.compress_ratios.size()) == c.n_layers,
          w, "compress_ratios has " + std::to_string(c.compress_ratios.size()) + " entries, expected num_hidden_layers + 1 = " + std::to_string(c.n_layers + 1));
  bool any_csa = false;
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    int64_t r = c.compress_ratios[i];
    require(r >= 0 && (r == 0 || r >= 2), w, "compress_ratios[" + std::to_string(i) + "] must be 0 or >= 2, got " + std::to_string(r));
    any_csa |= r == 4;
  }
  if (any_csa) {
    pos(c.index_heads, "index_n_heads");
    pos(c.index_topk, "index_topk");
    require(is_pow2(c.index_dim), w, "index_head_dim must be a power of two (Hadamard), got " + std::to_string(c.index_dim));
    require(c.index_dim > c.rope_dim, w, "index_head_dim must exceed qk_rope_head_dim");
    require(c.index_dim % 32 == 0, w, "index_head_dim must be a multiple of 32 (fp4 blocks)");
  }
  require(c.score_func == "sqrtsoftplus", w, "scoring_func \"" + c.score_func + "\" is not supported (only sqrtsoftplus)");
  require(c.eps > 0 && c.hc_eps > 0, w, "rms_norm_eps and hc_eps must be > 0");
  require(c.rope_theta > 0 && c.compress_rope_theta > 0, w, "rope_theta and compress_rope_theta must be > 0");
  require(c.yarn_factor >= 1, w, "rope_scaling.factor must be >= 1");
  require(c.yarn_original > 0, w, "rope_scaling.original_max_position_embeddings must be > 0");
}

}  // namespace

ModelConfig parse_config(const json& j, const std::string& where) {
  if (!j.is_object()) throw Error(where + ": config is not a JSON object");
  Reader r(j, where);
  ModelConfig c;
  c.vocab = r.integer({"vocab_size"});
  c.dim = r.integer({"hidden_size", "dim"});
  c.n_layers = r.integer({"num_hidden_layers", "n_layers"});
  c.n_heads = r.integer({"num_attention_heads", "n_heads"});
  c.head_dim = r.integer({"head_dim"});
  c.rope_dim = r.integer({"qk_rope_head_dim", "rope_head_dim"});
  c.q_lora = r.integer({"q_lora_rank"});
  c.o_groups = r.integer({"o_groups"});
  c.o_lora = r.integer({"o_lora_rank"});
  c.window = r.integer({"sliding_window", "window_size"});
  c.n_experts = r.integer({"n_routed_experts"});
  c.n_active = r.integer({"num_experts_per_tok", "n_activated_experts"});
  c.n_shared = r.integer_or({"n_shared_experts"}, 1);
  c.moe_inter = r.integer({"moe_intermediate_size", "moe_inter_dim"});
  c.n_hash = r.integer_or({"num_hash_layers", "n_hash_layers"}, 0);
  c.hc = r.integer_or({"hc_mult"}, 4);
  c.sinkhorn_iters = r.integer_or({"hc_sinkhorn_iters"}, 20);
  c.index_heads = r.integer_or({"index_n_heads"}, 0);
  c.index_dim = r.integer_or({"index_head_dim"}, 0);
  c.index_topk = r.integer_or({"index_topk"}, 0);
  c.n_mtp = r.integer_or({"num_nextn_predict_layers"}, 0);
  c.eps = r.number({"rms_norm_eps", "norm_eps"}, 1e-6);
  c.hc_eps = r.number({"hc_eps"}, 1e-6);
  c.route_scale = r.number({"routed_scaling_factor", "route_scale"}, 1.0);
  c.swiglu_limit = r.number({"swiglu_limit"}, 0.0);
  c.rope_theta = r.number({"rope_theta"}, 10000.0);
  c.compress_rope_theta = r.number({"compress_rope_theta"}, 160000.0);
  c.max_positions = r.integer_or({"max_position_embeddings", "max_seq_len"}, 0);
  c.bos = r.integer_or({"bos_token_id"}, 0);
  c.eos = r.integer_or({"eos_token_id"}, 1);
  if (const json* sf = r.find({"scoring_func", "score_func"})) {
    if (!sf->is_string()) throw Error(where + ": scoring_func must be a string");
    c.score_func = sf->get<std::string>();
  }
  // YaRN: HF nests it under rope_scaling; the reference keeps flat keys.
  if (const json* rs = r.find({"rope_scaling"})) {
    if (!rs->is_object()) throw Error(where + ": rope_scaling must be an object");
    Reader y(*rs, where + " rope_scaling");
    c.yarn_factor = y.number({"factor"}, 1.0);
    c.yarn_original = y.integer_or({"original_max_position_embeddings"}, 0);
    c.yarn_beta_fast = y.number({"beta_fast"}, 32.0);
    c.yarn_beta_slow = y.number({"beta_slow"}, 1.0);
  } else {
    c.yarn_factor = r.number({"rope_factor"}, 1.0);
    c.yarn_original = r.integer_or({"original_seq_len"}, 0);
    c.yarn_beta_fast = r.number({"beta_fast"}, 32.0);
    c.yarn_beta_slow = r.number({"beta_slow"}, 1.0);
  }
  if (c.yarn_original == 0) c.yarn_original = c.max_positions > 0 ? c.max_positions : 65536;

  const json* cr = r.find({"compress_ratios"});
  if (!cr || !cr->is_array()) throw Error(where + ": missing key compress_ratios (array)");
  for (const json& v : *cr) {
    if (!v.is_number_integer()) throw Error(where + ": compress_ratios entries must be integers, got " + v.dump());
    c.compress_ratios.push_back(v.get<int64_t>());
  }
  validate(c, where);
  // A list of exactly L entries (no MTP entry) means the MTP layer is window-only.
  if (static_cast<int64_t>(c.compress_ratios.size()) == c.n_layers) c.compress_ratios.push_back(0);
  return c;
}

ModelConfig load_config(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(path + ": cannot open config");
  std::stringstream ss;
  ss << f.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) throw Error(path + ": not valid JSON");
  return parse_config(j, path);
}

json config_to_json(const ModelConfig& c) {
  json j;
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["model_type"] = "deepseek_v4";
  j["vocab_size"] = c.vocab;
  j["hidden_size"] = c.dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = c.head_dim;
  j["qk_rope_head_dim"] = c.rope_dim;
  j["q_lora_rank"] = c.q_lora;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora;
  j["sliding_window"] = c.window;
  j["compress_ratios"] = c.compress_ratios;
  j["n_routed_experts"] = c.n_experts;
  j["num_experts_per_tok"] = c.n_active;
  j["n_shared_experts"] = c.n_shared;
  j["moe_intermediate_size"] = c.moe_inter;
  j["num_hash_layers"] = c.n_hash;
  j["hc_mult"] = c.hc;
  j["hc_sinkhorn_iters"] = c.sinkhorn_iters;
  j["hc_eps"] = c.hc_eps;
  j["index_n_heads"] = c.index_heads;
  j["index_head_dim"] = c.index_dim;
  j["index_topk"] = c.index_topk;
  j["num_nextn_predict_layers"] = c.n_mtp;
  j["rms_norm_eps"] = c.eps;
  j["routed_scaling_factor"] = c.route_scale;
  j["swiglu_limit"] = c.swiglu_limit;
  j["scoring_func"] = c.score_func;
  j["topk_method"] = "noaux_tc";
  j["norm_topk_prob"] = true;
  j["rope_theta"] = c.rope_theta;
  j["compress_rope_theta"] = c.compress_rope_theta;
  j["rope_scaling"] = {{"type", "yarn"},
                       {"factor", c.yarn_factor},
                       {"original_max_position_embeddings", c.yarn_original},
                       {"beta_fast", c.yarn_beta_fast},
                       {"beta_slow", c.yarn_beta_slow}};
  j["max_position_embeddings"] = c.max_positions;
  j["bos_token_id"] = c.bos;
  j["eos_token_id"] = c.eos;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = false;
  j["torch_dtype"] = "bfloat16";
  return j;
}

}  // namespace dsv4
