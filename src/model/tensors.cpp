#include "model/tensors.h"

#include <utility>

#include "core/error.h"
#include "model/weights.h"

namespace dsv4 {

TensorKind tensor_kind(Stored s) {
  switch (s) {
    case Stored::DenseLinear:
    case Stored::ExpertLinear:
    case Stored::Bf16Linear: return TensorKind::Linear;
    case Stored::F32:
    case Stored::Bf16: return TensorKind::Floats;
    case Stored::I64: return TensorKind::Ids;
  }
  return TensorKind::Floats;
}

const char* part_name(Part p) {
  switch (p) {
    case Part::Embedding: return "embedding";
    case Part::Attention: return "attention";
    case Part::Compressor: return "compressor";
    case Part::Indexer: return "indexer";
    case Part::Router: return "router";
    case Part::RoutedExperts: return "routed experts";
    case Part::SharedExpert: return "shared expert";
    case Part::Mixing: return "mHC mixers";
    case Part::Norms: return "norms";
    case Part::Head: return "head";
    case Part::MtpInput: return "MTP input";
  }
  return "?";
}

std::string TensorDesc::base() const {
  constexpr std::string_view kWeight = ".weight";
  return name.ends_with(kWeight) ? name.substr(0, name.size() - kWeight.size()) : name;
}

namespace {

// The list itself. W is ModelWeights (the walk shapes it) or const ModelWeights (the walk
// checks its shape). The order of the calls is the order make-tiny writes the tensors in.
template <class W>
class Walker {
  static constexpr bool kConst = std::is_const_v<W>;
  template <class T>
  using Ref = std::conditional_t<kConst, const T&, T&>;
  using Target = TensorTarget<kConst>;
  using Shape = std::vector<int64_t>;

 public:
  using Visit = std::function<void(const TensorDesc&, Target)>;
  Walker(W& w, const Visit& visit) : w_(w), c_(w.cfg), visit_(visit) {}

  void run() {
    const int64_t V = c_.vocab, D = c_.dim;
    sized(w_.layers, c_.n_layers, "layers");
    linear(w_.embed, "embed", Role::Embedding, Stored::Bf16Linear, Part::Embedding, V, D);
    for (int64_t l = 0; l < c_.n_layers; ++l) {
      layer_ = l;
      block("layers." + std::to_string(l) + ".", w_.layers[l], c_.ratio(l), l < c_.n_hash);
    }
    layer_ = -1;
    floats(w_.norm, "norm.weight", Role::Norm, Stored::Bf16, Part::Norms, {D});
    linear(w_.head, "head", Role::Linear, Stored::Bf16Linear, Part::Head, V, D);
    head_mix("", w_.hc_head);
    if (present(w_.mtp, c_.n_mtp > 0, "mtp")) {
      auto& t = *w_.mtp;
      mtp_ = true;
      const std::string p = "mtp.0.";
      block(p, t.block, c_.ratio(c_.n_layers), false);
      linear(t.e_proj, p + "e_proj", Role::Linear, Stored::DenseLinear, Part::MtpInput, D, D);
      linear(t.h_proj, p + "h_proj", Role::Linear, Stored::DenseLinear, Part::MtpInput, D, D);
      floats(t.enorm, p + "enorm.weight", Role::Norm, Stored::Bf16, Part::MtpInput, {D});
      floats(t.hnorm, p + "hnorm.weight", Role::Norm, Stored::Bf16, Part::MtpInput, {D});
      floats(t.norm, p + "norm.weight", Role::Norm, Stored::Bf16, Part::Norms, {D});
      head_mix(p, t.hc_head);
      mtp_ = false;
    }
  }

 private:
  // ---- one block (a main layer or the MTP block's layer)
  void block(const std::string& p, Ref<LayerW> L, int64_t ratio, bool hash) {
    const int64_t D = c_.dim, M = c_.hc_mix();
    set(L.ratio, ratio, p + " ratio");
    set(L.hash, hash, p + " hash routing");
    floats(L.attn_norm, p + "attn_norm.weight", Role::Norm, Stored::Bf16, Part::Norms, {D});
    floats(L.ffn_norm, p + "ffn_norm.weight", Role::Norm, Stored::Bf16, Part::Norms, {D});
    mix(p + "hc_attn_", L.hc_attn, M, Role::MixBase, 3);
    mix(p + "hc_ffn_", L.hc_ffn, M, Role::MixBase, 3);
    attention(p + "attn.", L.attn, ratio);
    ffn(p + "ffn.", L.ffn, hash);
  }

  void mix(const std::string& p, Ref<HcMixW> m, int64_t rows, Role base_role, int64_t nscale) {
    const int64_t width = c_.hc * c_.dim;
    floats(m.fn, p + "fn", Role::MixFn, Stored::F32, Part::Mixing, {rows, width});
    floats(m.base, p + "base", base_role, Stored::F32, Part::Mixing, {rows});
    floats(m.scale, p + "scale", Role::MixScale, Stored::F32, Part::Mixing, {nscale});
  }
  void head_mix(const std::string& p, Ref<HcMixW> m) { mix(p + "hc_head_", m, c_.hc, Role::HeadBase, 1); }

  void attention(const std::string& p, Ref<AttentionW> a, int64_t ratio) {
    const int64_t D = c_.dim, H = c_.n_heads, d = c_.head_dim, G = c_.o_groups, Qr = c_.q_lora;
    const Stored dense = Stored::DenseLinear;
    floats(a.sink, p + "attn_sink", Role::Sink, Stored::F32, Part::Attention, {H});
    linear(a.wq_a, p + "wq_a", Role::Linear, dense, Part::Attention, Qr, D);
    floats(a.q_norm, p + "q_norm.weight", Role::Norm, Stored::Bf16, Part::Attention, {Qr});
    linear(a.wq_b, p + "wq_b", Role::Linear, dense, Part::Attention, H * d, Qr);
    linear(a.wkv, p + "wkv", Role::Linear, dense, Part::Attention, d, D);
    floats(a.kv_norm, p + "kv_norm.weight", Role::Norm, Stored::Bf16, Part::Attention, {d});
    linear(a.wo_a, p + "wo_a", Role::Linear, dense, Part::Attention, G * c_.o_lora, H * d / G);
    linear(a.wo_b, p + "wo_b", Role::Linear, dense, Part::Attention, D, G * c_.o_lora);
    const LayerKind kind = ModelConfig::kind_of_ratio(ratio);
    if (present(a.comp, kind != LayerKind::Window, p + "compressor"))
      compressor(p + "compressor.", *a.comp, ratio, d, Part::Compressor);
    if (present(a.indexer, kind == LayerKind::CSA, p + "indexer")) {
      auto& ix = *a.indexer;
      const std::string q = p + "indexer.";
      linear(ix.wq_b, q + "wq_b", Role::Linear, dense, Part::Indexer, c_.index_heads * c_.index_dim, Qr);
      linear(ix.weights_proj, q + "weights_proj", Role::Linear, Stored::Bf16Linear, Part::Indexer, c_.index_heads, D);
      compressor(q + "compressor.", ix.comp, ratio, c_.index_dim, Part::Indexer);
    }
  }

  // coff = 2 for CSA's overlapping compressor.
  void compressor(const std::string& p, Ref<CompressorW> w, int64_t ratio, int64_t out_dim, Part part) {
    const int64_t coff = ModelConfig::kind_of_ratio(ratio) == LayerKind::CSA ? 2 : 1, width = coff * out_dim;
    set(w.ratio, ratio, p + " ratio");
    set(w.coff, coff, p + " coff");
    set(w.out_dim, out_dim, p + " out_dim");
    floats(w.ape, p + "ape", Role::Ape, Stored::F32, part, {ratio, width});
    linear(w.wkv, p + "wkv", Role::Linear, Stored::Bf16Linear, part, width, c_.dim);
    linear(w.wgate, p + "wgate", Role::Linear, Stored::Bf16Linear, part, width, c_.dim);
    floats(w.norm, p + "norm.weight", Role::Norm, Stored::Bf16, part, {out_dim});
  }

  void ffn(const std::string& p, Ref<MoEW> f, bool hash) {
    const int64_t D = c_.dim, I = c_.moe_inter, E = c_.n_experts;
    linear(f.gate, p + "gate", Role::Linear, Stored::Bf16Linear, Part::Router, E, D);
    if (hash) {
      desc_ = make(p + "gate.tid2eid", Role::HashTable, Stored::I64, Part::Router, {c_.vocab, c_.n_active});
      desc_.limit = E;
      Target t;
      t.ids = &f.tid2eid;
      visit_(desc_, t);
    } else {
      floats(f.bias, p + "gate.bias", Role::RouterBias, Stored::F32, Part::Router, {E});
    }
    sized(f.experts, E, p + "experts");
    for (int64_t e = 0; e < E; ++e) {
      expert_ = e;
      const std::string x = p + "experts." + std::to_string(e) + ".";
      Ref<ExpertW> ex = f.experts[e];
      const Stored st = Stored::ExpertLinear;
      linear(ex.w1, x + "w1", Role::ExpertUp, st, Part::RoutedExperts, I, D);
      linear(ex.w2, x + "w2", Role::ExpertDown, st, Part::RoutedExperts, D, I);
      linear(ex.w3, x + "w3", Role::ExpertUp, st, Part::RoutedExperts, I, D);
    }
    expert_ = -1;
    const int64_t Is = I * c_.n_shared;
    const std::string s = p + "shared_experts.";
    linear(f.shared.w1, s + "w1", Role::Linear, Stored::DenseLinear, Part::SharedExpert, Is, D);
    linear(f.shared.w2, s + "w2", Role::Linear, Stored::DenseLinear, Part::SharedExpert, D, Is);
    linear(f.shared.w3, s + "w3", Role::Linear, Stored::DenseLinear, Part::SharedExpert, Is, D);
  }

  // ---- emitting
  TensorDesc make(std::string name, Role role, Stored st, Part part, Shape shape) const {
    TensorDesc t;
    t.name = std::move(name);
    t.role = role;
    t.stored = st;
    t.part = part;
    t.shape = std::move(shape);
    t.layer = layer_;
    t.mtp = mtp_;
    t.expert = expert_;
    return t;
  }
  void linear(Ref<QWeight> q, const std::string& base, Role role, Stored st, Part part, int64_t out, int64_t in) {
    desc_ = make(base + ".weight", role, st, part, {out, in});
    Target t;
    t.linear = &q;
    visit_(desc_, t);
  }
  void floats(Ref<std::vector<float>> v, const std::string& name, Role role, Stored st, Part part, Shape shape) {
    desc_ = make(name, role, st, part, std::move(shape));
    Target t;
    t.floats = &v;
    visit_(desc_, t);
  }

  // ---- the structure: built by the mutable walk, checked by the const one
  template <class T>
  void set(Ref<T> field, const T& value, const std::string& what) {
    if constexpr (kConst) {
      if (field != value) throw Error("model weights: " + what + " disagrees with the config");
    } else {
      field = value;
    }
  }
  template <class Opt>
  bool present(Opt& o, bool want, const std::string& what) {
    if constexpr (kConst) {
      if (o.has_value() != want)
        throw Error("model weights: " + what + (want ? " missing" : " present") + " against the config");
    } else {
      if (want && !o) o.emplace();
      if (!want) o.reset();
    }
    return want;
  }
  template <class Vec>
  void sized(Vec& v, int64_t n, const std::string& what) {
    if constexpr (kConst) {
      if (static_cast<int64_t>(v.size()) != n)
        throw Error("model weights: " + what + " has " + std::to_string(v.size()) + " entries, config says " + std::to_string(n));
    } else {
      v.clear();
      v.resize(static_cast<size_t>(n));
    }
  }

  W& w_;
  const ModelConfig& c_;
  const Visit& visit_;
  TensorDesc desc_;
  int64_t layer_ = -1, expert_ = -1;
  bool mtp_ = false;
};

}  // namespace

void for_each_tensor(ModelWeights& w, const TensorVisitor& visit) { Walker<ModelWeights>(w, visit).run(); }

void for_each_tensor(const ModelWeights& w, const ConstTensorVisitor& visit) { Walker<const ModelWeights>(w, visit).run(); }

void for_each_tensor(const ModelConfig& c, const std::function<void(const TensorDesc&)>& visit) {
  ModelWeights skeleton;  // the structure only: no tensor is bound
  skeleton.cfg = c;
  for_each_tensor(skeleton, [&](const TensorDesc& t, TensorTarget<false>) { visit(t); });
}

// ---- memory accounting

WeightBytes weight_bytes(const ModelWeights& w) {
  WeightBytes b;
  for_each_tensor(w, [&](const TensorDesc& t, TensorTarget<true> x) {
    WeightBytes::Row& r = (t.mtp ? b.mtp : b.main)[static_cast<int>(t.part)];
    r.tensors += 1;
    if (x.linear) r.bytes += x.linear->stored_bytes();
    if (x.floats) r.bytes += x.floats->size() * sizeof(float);
    if (x.ids) r.bytes += x.ids->size() * sizeof(int32_t);
  });
  return b;
}

size_t WeightBytes::main_bytes() const {
  size_t s = 0;
  for (const Row& r : main) s += r.bytes;
  return s;
}

size_t WeightBytes::mtp_bytes() const {
  size_t s = 0;
  for (const Row& r : mtp) s += r.bytes;
  return s;
}

}  // namespace dsv4
