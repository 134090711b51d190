#include "model/weights.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/formats.h"
#include "model/tensors.h"

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
          // Read into memory (scales are held whole, also under tensor parallelism), the scales
          // cost a scan here; mapped, the scan would read them from disk.
          if (store_.load_mode() == LoadMode::Read) measure_scale_range(q);
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

}  // namespace

std::string ModelWeights::format_summary() const {
  auto join = [](const std::set<std::string>& k) {
    std::string s;
    for (const auto& x : k) s += (s.empty() ? "" : "+") + x;
    return s;
  };
  // Formats of the dense linears and the routed experts the checkpoint uses (a release may
  // encode the MTP block's experts differently).
  std::set<std::string> linears, experts, mtp_experts;
  for_each_tensor(*this, [&](const TensorDesc& t, TensorTarget<true> x) {
    if (x.linear && x.linear->rows == 0) return;  // a routed expert another rank holds
    if (t.stored == Stored::DenseLinear && !t.mtp) linears.insert(wformat_name(x.linear->fmt));
    if (t.stored == Stored::ExpertLinear) (t.mtp ? mtp_experts : experts).insert(wformat_name(x.linear->fmt));
  });
  std::string s = std::string(layout_name(layout)) + " names; linears " + join(linears) + "; routed experts " + join(experts);
  if (mtp) s += "; MTP experts " + join(mtp_experts);
  return s;
}

// The routed expert a checkpoint tensor belongs to ("...experts.<id>.<...>" in every layout;
// the shared expert is "shared_experts."), or -1.
static int64_t routed_expert_of(const std::string& name) {
  const size_t at = name.find(".experts.");
  if (at == std::string::npos) return -1;
  int64_t e = 0;
  size_t i = at + 9;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) e = e * 10 + (name[i] - '0');
  return i < name.size() && name[i] == '.' ? e : -1;
}

ModelWeights load_model(const std::string& dir, LoadMode mode) { return load_model(dir, mode, Share{}); }

ModelConfig load_model_config(const std::string& dir) {
  const std::string cfg_path = (std::filesystem::path(dir) / "config.json").string();
  if (!std::filesystem::exists(cfg_path)) throw Error(dir + ": no config.json (is this a model directory?)");
  return load_config(cfg_path);
}

ModelWeights load_model(const std::string& dir, LoadMode mode, const Share& share) {
  ModelWeights m;
  m.dir = dir;
  m.cfg = load_model_config(dir);
  const ModelConfig& c = m.cfg;
  const ExpertSplit experts = share.ep ? ExpertSplit{share.rank, share.world, c.n_experts} : ExpertSplit{0, 1, c.n_experts};
  m.store = TensorStore::open_dir(dir, share.active() ? LoadMode::Mmap : mode);
  m.layout = m.store.has("model.embed_tokens.weight") ? Layout::HF : Layout::Native;
  if (share.active()) {
    // This rank's rows of the matrices TP splits along their output rows, by checkpoint name.
    std::map<std::string, std::pair<int64_t, int64_t>> rows;
    if (share.tp) {
      const int64_t G = c.o_groups, g0 = share.part(G, share.rank), g1 = share.part(G, share.rank + 1);
      const int64_t hg = c.n_heads / G * c.head_dim;  // wq_b rows per group
      for_each_tensor(c, [&](const TensorDesc& t) {
        const std::string& n = t.name;
        auto ends = [&](const std::string& suffix) { return n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0; };
        if (ends(".attn.wq_b.weight")) rows[t.name_in(m.layout)] = {g0 * hg, g1 * hg};
        if (ends(".attn.wo_a.weight")) rows[t.name_in(m.layout)] = {g0 * c.o_lora, g1 * c.o_lora};
        if (ends(".attn.wo_b.weight")) rows[t.name_in(m.layout)] = {share.part(c.dim, share.rank), share.part(c.dim, share.rank + 1)};
        if (n == "head.weight") rows[t.name_in(m.layout)] = {share.part(c.vocab, share.rank), share.part(c.vocab, share.rank + 1)};
      });
    }
    m.store.hold(mode, [&](const TensorInfo& t) -> std::pair<size_t, size_t> {
      const int64_t e = routed_expert_of(t.name);
      if (e >= 0 && !experts.owns(e)) return {0, 0};
      auto it = rows.find(t.name);
      if (it == rows.end() || t.shape.empty() || t.shape[0] <= 0) return {0, t.nbytes};
      // Every stored form keeps a row's bytes together, rows in order (FP4: [rows, cols / 2]).
      const size_t row = t.nbytes / static_cast<size_t>(t.shape[0]);
      return {static_cast<size_t>(it->second.first) * row, static_cast<size_t>(it->second.second) * row};
    });
  }
  Binder b(m.store, m.layout);
  // The list gives each tensor's name, shape and kind; the binder finds it in the checkpoint,
  // checks it and converts the small ones.
  for_each_tensor(m, [&](const TensorDesc& t, TensorTarget<false> x) {
    if (t.expert >= 0 && !experts.owns(t.expert)) return;
    switch (t.kind()) {
      case TensorKind::Linear: *x.linear = b.linear(t.base(), t.shape[0], t.shape[1]); break;
      case TensorKind::Floats: *x.floats = b.floats(t.name, t.shape); break;
      case TensorKind::Ids: *x.ids = b.ids(t.name, t.shape, t.limit); break;
    }
  });
  return m;
}

}  // namespace dsv4
