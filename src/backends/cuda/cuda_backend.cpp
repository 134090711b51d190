// The CUDA backend: model/backend.h's steps on the kernels of src/cuda (cuda/cuda_ops.h), in the
// order and with the arithmetic choices of the CPU backend (model/cpu_backend.cpp), which is
// the reference each kernel is tested against. Plain C++ (g++), linked into dsv4cuda.
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/rope.h"
#include "model/tensors.h"

namespace dsv4 {

namespace {

using gpu::DeviceBuffer;
using gpu::DeviceWeight;

// Device allocations of n elements (at least one, so every pointer handed to a kernel is real).
DeviceBuffer floats(int64_t n) { return DeviceBuffer(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float)); }
DeviceBuffer ints(int64_t n) { return DeviceBuffer(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(int32_t)); }
DeviceBuffer bytes(int64_t n) { return DeviceBuffer(static_cast<size_t>(std::max<int64_t>(n, 1))); }

template <class T>
DeviceBuffer upload(const std::vector<T>& v, const char* what) {
  if (v.empty()) throw Error(std::string("cuda backend: weight vector ") + what + " is empty");
  return gpu::to_device(v);
}

// The main model's tensors on the device: one walk over the tensor list (model/tensors.h)
// uploads each in its stored form (gpu::upload_weight; small tensors as the float / int32
// vectors the binding made), then the constructor hands them to the backend's own structs with
// take(host tensor) and checks that none was left over. The mtp.0 block stays on the host until
// the GPU runs it.
class DeviceTensors {
 public:
  explicit DeviceTensors(const ModelWeights& w) {
    for_each_tensor(w, [&](const TensorDesc& t, TensorTarget<true> x) {
      if (t.mtp) return;
      if (x.linear) weights_.emplace(x.linear, gpu::upload_weight(*x.linear));
      if (x.floats) buffers_.emplace(x.floats, upload(*x.floats, t.name.c_str()));
      if (x.ids) buffers_.emplace(x.ids, upload(*x.ids, t.name.c_str()));
      names_.emplace(x.address(), t.name);
    });
  }

  DeviceWeight take(const QWeight& w) { return pop(weights_, &w); }
  template <class T>
  DeviceBuffer take(const std::vector<T>& v) {
    return pop(buffers_, &v);
  }
  gpu::DeviceHcMix take(const HcMixW& m, int64_t rows, int64_t width) {
    gpu::DeviceHcMix d;
    d.rows = rows;
    d.width = width;
    d.fn = take(m.fn);
    d.base = take(m.base);
    d.scale = take(m.scale);
    return d;
  }

  // Every uploaded tensor went into the backend's structs.
  void check_all_taken() const {
    for (const auto& [p, _] : weights_) throw Error("cuda backend: " + names_.at(p) + " was uploaded but not used");
    for (const auto& [p, _] : buffers_) throw Error("cuda backend: " + names_.at(p) + " was uploaded but not used");
  }

 private:
  template <class Map>
  typename Map::mapped_type pop(Map& m, const void* host) {
    auto it = m.find(host);
    if (it == m.end()) {
      auto n = names_.find(host);
      throw Error("cuda backend: " + (n != names_.end() ? n->second + " taken twice" : std::string("a weight outside the tensor list")) +
                  " in the upload");
    }
    typename Map::mapped_type d = std::move(it->second);
    m.erase(it);
    return d;
  }

  std::map<const void*, DeviceWeight> weights_;
  std::map<const void*, DeviceBuffer> buffers_;
  std::map<const void*, std::string> names_;
};

struct DevCompressor {
  DeviceWeight wkv, wgate;
  DeviceBuffer ape, norm;
  int64_t width = 0;  // coff * out_dim
};

DevCompressor upload_compressor(DeviceTensors& dev, const CompressorW& w) {
  DevCompressor d;
  d.wkv = dev.take(w.wkv);
  d.wgate = dev.take(w.wgate);
  d.ape = dev.take(w.ape);
  d.norm = dev.take(w.norm);
  d.width = w.coff * w.out_dim;
  return d;
}

struct DevExpert {
  DeviceWeight w1, w2, w3;
};

DevExpert upload_expert(DeviceTensors& dev, const ExpertW& e) { return {dev.take(e.w1), dev.take(e.w2), dev.take(e.w3)}; }

// One main layer's weights on the device, in stored form (gpu::upload_weight).
struct DevLayer {
  int64_t ratio = 0;
  bool hash = false;
  DeviceBuffer attn_norm, ffn_norm, freq;  // freq: the layer's RoPE table
  gpu::DeviceHcMix hc_attn, hc_ffn;
  DeviceWeight wq_a, wq_b, wkv, wo_a, wo_b;
  DeviceBuffer q_norm, kv_norm, sink;
  std::optional<DevCompressor> comp, index_comp;
  DeviceWeight index_wq_b, index_proj;
  DeviceWeight gate;
  DeviceBuffer bias, tid2eid;
  std::vector<DevExpert> experts;
  DevExpert shared;
};

// One layer's caches: the same contents as LayerState in device buffers sized for the context,
// the entries addressed by block index and the compressor rows by position (cuda_ops.h).
struct DevLayerState {
  DeviceBuffer ring, entries, index_keys;
  DeviceBuffer comp_a, comp_s, index_comp_a, index_comp_s;
};

struct CudaSequence final : BackendSequence {
  const void* owner = nullptr;
  std::vector<DevLayerState> layers;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelWeights& w, const CudaOptions& o);

  const char* name() const override { return "cuda"; }
  SequenceState new_sequence() const override;
  // Not yet on this backend (issue 14): forks and rewinds of the device caches, the MTP block,
  // several sequences in one step (the engine runs them one by one).
  SequenceState fork(const SequenceState&) const override {
    throw Error("cuda backend: forking a sequence is not supported yet", ErrorKind::Unsupported);
  }
  void truncate(SequenceState&, int64_t, Stack) const override {
    throw Error("cuda backend: rewinding a sequence is not supported yet", ErrorKind::Unsupported);
  }
  int64_t max_rows() const override { return chunk_; }
  bool batched() const override { return false; }
  Step begin(const StepPlan& plan) override;
  void hc_pre(int64_t l, Sub sub, Step& s) override;
  void norm(int64_t l, Sub sub, Step& s) override;
  void attention(int64_t l, Step& s) override;
  void moe(int64_t l, Step& s) override;
  void hc_post(Step& s) override;
  void read_hidden(Step& s, const std::vector<int64_t>& rows, float* out) override;
  void hc_head(Stack stack, Step& s, const std::vector<int64_t>& rows) override;
  void final_norm(Stack stack, Step& s, int64_t n) override;
  void logits(Step& s, int64_t n, float* out) override;

 private:
  void run_compressor(const DevCompressor& dc, bool indexer, int64_t dout, int64_t ratio, const float* freq, const Step& s,
                      uint8_t* entries, int64_t stride, DeviceBuffer& ring_a, DeviceBuffer& ring_s);
  CudaSequence& sequence(SequenceState& st) const;

  const ModelConfig& c_;
  int64_t context_ = 0, chunk_ = 0;
  size_t kvb_ = 0, ikb_ = 0;  // bytes per cached KV vector / indexer key
  DeviceWeight embed_, head_;
  DeviceBuffer norm_;
  gpu::DeviceHcMix head_mix_;
  std::vector<DevLayer> layers_;

  // The activation workspace for chunks of up to chunk_ tokens.
  struct Workspace {
    DeviceBuffer tokens, pos;
    DeviceBuffer X, x, post, comb, f, mixes;
    DeviceBuffer qr, q, kv, chunk_kv, o, z, ca, cs, qi, wi, scores, sel, sel_n, n_vis;
    DeviceBuffer glog, ids, wts, idx, roww, xs, g, u, y;
    DeviceBuffer logits;
  } ws_;
  // Host scratch of the MoE dispatch and the positions upload, reused across steps.
  std::vector<int32_t> pos_h_, ids_h_, idx_h_, count_h_;
  std::vector<float> wts_h_, roww_h_;
};

CudaBackend::CudaBackend(const ModelWeights& w, const CudaOptions& o) : c_(w.cfg) {
  if (!gpu::device_available()) throw Error("cuda backend: " + gpu::device_summary());
  const ModelConfig& c = c_;
  context_ = o.context;
  if (context_ < 1 || context_ > 0x7FFFFFFF) throw Error("cuda backend: context " + std::to_string(o.context) + " out of range");
  chunk_ = std::clamp<int64_t>(o.max_chunk, 1, context_);
  kvb_ = gpu::kv_codec_bytes(c.head_dim, c.rope_dim);
  ikb_ = gpu::fp4_codec_bytes(c.index_dim);

  DeviceTensors dev(w);
  embed_ = dev.take(w.embed);
  head_ = dev.take(w.head);
  norm_ = dev.take(w.norm);
  head_mix_ = dev.take(w.hc_head, c.hc, c.hc * c.dim);
  const int64_t M = c.hc_mix(), width = c.hc * c.dim;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerW& L = w.layers[l];
    DevLayer d;
    d.ratio = L.ratio;
    d.hash = L.hash;
    d.attn_norm = dev.take(L.attn_norm);
    d.ffn_norm = dev.take(L.ffn_norm);
    d.freq = upload(layer_rope(c, l).freq, "rope freq");
    d.hc_attn = dev.take(L.hc_attn, M, width);
    d.hc_ffn = dev.take(L.hc_ffn, M, width);
    const AttentionW& A = L.attn;
    d.wq_a = dev.take(A.wq_a);
    d.wq_b = dev.take(A.wq_b);
    d.wkv = dev.take(A.wkv);
    d.wo_a = dev.take(A.wo_a);
    d.wo_b = dev.take(A.wo_b);
    d.q_norm = dev.take(A.q_norm);
    d.kv_norm = dev.take(A.kv_norm);
    d.sink = dev.take(A.sink);
    if (L.ratio > 0) d.comp = upload_compressor(dev, *A.comp);
    if (L.kind() == LayerKind::CSA) {
      d.index_comp = upload_compressor(dev, A.indexer->comp);
      d.index_wq_b = dev.take(A.indexer->wq_b);
      d.index_proj = dev.take(A.indexer->weights_proj);
    }
    const MoEW& F = L.ffn;
    d.gate = dev.take(F.gate);
    if (L.hash) {
      d.tid2eid = dev.take(F.tid2eid);
    } else {
      d.bias = dev.take(F.bias);
    }
    for (const ExpertW& e : F.experts) d.experts.push_back(upload_expert(dev, e));
    d.shared = upload_expert(dev, F.shared);
    layers_.push_back(std::move(d));
  }
  dev.check_all_taken();

  // Workspace for chunk_ tokens. Indexer scores: one row per query over every entry the
  // context can hold (ratio 4).
  const int64_t C = chunk_, D = c.dim, hc = c.hc, H = c.n_heads, d = c.head_dim;
  const int64_t HI = c.index_heads, dI = c.index_dim, k = c.n_active, I = c.moe_inter;
  const int64_t cwidth = 2 * std::max(d, dI);  // widest compressor input (ratio 4: coff 2)
  ws_.tokens = ints(C);
  ws_.pos = ints(C);
  ws_.X = floats(C * hc * D);
  ws_.x = floats(C * D);
  ws_.post = floats(C * hc);
  ws_.comb = floats(C * hc * hc);
  ws_.f = floats(C * D);
  ws_.mixes = floats(C * M);
  ws_.qr = floats(C * c.q_lora);
  ws_.q = floats(C * H * d);
  ws_.kv = floats(C * d);
  ws_.chunk_kv = bytes(C * static_cast<int64_t>(kvb_));
  ws_.o = floats(C * H * d);
  ws_.z = floats(C * c.o_groups * c.o_lora);
  ws_.ca = floats(C * cwidth);
  ws_.cs = floats(C * cwidth);
  ws_.qi = floats(C * HI * dI);
  ws_.wi = floats(C * HI);
  ws_.scores = floats(C * (context_ / 4 + 1));
  ws_.sel = ints(C * std::max<int64_t>(c.index_topk, 1));
  ws_.sel_n = ints(C);
  ws_.n_vis = ints(C);
  ws_.glog = floats(C * c.n_experts);
  ws_.ids = ints(C * k);
  ws_.wts = floats(C * k);
  ws_.idx = ints(C * k);
  ws_.roww = floats(C * k);
  ws_.xs = floats(C * D);
  ws_.g = floats(C * I);
  ws_.u = floats(C * I);
  ws_.y = floats(C * D);
  ws_.logits = floats(C * c.vocab);
  gpu::synchronize();
}

SequenceState CudaBackend::new_sequence() const {
  const ModelConfig& c = c_;
  auto seq = std::make_unique<CudaSequence>();
  seq->owner = this;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const int64_t ratio = layers_[l].ratio;
    DevLayerState s;
    s.ring = bytes(c.window * static_cast<int64_t>(kvb_));
    s.ring.fill_zero();
    if (ratio > 0) {
      const int64_t cap = context_ / ratio, rows = gpu::compressor_ring_rows(ratio);
      s.entries = bytes(cap * static_cast<int64_t>(kvb_));
      s.comp_a = floats(rows * layers_[l].comp->width);
      s.comp_s = floats(rows * layers_[l].comp->width);
      s.entries.fill_zero();
      s.comp_a.fill_zero();
      s.comp_s.fill_zero();
      if (ModelConfig::kind_of_ratio(ratio) == LayerKind::CSA) {
        s.index_keys = bytes(cap * static_cast<int64_t>(ikb_));
        s.index_comp_a = floats(rows * layers_[l].index_comp->width);
        s.index_comp_s = floats(rows * layers_[l].index_comp->width);
        s.index_keys.fill_zero();
        s.index_comp_a.fill_zero();
        s.index_comp_s.fill_zero();
      }
    }
    seq->layers.push_back(std::move(s));
  }
  SequenceState st;
  st.device = std::move(seq);
  return st;
}

CudaSequence& CudaBackend::sequence(SequenceState& st) const {
  auto* seq = dynamic_cast<CudaSequence*>(st.device.get());
  if (!seq || seq->owner != this) throw Error("sequence state does not belong to this model's cuda backend");
  return *seq;
}

Backend::Step CudaBackend::begin(const StepPlan& plan) {
  if (plan.stack != Stack::Main) throw Error("cuda backend: the MTP block is not supported yet", ErrorKind::Unsupported);
  DSV4_CHECK(plan.seqs.size() == 1);  // batched() is false
  SequenceState& st = *plan.seqs[0].st;
  const int32_t* tokens = plan.tokens.data();
  const int64_t T = plan.T();
  sequence(st);
  DSV4_CHECK(T <= chunk_);  // max_rows()
  if (st.pos + T > context_)
    throw Error("cuda backend: position " + std::to_string(st.pos + T - 1) + " is past its context limit of " +
                std::to_string(context_) + " tokens (set at load: --context)", ErrorKind::ResourceExhausted);
  pos_h_.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos_h_[t] = static_cast<int32_t>(st.pos + t);
  ws_.tokens.upload(tokens, static_cast<size_t>(T) * sizeof(int32_t));
  ws_.pos.upload(pos_h_.data(), static_cast<size_t>(T) * sizeof(int32_t));
  Step s;
  s.plan = &plan;
  s.T = T;
  s.X = ws_.X.as<float>();
  s.x = ws_.x.as<float>();
  s.post = ws_.post.as<float>();
  s.comb = ws_.comb.as<float>();
  s.f = ws_.f.as<float>();
  gpu::embed(embed_.view(), ws_.tokens.as<int32_t>(), T, c_.hc, s.X);
  return s;
}

void CudaBackend::hc_pre(int64_t l, Sub sub, Step& s) {
  const DevLayer& L = layers_[l];
  gpu::hc_pre(sub == Sub::Attn ? L.hc_attn : L.hc_ffn, s.X, s.T, c_.hc, c_.dim, static_cast<int>(c_.sinkhorn_iters), c_.eps,
              c_.hc_eps, ws_.mixes.as<float>(), s.x, s.post, s.comb);
}

void CudaBackend::norm(int64_t l, Sub sub, Step& s) {
  const DevLayer& L = layers_[l];
  const float* w = (sub == Sub::Attn ? L.attn_norm : L.ffn_norm).as<float>();
  gpu::rmsnorm(s.x, c_.dim, w, s.T, c_.dim, c_.eps, s.x, c_.dim);
}

void CudaBackend::hc_post(Step& s) { gpu::hc_post(s.f, s.post, s.comb, s.X, s.T, c_.hc, c_.dim); }

// compress() of model/compressor.cpp: the projections here, the pooling, norm, RoPE and
// quantisation in gpu::compress, which writes the closing blocks' entries in place.
void CudaBackend::run_compressor(const DevCompressor& dc, bool indexer, int64_t dout, int64_t ratio, const float* freq,
                                 const Step& s, uint8_t* entries, int64_t stride, DeviceBuffer& ring_a, DeviceBuffer& ring_s) {
  float* a = ws_.ca.as<float>();
  float* g = ws_.cs.as<float>();
  gpu::qmatmul(dc.wkv, s.x, s.T, a);
  gpu::qmatmul(dc.wgate, s.x, s.T, g);
  gpu::Compressor k;
  k.a = a;
  k.s = g;
  k.T = s.T;
  k.pos = ws_.pos.as<int32_t>();
  k.ratio = ratio;
  k.dout = dout;
  k.rope = c_.rope_dim;
  k.ape = dc.ape.as<float>();
  k.norm = dc.norm.as<float>();
  k.eps = c_.eps;
  k.indexer = indexer;
  k.ring_a = ring_a.as<float>();
  k.ring_s = ring_s.as<float>();
  k.entries = entries;
  k.entry_stride = stride;
  k.capacity = context_ / ratio;
  k.freq = freq;
  gpu::compress(k);
}


// CpuBackend::run_attention step for step; where the CPU decodes cached vectors and gathers
// keys per query, gpu::sparse_attention reads the compact caches directly, in the same key
// order (window, then the entries: CSA in each query's indexer top-k order).
void CudaBackend::attention(int64_t l, Step& s) {
  const ModelConfig& c = c_;
  const DevLayer& L = layers_[l];
  DevLayerState& S = sequence(*s.plan->seqs[0].st).layers[l];
  const int64_t T = s.T, H = c.n_heads, d = c.head_dim, W = c.window, Qr = c.q_lora, r = c.rope_dim;
  const int64_t HI = c.index_heads, dI = c.index_dim, ratio = L.ratio;
  const bool csa = ModelConfig::kind_of_ratio(ratio) == LayerKind::CSA;
  const double eps = static_cast<float>(c.eps);  // the CPU rounds this eps to float
  const int32_t* pos = ws_.pos.as<int32_t>();
  const float* freq = L.freq.as<float>();
  float *qr = ws_.qr.as<float>(), *q = ws_.q.as<float>(), *kv = ws_.kv.as<float>(), *o = ws_.o.as<float>();

  // Queries: low-rank path, unweighted per-head norm, RoPE.
  gpu::qmatmul(L.wq_a, s.x, T, qr);
  gpu::rmsnorm(qr, Qr, L.q_norm.as<float>(), T, Qr, eps, qr, Qr);
  gpu::qmatmul(L.wq_b, qr, T, q);
  gpu::rmsnorm(q, d, nullptr, T * H, d, eps, q, d);
  gpu::rope(q, T * H, d, d, freq, r, pos, H, false);
  // The single KV head: norm, RoPE, FP8 simulation of the non-rope part.
  gpu::qmatmul(L.wkv, s.x, T, kv);
  gpu::rmsnorm(kv, d, L.kv_norm.as<float>(), T, d, eps, kv, d);
  gpu::rope(kv, T, d, d, freq, r, pos, 1, false);
  gpu::fp8sim_rows(kv, T, d - r, d, 64);

  // Compressed entries for blocks closing in this chunk (visible to later queries of the chunk).
  if (ratio > 0)
    run_compressor(*L.comp, false, d, ratio, freq, s, S.entries.as<uint8_t>(), static_cast<int64_t>(kvb_), S.comp_a, S.comp_s);
  if (csa)
    run_compressor(*L.index_comp, true, dI, ratio, freq, s, S.index_keys.as<uint8_t>(), static_cast<int64_t>(ikb_),
                   S.index_comp_a, S.index_comp_s);

  // CSA: indexer queries and head weights, scores over the visible entries, top-k per query.
  const int64_t n_ent = csa ? (s.plan->seqs[0].p0 + T) / ratio : 0;  // entries closed by the chunk's end
  if (csa) {
    float *qi = ws_.qi.as<float>(), *wi = ws_.wi.as<float>();
    gpu::qmatmul(L.index_wq_b, qr, T, qi);
    gpu::rope(qi, T * HI, dI, dI, freq, r, pos, HI, false);
    gpu::hadamard_rows(qi, T * HI, dI, dI);
    gpu::fp4sim_rows(qi, T * HI, dI, dI, 32);
    gpu::qmatmul(L.index_proj, s.x, T, wi);
    const float wsc = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dI)) / std::sqrt(static_cast<double>(HI)));
    gpu::scale(wi, T * HI, wsc);
    if (n_ent > 0) {
      gpu::indexer_scores(qi, wi, T, HI, dI, S.index_keys.as<uint8_t>(), static_cast<int64_t>(ikb_), pos, ratio, n_ent,
                          ws_.scores.as<float>(), n_ent, ws_.n_vis.as<int32_t>());
      gpu::topk_rows(ws_.scores.as<float>(), T, n_ent, n_ent, ws_.n_vis.as<int32_t>(), c.index_topk, ws_.sel.as<int32_t>(),
                     ws_.sel_n.as<int32_t>());
    }
  }

  // Sparse attention: this chunk's keys in the cache encoding (exact on fp8sim'd vectors, so the
  // values equal the CPU's floats), the ring for earlier window positions, the entries.
  gpu::kv_encode(kv, T, d, d, r, ws_.chunk_kv.as<uint8_t>(), static_cast<int64_t>(kvb_));
  gpu::SparseAttention a;
  a.q = q;
  a.T = T;
  a.H = H;
  a.d = d;
  a.rope = r;
  a.pos = pos;
  a.chunk_kv = ws_.chunk_kv.as<uint8_t>();
  a.ring = S.ring.as<uint8_t>();
  a.window = W;
  a.ratio = ratio;
  a.entries = ratio > 0 ? S.entries.as<uint8_t>() : nullptr;
  if (n_ent > 0) {  // else no query sees an entry: (p + 1) / 4 == 0 for every p of the chunk
    a.sel = ws_.sel.as<int32_t>();
    a.sel_n = ws_.sel_n.as<int32_t>();
    a.ld_sel = c.index_topk;
  }
  a.kv_stride = static_cast<int64_t>(kvb_);
  a.sink = L.sink.as<float>();
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  a.out = o;
  gpu::sparse_attention(a);
  gpu::rope(o, T * H, d, d, freq, r, pos, H, true);

  // The window ring keeps the last W positions for later chunks.
  gpu::kv_encode_ring(kv, T, d, d, r, pos, W, S.ring.as<uint8_t>(), static_cast<int64_t>(kvb_));

  // Grouped low-rank output projection.
  const int64_t G = c.o_groups, Ro = c.o_lora, gw = H * d / G;
  float* z = ws_.z.as<float>();
  const gpu::WeightView wo_a = L.wo_a.view();
  for (int64_t g = 0; g < G; ++g) gpu::qmatmul(wo_a, g * Ro, (g + 1) * Ro, o + g * gw, H * d, T, z + g * Ro, G * Ro);
  gpu::qmatmul(L.wo_b, z, T, s.f);
}

// CpuBackend::run_moe: routing on the device; the expert ids and weights come to the host (one
// synchronisation per layer) to build each expert's token list, which goes back as one upload.
// Experts run in ascending id order, then the shared expert, each adding into f: per output the
// same sequence of float additions as the CPU.
void CudaBackend::moe(int64_t l, Step& s) {
  const ModelConfig& c = c_;
  const DevLayer& L = layers_[l];
  const int64_t T = s.T, D = c.dim, E = c.n_experts, k = c.n_active, I = c.moe_inter, Tk = T * k;
  const float lim = static_cast<float>(c.swiglu_limit);

  gpu::qmatmul(L.gate, s.x, T, ws_.glog.as<float>());
  gpu::route(ws_.glog.as<float>(), T, E, k, L.hash ? nullptr : L.bias.as<float>(), L.hash ? L.tid2eid.as<int32_t>() : nullptr,
             ws_.tokens.as<int32_t>(), c.route_scale, ws_.ids.as<int32_t>(), ws_.wts.as<float>());
  ids_h_.resize(static_cast<size_t>(Tk));
  wts_h_.resize(static_cast<size_t>(Tk));
  ws_.ids.download(ids_h_.data(), static_cast<size_t>(Tk) * sizeof(int32_t));
  ws_.wts.download(wts_h_.data(), static_cast<size_t>(Tk) * sizeof(float));

  // Per expert, its tokens in ascending order (the CPU's routed[e]) and their weights.
  count_h_.assign(static_cast<size_t>(E + 1), 0);
  for (int32_t e : ids_h_) {
    DSV4_CHECK_MSG(e >= 0 && e < E, "cuda routing gave expert id " + std::to_string(e));
    ++count_h_[e + 1];
  }
  for (int64_t e = 0; e < E; ++e) count_h_[e + 1] += count_h_[e];  // now offsets
  idx_h_.resize(static_cast<size_t>(Tk));
  roww_h_.resize(static_cast<size_t>(Tk));
  {
    std::vector<int32_t> at(count_h_.begin(), count_h_.end() - 1);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = ids_h_[t * k + j];
        idx_h_[at[e]] = static_cast<int32_t>(t);
        roww_h_[at[e]++] = wts_h_[t * k + j];
      }
  }
  ws_.idx.upload(idx_h_.data(), static_cast<size_t>(Tk) * sizeof(int32_t));
  ws_.roww.upload(roww_h_.data(), static_cast<size_t>(Tk) * sizeof(float));

  ws_.f.fill_zero();
  float *xs = ws_.xs.as<float>(), *g = ws_.g.as<float>(), *u = ws_.u.as<float>(), *y = ws_.y.as<float>();
  const int32_t* idx = ws_.idx.as<int32_t>();
  const float* roww = ws_.roww.as<float>();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t off = count_h_[e], n = count_h_[e + 1] - off;
    if (n == 0) continue;
    const DevExpert& ex = L.experts[e];
    gpu::gather_rows(s.x, D, idx + off, n, D, xs, D);
    gpu::qmatmul(ex.w1, xs, n, g);
    gpu::qmatmul(ex.w3, xs, n, u);
    gpu::swiglu_clamped(g, I, u, I, n, I, lim, roww + off);
    gpu::qmatmul(ex.w2, g, n, y);
    gpu::scatter_add_rows(y, D, idx + off, n, D, s.f, D);
  }
  gpu::qmatmul(L.shared.w1, s.x, T, g);
  gpu::qmatmul(L.shared.w3, s.x, T, u);
  gpu::swiglu_clamped(g, I, u, I, T, I, lim, nullptr);
  gpu::qmatmul(L.shared.w2, g, T, y);
  gpu::add(s.f, y, s.f, T * D);
}

// One sequence per step: the rows asked for are its last row or all of its rows, contiguous.
static int64_t first_of_contiguous(const std::vector<int64_t>& rows) {
  for (size_t i = 0; i < rows.size(); ++i) DSV4_CHECK(rows[i] == rows[0] + static_cast<int64_t>(i));
  return rows.empty() ? 0 : rows[0];
}

void CudaBackend::read_hidden(Step& s, const std::vector<int64_t>& rows, float* out) {
  const size_t row = static_cast<size_t>(c_.hc * c_.dim) * sizeof(float);
  ws_.X.download(out, rows.size() * row, static_cast<size_t>(first_of_contiguous(rows)) * row);
}

void CudaBackend::hc_head(Stack stack, Step& s, const std::vector<int64_t>& rows) {
  DSV4_CHECK(stack == Stack::Main);  // begin() refuses MTP steps
  const int64_t t0 = first_of_contiguous(rows), n = static_cast<int64_t>(rows.size());
  gpu::hc_head(head_mix_, s.X + t0 * c_.hc * c_.dim, n, c_.hc, c_.dim, c_.eps, c_.hc_eps, ws_.mixes.as<float>(), s.x);
}

void CudaBackend::final_norm(Stack, Step& s, int64_t n) { gpu::rmsnorm(s.x, c_.dim, norm_.as<float>(), n, c_.dim, c_.eps, s.x, c_.dim); }

void CudaBackend::logits(Step& s, int64_t n, float* out) {
  gpu::qmatmul(head_, s.x, n, ws_.logits.as<float>());
  ws_.logits.download(out, static_cast<size_t>(n * c_.vocab) * sizeof(float));
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const ModelWeights& w, const CudaOptions& o) {
  return std::make_unique<CudaBackend>(w, o);
}

}  // namespace dsv4
