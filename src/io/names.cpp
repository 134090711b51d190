#include "io/names.h"

#include <array>
#include <string_view>
#include <utility>

namespace dsv4 {

const char* layout_name(Layout l) { return l == Layout::Native ? "native" : "hf"; }

namespace {

// Suffix rewrites inside one layer (native -> HF), longest match first where prefixes overlap.
// Indexer entries come before the compressor entries they extend.
constexpr std::array<std::pair<std::string_view, std::string_view>, 34> kLayerMap{{
    {"attn.indexer.compressor.wkv.", "self_attn.compressor.indexer.kv_proj."},
    {"attn.indexer.compressor.wgate.", "self_attn.compressor.indexer.gate_proj."},
    {"attn.indexer.compressor.norm.", "self_attn.compressor.indexer.kv_norm."},
    {"attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"},
    {"attn.indexer.wq_b.", "self_attn.compressor.indexer.q_b_proj."},
    {"attn.indexer.weights_proj.", "self_attn.compressor.indexer.weights_proj."},
    {"attn.compressor.wkv.", "self_attn.compressor.kv_proj."},
    {"attn.compressor.wgate.", "self_attn.compressor.gate_proj."},
    {"attn.compressor.norm.", "self_attn.compressor.kv_norm."},
    {"attn.compressor.ape", "self_attn.compressor.position_bias"},
    {"attn.wq_a.", "self_attn.q_a_proj."},
    {"attn.q_norm.", "self_attn.q_a_norm."},
    {"attn.wq_b.", "self_attn.q_b_proj."},
    {"attn.wkv.", "self_attn.kv_proj."},
    {"attn.kv_norm.", "self_attn.kv_norm."},
    {"attn.wo_a.", "self_attn.o_a_proj."},
    {"attn.wo_b.", "self_attn.o_b_proj."},
    {"attn.attn_sink", "self_attn.sinks"},
    {"attn_norm.", "input_layernorm."},
    {"ffn_norm.", "post_attention_layernorm."},
    {"hc_attn_fn", "attn_hc.fn"},
    {"hc_attn_base", "attn_hc.base"},
    {"hc_attn_scale", "attn_hc.scale"},
    {"hc_ffn_fn", "ffn_hc.fn"},
    {"hc_ffn_base", "ffn_hc.base"},
    {"hc_ffn_scale", "ffn_hc.scale"},
    {"ffn.gate.bias", "mlp.gate.e_score_correction_bias"},
    {"ffn.gate.", "mlp.gate."},
    {"ffn.shared_experts.", "mlp.shared_experts."},
    {"ffn.experts.", "mlp.experts."},
    {"hc_head_fn", "hc_head.hc_fn"},
    {"hc_head_base", "hc_head.hc_base"},
    {"hc_head_scale", "hc_head.hc_scale"},
    {"", ""},
}};

// Expert projections: w1 = gate, w3 = up, w2 = down.
std::string expert_proj(std::string_view rest) {
  if (rest.starts_with("w1.")) return "gate_proj." + std::string(rest.substr(3));
  if (rest.starts_with("w3.")) return "up_proj." + std::string(rest.substr(3));
  if (rest.starts_with("w2.")) return "down_proj." + std::string(rest.substr(3));
  return std::string(rest);
}

std::string map_layer_suffix(std::string_view s) {
  for (const auto& [from, to] : kLayerMap) {
    if (from.empty() || !s.starts_with(from)) continue;
    std::string_view rest = s.substr(from.size());
    if (from == "ffn.shared_experts.") return std::string(to) + expert_proj(rest);
    if (from == "ffn.experts.") {
      // "E.w1.weight" -> "E.gate_proj.weight"
      size_t dot = rest.find('.');
      if (dot == std::string_view::npos) return std::string(to) + std::string(rest);
      return std::string(to) + std::string(rest.substr(0, dot + 1)) + expert_proj(rest.substr(dot + 1));
    }
    return std::string(to) + std::string(rest);
  }
  return std::string(s);
}

std::string fix_scale_suffix(std::string name) {
  // FP8 block scales: native "X.scale" is HF "X.weight_scale_inv".
  constexpr std::string_view kScale = ".scale";
  if (name.ends_with(kScale) && !name.ends_with("hc.scale") && !name.ends_with("hc_scale"))
    name = name.substr(0, name.size() - kScale.size()) + ".weight_scale_inv";
  return name;
}

}  // namespace

std::string layout_tensor_name(Layout layout, const std::string& native) {
  if (layout == Layout::Native) return native;
  std::string_view n = native;
  if (n == "embed.weight") return "model.embed_tokens.weight";
  if (n == "head.weight") return "lm_head.weight";
  if (n == "norm.weight") return "model.norm.weight";
  if (n == "hc_head_fn") return "model.hc_head.hc_fn";
  if (n == "hc_head_base") return "model.hc_head.hc_base";
  if (n == "hc_head_scale") return "model.hc_head.hc_scale";
  std::string prefix;
  if (n.starts_with("layers.")) {
    size_t dot = n.find('.', 7);
    prefix = "model." + std::string(n.substr(0, dot + 1));
    n = n.substr(dot + 1);
  } else if (n.starts_with("mtp.")) {
    size_t dot = n.find('.', 4);
    prefix = std::string(n.substr(0, dot + 1));
    n = n.substr(dot + 1);
    // MTP-only tensors keep their names (e_proj, h_proj, enorm, hnorm, norm).
  }
  std::string mapped = map_layer_suffix(n);
  // The MTP block's own head mixer is "mtp.0.hc_head.hc_fn" in HF exports.
  return fix_scale_suffix(prefix + mapped);
}

}  // namespace dsv4
