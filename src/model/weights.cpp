#include "model/weights.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/formats.h"

namespace dsv4 {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  TensorInfo t;
  t.shape = s;
  return t.shape_str();
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Binder {
 public:
  Binder(const TensorStore& store, Layout layout) : store_(store), layout_(layout) {}

  const TensorInfo* find(const std::string& native) const {
    if (const TensorInfo* t = store_.find(layout_tensor_name(layout_, native))) return t;
    return store_.find(native);  // some exports keep native names for a few tensors
  }
  const TensorInfo& need(const std::string& native) const {
    const TensorInfo* t = find(native);
    if (!t) throw Error("missing tensor " + layout_tensor_name(layout_, native) + " in " + store_.dir());
    return *t;
  }
  bool has(const std::string& native) const { return find(native) != nullptr; }

  void check_shape(const TensorInfo& t, const std::vector<int64_t>& shape, const char* what) const {
    bool scalar_ok = shape.size() == 1 && shape[0] == 1 && t.shape.empty();
    if (t.shape != shape && !scalar_ok)
      throw Error(t.name + " (" + t.file + "): expected shape " + shape_str(shape) + " " + what + ", got " +
                  t.shape_str() + " (config inconsistent with tensors?)");
  }

  // Small tensors are converted to float at load.
  std::vector<float> floats(const std::string& native, const std::vector<int64_t>& shape) const {
    const TensorInfo& t = need(native);
    check_shape(t, shape, "");
    std::vector<float> out(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < out.size(); ++i) {
      switch (t.dtype) {
        case DType::F32: {
          float v;
          std::memcpy(&v, t.data + 4 * i, 4);
          out[i] = v;
          break;
        }
        case DType::BF16: out[i] = bf16_to_f32(load16(t.data + 2 * i)); break;
        case DType::F16: out[i] = f16_to_f32(load16(t.data + 2 * i)); break;
        default: throw Error(t.name + " (" + t.file + "): dtype " + dtype_name(t.dtype) + " not supported here (want F32/BF16/F16)");
      }
    }
    return out;
  }

  std::vector<int32_t> ids(const std::string& native, const std::vector<int64_t>& shape, int64_t limit) const {
    const TensorInfo& t = need(native);
    check_shape(t, shape, "");
    std::vector<int32_t> out(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t v;
      if (t.dtype == DType::I64) {
        std::memcpy(&v, t.data + 8 * i, 8);
      } else if (t.dtype == DType::I32) {
        int32_t w;
        std::memcpy(&w, t.data + 4 * i, 4);
        v = w;
      } else {
        throw Error(t.name + " (" + t.file + "): dtype " + dtype_name(t.dtype) + " not supported (want I64/I32)");
      }
      if (v < 0 || v >= limit)
        throw Error(t.name + " (" + t.file + "): value " + std::to_string(v) + " at index " + std::to_string(i) +
                    " outside [0, " + std::to_string(limit) + ")");
      out[i] = static_cast<int32_t>(v);
    }
    return out;
  }

  // A linear weight [rows, cols]: the decoder is chosen per tensor from its dtype and the
  // companion tensors present (.scale, .weight_scale/.weight_scale_2).
  QWeight linear(const std::string& base, int64_t rows, int64_t cols) const {
    const TensorInfo& w = need(base + ".weight");
    QWeight q;
    q.rows = rows;
    q.cols = cols;
    q.name = w.name;
    q.data = w.data;
    switch (w.dtype) {
      case DType::F32: q.fmt = WFormat::F32; break;
      case DType::BF16: q.fmt = WFormat::BF16; break;
      case DType::F16: q.fmt = WFormat::F16; break;
      case DType::F8_E4M3: {
        q.fmt = WFormat::FP8Block;
        const TensorInfo& s = need(base + ".scale");
        if (s.dtype != DType::F8_E8M0)
          throw Error(s.name + " (" + s.file + "): FP8 block scale dtype " + dtype_name(s.dtype) + " not supported (want F8_E8M0)");
        check_shape(s, {cdiv(rows, 128), cdiv(cols, 128)}, "(FP8 128x128 block scales)");
        q.scale = s.data;
        q.scale_cols = cdiv(cols, 128);
        break;
      }
      case DType::I8:
      case DType::U8: {
        if (cols % 32 != 0) throw Error(w.name + ": FP4 weight needs in-features divisible by 32, got " + std::to_string(cols));
        check_shape(w, {rows, cols / 2}, "(two FP4 codes per byte)");
        if (has(base + ".weight_scale")) {
          q.fmt = WFormat::NVFP4;
          const TensorInfo& s = need(base + ".weight_scale");
          if (s.dtype != DType::F8_E4M3) throw Error(s.name + " (" + s.file + "): NVFP4 scale dtype " + dtype_name(s.dtype) + ", want F8_E4M3");
          check_shape(s, {rows, cols / 16}, "(NVFP4 scales, one per 16)");
          q.scale = s.data;
          q.scale_cols = cols / 16;
          std::vector<float> s2 = floats(base + ".weight_scale_2", {1});
          q.scale2 = s2[0];
          if (!std::isfinite(q.scale2) || q.scale2 <= 0)
            throw Error(need(base + ".weight_scale_2").name + ": weight_scale_2 must be positive and finite, got " + std::to_string(q.scale2));
        } else {
          q.fmt = WFormat::MXFP4;
          const TensorInfo& s = need(base + ".scale");
          if (s.dtype != DType::F8_E8M0) throw Error(s.name + " (" + s.file + "): MXFP4 scale dtype " + dtype_name(s.dtype) + ", want F8_E8M0");
          check_shape(s, {rows, cols / 32}, "(MXFP4 scales, one per 32)");
          q.scale = s.data;
          q.scale_cols = cols / 32;
        }
        return q;
      }
      default:
        throw Error(w.name + " (" + w.file + "): dtype " + dtype_name(w.dtype) + " is not a supported weight encoding");
    }
    check_shape(w, {rows, cols}, "");
    return q;
  }

 private:
  static uint16_t load16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  const TensorStore& store_;
  Layout layout_;
};

HcMixW bind_mix(const Binder& b, const std::string& pfx, const std::string& stem, int64_t rows, int64_t width, int64_t nscale) {
  HcMixW m;
  m.fn = b.floats(pfx + stem + "_fn", {rows, width});
  m.base = b.floats(pfx + stem + "_base", {rows});
  m.scale = b.floats(pfx + stem + "_scale", {nscale});
  return m;
}

CompressorW bind_compressor(const Binder& b, const std::string& pfx, const ModelConfig& c, int64_t ratio, int64_t out_dim) {
  CompressorW w;
  w.ratio = ratio;
  w.coff = ratio == 4 ? 2 : 1;
  w.out_dim = out_dim;
  w.wkv = b.linear(pfx + "wkv", w.coff * out_dim, c.dim);
  w.wgate = b.linear(pfx + "wgate", w.coff * out_dim, c.dim);
  w.ape = b.floats(pfx + "ape", {ratio, w.coff * out_dim});
  w.norm = b.floats(pfx + "norm.weight", {out_dim});
  return w;
}

ExpertW bind_expert(const Binder& b, const std::string& pfx, const ModelConfig& c) {
  ExpertW e;
  e.w1 = b.linear(pfx + "w1", c.moe_inter, c.dim);
  e.w3 = b.linear(pfx + "w3", c.moe_inter, c.dim);
  e.w2 = b.linear(pfx + "w2", c.dim, c.moe_inter);
  return e;
}

LayerW bind_layer(const Binder& b, const std::string& pfx, const ModelConfig& c, int64_t ratio, bool hash) {
  LayerW L;
  L.ratio = ratio;
  L.hash = hash;
  const int64_t D = c.dim, M = c.hc_mix(), hcD = c.hc * c.dim;
  L.attn_norm = b.floats(pfx + "attn_norm.weight", {D});
  L.ffn_norm = b.floats(pfx + "ffn_norm.weight", {D});
  L.hc_attn = bind_mix(b, pfx, "hc_attn", M, hcD, 3);
  L.hc_ffn = bind_mix(b, pfx, "hc_ffn", M, hcD, 3);

  AttentionW& a = L.attn;
  const std::string ap = pfx + "attn.";
  a.wq_a = b.linear(ap + "wq_a", c.q_lora, D);
  a.q_norm = b.floats(ap + "q_norm.weight", {c.q_lora});
  a.wq_b = b.linear(ap + "wq_b", c.n_heads * c.head_dim, c.q_lora);
  a.wkv = b.linear(ap + "wkv", c.head_dim, D);
  a.kv_norm = b.floats(ap + "kv_norm.weight", {c.head_dim});
  a.wo_a = b.linear(ap + "wo_a", c.o_groups * c.o_lora, c.n_heads * c.head_dim / c.o_groups);
  a.wo_b = b.linear(ap + "wo_b", D, c.o_groups * c.o_lora);
  a.sink = b.floats(ap + "attn_sink", {c.n_heads});
  if (ratio > 0) a.comp = bind_compressor(b, ap + "compressor.", c, ratio, c.head_dim);
  if (ratio == 4) {
    IndexerW ix;
    ix.wq_b = b.linear(ap + "indexer.wq_b", c.index_heads * c.index_dim, c.q_lora);
    ix.weights_proj = b.linear(ap + "indexer.weights_proj", c.index_heads, D);
    ix.comp = bind_compressor(b, ap + "indexer.compressor.", c, ratio, c.index_dim);
    a.indexer = std::move(ix);
  }

  MoEW& f = L.ffn;
  const std::string fp = pfx + "ffn.";
  f.gate = b.linear(fp + "gate", c.n_experts, D);
  if (hash)
    f.tid2eid = b.ids(fp + "gate.tid2eid", {c.vocab, c.n_active}, c.n_experts);
  else
    f.bias = b.floats(fp + "gate.bias", {c.n_experts});
  for (int64_t e = 0; e < c.n_experts; ++e) f.experts.push_back(bind_expert(b, fp + "experts." + std::to_string(e) + ".", c));
  f.shared = bind_expert(b, fp + "shared_experts.", c);
  return L;
}

}  // namespace

std::string ModelWeights::format_summary() const {
  auto join = [](const std::set<std::string>& k) {
    std::string s;
    for (const auto& x : k) s += (s.empty() ? "" : "+") + x;
    return s;
  };
  std::set<std::string> linears, experts;
  for (const LayerW& L : layers) {
    linears.insert(wformat_name(L.attn.wq_a.fmt));
    linears.insert(wformat_name(L.ffn.shared.w1.fmt));
    for (const ExpertW& e : L.ffn.experts) experts.insert(wformat_name(e.w1.fmt));
  }
  std::string s = std::string(layout_name(layout)) + " names; linears " + join(linears) + "; routed experts " + join(experts);
  if (mtp) {
    std::set<std::string> m;
    for (const ExpertW& e : mtp->block.ffn.experts) m.insert(wformat_name(e.w1.fmt));
    s += "; MTP experts " + join(m);
  }
  return s;
}

ModelWeights load_model(const std::string& dir, LoadMode mode) {
  ModelWeights m;
  m.dir = dir;
  const std::string cfg_path = (std::filesystem::path(dir) / "config.json").string();
  if (!std::filesystem::exists(cfg_path)) throw Error(dir + ": no config.json (is this a model directory?)");
  m.cfg = load_config(cfg_path);
  m.store = TensorStore::open_dir(dir, mode);
  m.layout = m.store.has("model.embed_tokens.weight") ? Layout::HF : Layout::Native;
  const ModelConfig& c = m.cfg;
  Binder b(m.store, m.layout);

  m.embed = b.linear("embed", c.vocab, c.dim);
  m.head = b.linear("head", c.vocab, c.dim);
  m.norm = b.floats("norm.weight", {c.dim});
  m.hc_head = bind_mix(b, "", "hc_head", c.hc, c.hc * c.dim, 1);
  for (int64_t l = 0; l < c.n_layers; ++l)
    m.layers.push_back(bind_layer(b, "layers." + std::to_string(l) + ".", c, c.ratio(l), l < c.n_hash));
  if (c.n_mtp > 0) {
    MtpW t;
    t.block = bind_layer(b, "mtp.0.", c, c.ratio(c.n_layers), false);
    t.e_proj = b.linear("mtp.0.e_proj", c.dim, c.dim);
    t.h_proj = b.linear("mtp.0.h_proj", c.dim, c.dim);
    t.enorm = b.floats("mtp.0.enorm.weight", {c.dim});
    t.hnorm = b.floats("mtp.0.hnorm.weight", {c.dim});
    t.norm = b.floats("mtp.0.norm.weight", {c.dim});
    t.hc_head = bind_mix(b, "mtp.0.", "hc_head", c.hc, c.hc * c.dim, 1);
    m.mtp = std::move(t);
  }
  return m;
}

}  // namespace dsv4
