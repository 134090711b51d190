// The CUDA backend: model/backend.h's ops on the kernels of src/kernels/cuda (cuda_ops.h), with
// the arithmetic choices of the CPU backend (backends/cpu/cpu_backend.cpp), which is the
// reference each kernel is tested against; the sublayers' stage order is model/'s, shared by
// both. Plain C++ (g++), linked into dsv4cuda.
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/step_graphs.h"
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

// A step's upload of T rows: token ids [T] and positions [T] (int32), then the sequence table
// [T] (pointers, at 8 * T bytes: aligned), then a sampled step's rows (StepPlan::sample, at most
// one per row; 32-byte SampleRows at 16 * T bytes: aligned for their doubles).
constexpr size_t table_offset(int64_t T) { return static_cast<size_t>(T) * 2 * sizeof(int32_t); }
constexpr size_t sample_offset(int64_t T) { return table_offset(T) + static_cast<size_t>(T) * sizeof(void*); }
constexpr size_t step_in_bytes(int64_t T) { return sample_offset(T) + static_cast<size_t>(T) * sizeof(SampleRow); }

template <class T>
DeviceBuffer upload(const std::vector<T>& v, const char* what) {
  if (v.empty()) throw Error(std::string("cuda backend: weight vector ") + what + " is empty");
  return gpu::to_device(v);
}

// The model's tensors on the device (the mtp.0 block's too): one walk over the tensor list
// (model/tensors.h) uploads each in its stored form (gpu::upload_weight; small tensors as the
// float / int32 vectors the binding made). The ops name weights by their host structs
// (model/backend.h): weight() and data() find the device copy of one.
class DeviceTensors {
 public:
  explicit DeviceTensors(const ModelWeights& w) {
    for_each_tensor(w, [&](const TensorDesc& t, TensorTarget<true> x) {
      if (x.linear) weights_.emplace(x.linear, gpu::upload_weight(*x.linear));
      if (x.floats) buffers_.emplace(x.floats, upload(*x.floats, t.name.c_str()));
      if (x.ids) buffers_.emplace(x.ids, upload(*x.ids, t.name.c_str()));
      names_.emplace(x.address(), t.name);
    });
  }

  const DeviceWeight& weight(const QWeight& w) const { return find(weights_, &w); }
  template <class T>
  const T* data(const std::vector<T>& v) const {
    return find(buffers_, &v).template as<T>();
  }
  // Moves a mixer's vectors out (the mHC ops take a DeviceHcMix).
  gpu::DeviceHcMix take(const HcMixW& m, int64_t rows, int64_t width) {
    gpu::DeviceHcMix d;
    d.rows = rows;
    d.width = width;
    d.fn = pop(m.fn);
    d.base = pop(m.base);
    d.scale = pop(m.scale);
    return d;
  }

 private:
  template <class Map>
  const typename Map::mapped_type& find(const Map& m, const void* host) const {
    auto it = m.find(host);
    if (it == m.end()) throw Error("cuda backend: " + what(host) + " is not on the device");
    return it->second;
  }
  DeviceBuffer pop(const std::vector<float>& v) {
    auto it = buffers_.find(&v);
    if (it == buffers_.end()) throw Error("cuda backend: " + what(&v) + " taken twice or not uploaded");
    DeviceBuffer d = std::move(it->second);
    buffers_.erase(it);
    return d;
  }
  std::string what(const void* host) const {
    auto n = names_.find(host);
    return n != names_.end() ? n->second : std::string("a weight outside the tensor list");
  }

  std::unordered_map<const void*, DeviceWeight> weights_;
  std::unordered_map<const void*, DeviceBuffer> buffers_;
  std::unordered_map<const void*, std::string> names_;
};

// What a layer keeps on the device besides its tensors: its RoPE table and its mixers.
struct DevLayer {
  DeviceBuffer freq;  // the layer's RoPE table
  gpu::DeviceHcMix hc_attn, hc_ffn;
};

// One layer's caches: the same contents as LayerState in device buffers sized for the context,
// the entries addressed by block index and the compressor rows by position (cuda_ops.h). As in
// kv/state.h, the window ring has window + kRewind slots and the compressor rings kRewind rows
// more than the pooling needs, so a rewind of up to kRewind positions finds what it needs.
struct DevLayerState {
  DeviceBuffer ring, entries, index_keys;
  DeviceBuffer comp_a, comp_s, index_comp_a, index_comp_s;
};

// The buffers of a DevLayerState in a sequence's descriptor, kFields per layer (gpu::SeqRef).
enum Field : int32_t { kRing, kEntries, kIndexKeys, kCompA, kCompS, kIndexCompA, kIndexCompS, kFields };

struct CudaSequence final : BackendSequence {
  const void* owner = nullptr;
  std::vector<DevLayerState> layers;  // the main layers, then the MTP block's (when the model has one)
  // Device [layers * kFields] addresses of the buffers above (null where a layer has none): what
  // a step graph's kernels read through the step's sequence table, so one graph serves any
  // sequences (step_graphs.h).
  DeviceBuffer desc;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelWeights& w, const CudaOptions& o);
  ~CudaBackend() override;

  const char* name() const override { return "cuda"; }
  SequenceState new_sequence() const override;
  SequenceState fork(const SequenceState& st) const override;
  void truncate(SequenceState& st, int64_t pos, Stack stack) const override;
  int64_t max_rows() const override { return chunk_; }
  int64_t decode_bucket(int64_t n) const override;
  SequenceState& padding_sequence() override;
  Step begin(const StepPlan& plan) override;
  void end(Step& s) override { flush(); }
  float* tmp(Step& s, Tmp which, int64_t n) override { return slot(which, n * sizeof(float)).as<float>(); }
  int32_t* tmp_ints(Step& s, Tmp which, int64_t n) override { return slot(which, n * sizeof(int32_t)).as<int32_t>(); }
  void hc_pre(int64_t l, Sub sub, Step& s) override;
  void hc_post(Step& s) override {
    if (!replaying()) gpu::hc_post(s.f, s.post, s.comb, s.X, s.T, c_.hc, c_.dim, stream_);
  }
  void matmul(Step& s, const Matmul& m) override;
  void rmsnorm(Step& s, const RmsNorm& n) override;
  void vec_ops(Step& s, const VecOps& v) override;
  void scale(Step&, float* x, int64_t n, float factor) override {
    if (!replaying()) gpu::scale(x, n, factor, stream_);
  }
  void compress(Step& s, const CompressFeed& f) override;
  void index_topk(Step& s, const IndexTopk& k) override;
  void attend(Step& s, const Attend& a) override;
  void route(Step& s, const Route& r) override;
  RowList dispatch(Step& s, const std::vector<int32_t>& rows, const std::vector<float>& weights) override;
  void zero_f(Step& s) override;
  void gather(Step&, const float* x, const int32_t* rows, int64_t n, int64_t dim, float* y) override {
    if (!replaying()) gpu::gather_rows(x, dim, rows, n, dim, y, dim, stream_);
  }
  void scatter_add(Step&, const float* y, const int32_t* rows, int64_t n, int64_t dim, float* out) override {
    if (!replaying()) gpu::scatter_add_rows(y, dim, rows, n, dim, out, dim, stream_);
  }
  void swiglu(Step&, const Swiglu& g) override {
    if (!replaying()) gpu::swiglu_clamped(g.g, g.n, g.u, g.n, g.rows, g.n, g.limit, g.w, stream_);
  }
  void add(Step&, float* y, const float* x, int64_t n) override {
    if (!replaying()) gpu::add(y, x, y, n, stream_);
  }
  bool moe_on_device(const Step& s) const override { return s.T <= StepGraphs::kMaxRows && !experts_.empty(); }
  void routed_experts(Step& s, const RoutedExperts& r) override;
  void read_hidden(Step& s, const std::vector<int64_t>& rows, float* out) override;
  void hc_head(Stack stack, Step& s, const std::vector<int64_t>& rows) override;
  void logits(Step& s, int64_t n, float* out) override;
  void argmax(Step& s, int64_t n, int64_t vocab, int32_t* out) override;
  void sample(Step& s, int64_t n, int64_t vocab, int32_t* out) override;
  int64_t sample_max_candidates(int64_t vocab) const override { return gpu::sample_max_candidates(vocab); }

 private:
  CudaSequence& sequence(SequenceState& st) const;
  const CudaSequence& sequence(const SequenceState& st) const;
  // A sequence's device buffers (contents undefined) and its descriptor.
  std::unique_ptr<CudaSequence> allocate_sequence() const;
  int64_t state_layers() const { return c_.n_layers + (w_.mtp ? 1 : 0); }
  // Where a per-sequence kernel finds buffer `f` of layer l of sequence q in a step graph (read
  // from the step's sequence table at run time); unset in an eager step, which passes the buffer.
  gpu::SeqRef ref(const Step& s, const StepSeq& q, int64_t l, Field f) const {
    if (mode_ != StepGraphs::Mode::Capture) return {};
    return {seqs_d_, static_cast<int32_t>(&q - s.plan->seqs.data()), static_cast<int32_t>(l * kFields + f)};
  }
  // The buffer itself in an eager step; null in a graph step (the kernel follows the SeqRef).
  template <class T>
  T* direct(const DeviceBuffer& b) const {
    return mode_ == StepGraphs::Mode::Capture ? nullptr : b.as<T>();
  }
  // The MTP block's input (MODEL.md "MTP block") into s.X: begin() of an MTP step.
  void mtp_input(Step& s);
  DeviceBuffer& slot(Tmp which, size_t bytes);
  // Every op that enqueues device work starts with it: counts the op and says whether a step
  // graph does the work instead (step_graphs.h).
  bool replaying() {
    ++ops_;
    return mode_ == StepGraphs::Mode::Replay;
  }
  // Runs the step's graph (captured now or before); the stream then holds the whole step.
  void flush();
  void wait() const { gpu::synchronize(stream_); }

  const ModelWeights& w_;
  const ModelConfig& c_;
  gpu::Stream stream_ = nullptr;  // every op; a created stream, since the legacy one cannot capture
  int64_t context_ = 0, chunk_ = 0;
  size_t kvb_ = 0, ikb_ = 0;  // bytes per cached KV vector / indexer key
  DeviceTensors dev_;
  gpu::DeviceHcMix head_mix_, mtp_head_mix_;  // hc_head of the main model, of the MTP block
  std::vector<DevLayer> layers_;              // the main layers, then the MTP block's
  // The routed experts' matrices per MoE layer, for qmatmul_experts (empty: experts of one layer
  // differ in format or shape, and every step routes through the host).
  struct ExpertTables {
    gpu::DeviceExpertTable w1, w3, w2;
  };
  std::unordered_map<const MoEW*, ExpertTables> experts_;

  // The activation workspace for chunks of up to chunk_ tokens: the step's buffers, one slot per
  // Tmp (ca / cs: the KV compressor's rows, ia / is: the indexer compressor's), kernel scratch.
  struct Workspace {
    // The step's upload, laid out for its T rows as the staging buffer: token ids [T], positions
    // [T], then (graph steps) the sequence table [T seqs] of descriptor addresses, then (sampled
    // steps) the SampleRows.
    DeviceBuffer in;
    DeviceBuffer X, x, post, comb, f, mixes;
    DeviceBuffer qr, q, kv, chunk_kv, o, z, ca, cs, ia, is, qi, wi, scores, sel, sel_n, n_vis;
    DeviceBuffer glog, ids, wts, idx, roww, xs, g, u, y;
    DeviceBuffer sg, su, sy;  // routed_experts: per (row, slot) [kMaxRows * n_active, I or D]
    DeviceBuffer logits;
    // sample(): each head row's candidates (ids best first, count) and their probabilities, for
    // up to chunk_ rows of sample_max_candidates(vocab); the picked ids.
    DeviceBuffer cand, cand_n, prob, picked;
    DeviceBuffer hid, bcast;  // MTP steps: the main model's final states [chunk_ * hc, D]; r / hc for r < chunk_ * hc
  } ws_;
  gpu::PinnedBuffer stage_;  // the step's upload (Workspace::in's layout), copied at begin
  // Into ws_.in, for the current step (fixed for a given T, so a graph of T rows finds them).
  int32_t* tokens_d_ = nullptr;
  int32_t* pos_d_ = nullptr;
  const void* const* const* seqs_d_ = nullptr;
  const SampleRow* sample_d_ = nullptr;
  std::optional<SequenceState> pad_;  // padding_sequence(), made on first use
  gpu::PinnedBuffer hid_stage_;  // MTP steps: StepPlan::hidden [chunk_ * hc * D], uploaded at begin

  // Step graphs: whether decode steps use them, the cache, and the current step's mode and key.
  bool use_graphs_ = true;
  StepGraphs graphs_;
  StepGraphs::Mode mode_ = StepGraphs::Mode::Eager;
  std::vector<uint64_t> key_;
  int64_t ops_ = 0;
};


// w, once a device is known to be there (before the first upload).
const ModelWeights& on_device(const ModelWeights& w) {
  if (!gpu::device_available()) throw Error("cuda backend: " + gpu::device_summary());
  return w;
}

CudaBackend::CudaBackend(const ModelWeights& w, const CudaOptions& o) : w_(w), c_(w.cfg), dev_(on_device(w)) {
  const ModelConfig& c = c_;
  stream_ = gpu::create_stream();
  use_graphs_ = o.graphs;
  context_ = o.context;
  if (context_ < 1 || context_ > 0x7FFFFFFF) throw Error("cuda backend: context " + std::to_string(o.context) + " out of range");
  chunk_ = std::clamp<int64_t>(o.max_chunk, 1, context_);
  kvb_ = gpu::kv_codec_bytes(c.head_dim, c.rope_dim);
  ikb_ = gpu::fp4_codec_bytes(c.index_dim);

  head_mix_ = dev_.take(w.hc_head, c.hc, c.hc * c.dim);
  if (w.mtp) mtp_head_mix_ = dev_.take(w.mtp->hc_head, c.hc, c.hc * c.dim);
  const int64_t M = c.hc_mix(), width = c.hc * c.dim;
  for (int64_t l = 0; l < state_layers(); ++l) {
    const LayerW& L = w.layer(l);
    DevLayer d;
    d.freq = upload(layer_rope(c, l).freq, "rope freq");
    d.hc_attn = dev_.take(L.hc_attn, M, width);
    d.hc_ffn = dev_.take(L.hc_ffn, M, width);
    layers_.push_back(std::move(d));
    std::vector<const DeviceWeight*> w1, w3, w2;
    for (const ExpertW& e : L.ffn.experts) {
      w1.push_back(&dev_.weight(e.w1));
      w3.push_back(&dev_.weight(e.w3));
      w2.push_back(&dev_.weight(e.w2));
    }
    try {
      experts_.emplace(&L.ffn, ExpertTables{gpu::make_expert_table(w1), gpu::make_expert_table(w3), gpu::make_expert_table(w2)});
    } catch (const Error&) {
      experts_.clear();  // mixed expert formats: every MoE through the host lists
      break;
    }
  }
  if (experts_.size() != static_cast<size_t>(state_layers())) experts_.clear();

  // Workspace for chunk_ tokens. Indexer scores: one row per query over every entry the
  // context can hold (CSA).
  const int64_t C = chunk_, D = c.dim, hc = c.hc, H = c.n_heads, d = c.head_dim;
  const int64_t HI = c.index_heads, dI = c.index_dim, k = c.n_active, I = c.moe_inter;
  ws_.in = bytes(step_in_bytes(C));
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
  ws_.ca = floats(C * 2 * d);  // CSA's overlapping compressor: coff 2
  ws_.cs = floats(C * 2 * d);
  ws_.ia = floats(C * 2 * dI);
  ws_.is = floats(C * 2 * dI);
  ws_.qi = floats(C * HI * dI);
  ws_.wi = floats(C * HI);
  ws_.scores = floats(C * (context_ / kCsaRatio + 1));
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
  ws_.sg = floats(StepGraphs::kMaxRows * k * I);
  ws_.su = floats(StepGraphs::kMaxRows * k * I);
  ws_.sy = floats(StepGraphs::kMaxRows * k * D);
  stage_ = gpu::PinnedBuffer(step_in_bytes(C));
  ws_.logits = floats(C * c.vocab);
  const int64_t K = gpu::sample_max_candidates(c.vocab);
  ws_.cand = ints(C * K);
  ws_.cand_n = ints(C);
  ws_.prob = bytes(C * K * static_cast<int64_t>(sizeof(double)));
  ws_.picked = ints(C);
  if (w.mtp) {
    ws_.hid = floats(C * hc * D);
    hid_stage_ = gpu::PinnedBuffer(static_cast<size_t>(C * hc * D) * sizeof(float));
    std::vector<int32_t> bcast(static_cast<size_t>(C * hc));
    for (size_t r = 0; r < bcast.size(); ++r) bcast[r] = static_cast<int32_t>(r / static_cast<size_t>(hc));
    ws_.bcast = gpu::to_device(bcast);
  }
  gpu::synchronize();
}

CudaBackend::~CudaBackend() {
  gpu::abort_capture(stream_);
  try {
    wait();
    gpu::destroy_stream(stream_);
  } catch (const Error&) {  // a destructor cannot report; the device is unusable anyway
  }
}

DeviceBuffer& CudaBackend::slot(Tmp which, size_t n) {
  DeviceBuffer* b = nullptr;
  switch (which) {
    case Tmp::Qr: b = &ws_.qr; break;
    case Tmp::Q: b = &ws_.q; break;
    case Tmp::Kv: b = &ws_.kv; break;
    case Tmp::CompA: b = &ws_.ca; break;
    case Tmp::CompG: b = &ws_.cs; break;
    case Tmp::IndexA: b = &ws_.ia; break;
    case Tmp::IndexG: b = &ws_.is; break;
    case Tmp::IndexQ: b = &ws_.qi; break;
    case Tmp::IndexW: b = &ws_.wi; break;
    case Tmp::Sel: b = &ws_.sel; break;
    case Tmp::SelN: b = &ws_.sel_n; break;
    case Tmp::O: b = &ws_.o; break;
    case Tmp::Z: b = &ws_.z; break;
    case Tmp::GateLogits: b = &ws_.glog; break;
    case Tmp::ExpertIn: b = &ws_.xs; break;
    case Tmp::ExpertGate: b = &ws_.g; break;
    case Tmp::ExpertUp: b = &ws_.u; break;
    case Tmp::ExpertOut: b = &ws_.y; break;
    case Tmp::ExpertAll:
    case Tmp::ZGroups:
    case Tmp::OutRows:
    case Tmp::HeadRows: break;  // parallel runs use the CPU backend only
  }
  DSV4_CHECK(b != nullptr);
  DSV4_CHECK_MSG(n <= b->bytes(), "cuda workspace slot " + std::to_string(static_cast<int>(which)) + " holds " +
                                      std::to_string(b->bytes()) + " bytes, " + std::to_string(n) + " asked");
  return *b;
}

std::unique_ptr<CudaSequence> CudaBackend::allocate_sequence() const {
  const ModelConfig& c = c_;
  // Nothing may be enqueued on stream_ into a capture a failed step left open (begin() drops it
  // too; CUDA refuses allocation during a global-mode capture).
  gpu::abort_capture(stream_);
  auto seq = std::make_unique<CudaSequence>();
  seq->owner = this;
  for (int64_t l = 0; l < state_layers(); ++l) {
    const LayerW& L = w_.layer(l);
    const LayerKind kind = L.kind();
    DevLayerState s;
    s.ring = bytes((c.window + kRewind) * static_cast<int64_t>(kvb_));
    if (kind != LayerKind::Window) {
      const int64_t cap = context_ / L.ratio, rows = gpu::compressor_ring_rows(L.ratio) + kRewind;
      const int64_t width = L.attn.comp->coff * L.attn.comp->out_dim;
      s.entries = bytes(cap * static_cast<int64_t>(kvb_));
      s.comp_a = floats(rows * width);
      s.comp_s = floats(rows * width);
      if (kind == LayerKind::CSA) {
        const CompressorW& ic = L.attn.indexer->comp;
        s.index_keys = bytes(cap * static_cast<int64_t>(ikb_));
        s.index_comp_a = floats(rows * ic.coff * ic.out_dim);
        s.index_comp_s = floats(rows * ic.coff * ic.out_dim);
      }
    }
    seq->layers.push_back(std::move(s));
  }
  std::vector<const void*> desc;
  for (const DevLayerState& s : seq->layers)
    for (const DeviceBuffer* b : {&s.ring, &s.entries, &s.index_keys, &s.comp_a, &s.comp_s, &s.index_comp_a, &s.index_comp_s})
      desc.push_back(b->empty() ? nullptr : b->get());
  DSV4_CHECK(desc.size() == seq->layers.size() * kFields);
  seq->desc = gpu::to_device(desc);
  return seq;
}

// Zero-filled, so that fresh states compare equal (only written slots are ever read).
SequenceState CudaBackend::new_sequence() const {
  std::unique_ptr<CudaSequence> seq = allocate_sequence();
  for (DevLayerState& s : seq->layers)
    for (DeviceBuffer* b : {&s.ring, &s.entries, &s.index_keys, &s.comp_a, &s.comp_s, &s.index_comp_a, &s.index_comp_s})
      if (!b->empty()) b->fill_zero();
  SequenceState st;
  st.device = std::move(seq);
  return st;
}

// Device-to-device copies of every cache (the CPU shares its entry pages copy-on-write; here the
// entries are copied, only the blocks that have closed: st.pos / ratio of them, mtp_pos / ratio
// in the MTP block's layer). The copy has its own buffers and descriptor; step graphs find either
// sequence's buffers through the step's sequence table.
SequenceState CudaBackend::fork(const SequenceState& st) const {
  const CudaSequence& src = sequence(st);
  std::unique_ptr<CudaSequence> seq = allocate_sequence();
  DSV4_CHECK(seq->layers.size() == src.layers.size());
  auto copy = [&](DeviceBuffer& dst, const DeviceBuffer& from, size_t n) {
    DSV4_CHECK(dst.bytes() == from.bytes() && n <= from.bytes());
    if (n) gpu::copy_async(dst.get(), from.get(), n, stream_);
  };
  for (size_t l = 0; l < src.layers.size(); ++l) {
    const DevLayerState& a = src.layers[l];
    DevLayerState& b = seq->layers[l];
    const LayerW& L = w_.layer(static_cast<int64_t>(l));
    copy(b.ring, a.ring, a.ring.bytes());
    if (L.kind() == LayerKind::Window) continue;
    const int64_t pos = static_cast<int64_t>(l) < c_.n_layers ? st.pos : st.mtp_pos;
    const size_t closed = static_cast<size_t>(std::min(pos / L.ratio, context_ / L.ratio));
    copy(b.entries, a.entries, closed * kvb_);
    copy(b.comp_a, a.comp_a, a.comp_a.bytes());
    copy(b.comp_s, a.comp_s, a.comp_s.bytes());
    if (L.kind() != LayerKind::CSA) continue;
    copy(b.index_keys, a.index_keys, closed * ikb_);
    copy(b.index_comp_a, a.index_comp_a, a.index_comp_a.bytes());
    copy(b.index_comp_s, a.index_comp_s, a.index_comp_s.bytes());
  }
  wait();  // the copies are done before either sequence changes
  SequenceState out;
  out.pos = st.pos;
  out.mtp_pos = st.mtp_pos;
  out.device = std::move(seq);
  return out;
}

// truncate_host_state's semantics (kv/state.cpp) with nothing to do on the device, so no copy to
// the host and back: entries are addressed by block index and every kernel derives from the
// positions which entries are visible (those of blocks closing at or after `pos` become invisible
// and are rewritten when their block closes again); the window ring (window + kRewind slots) and
// the compressor rings (kRewind rows of slack) still hold every row a position from `pos` on reads,
// the rows of the dropped positions being overwritten before anything reads them. Only the
// position goes back: a step graph reads the positions from the per-step upload.
void CudaBackend::truncate(SequenceState& st, int64_t pos, Stack stack) const {
  const CudaSequence& seq = sequence(st);
  const bool mtp = stack == Stack::Mtp;
  DSV4_CHECK(!mtp || static_cast<int64_t>(seq.layers.size()) > c_.n_layers);
  int64_t& cur = mtp ? st.mtp_pos : st.pos;
  DSV4_CHECK_MSG(pos >= 0 && pos <= cur && cur - pos <= kRewind,
                 "truncate from " + std::to_string(cur) + " to " + std::to_string(pos));
  cur = pos;
}

const CudaSequence& CudaBackend::sequence(const SequenceState& st) const {
  const auto* seq = dynamic_cast<const CudaSequence*>(st.device.get());
  if (!seq || seq->owner != this) throw Error("sequence state does not belong to this model's cuda backend");
  return *seq;
}

CudaSequence& CudaBackend::sequence(SequenceState& st) const {
  return const_cast<CudaSequence&>(sequence(static_cast<const SequenceState&>(st)));
}

// Uploads the step's token ids, positions and (graph steps) sequence table (MTP: and the main
// model's final states), outside any graph: they change every step. Then picks the mode: a decode
// step of a shape seen before replays its graph, a new one is captured.
Backend::Step CudaBackend::begin(const StepPlan& plan) {
  const bool mtp = plan.stack == Stack::Mtp;
  if (mtp && !w_.mtp) throw Error("cuda backend: this model has no MTP block");
  DSV4_CHECK(!mtp || plan.hidden);
  if (mode_ == StepGraphs::Mode::Capture) gpu::abort_capture(stream_);  // the last step threw mid-capture
  mode_ = StepGraphs::Mode::Eager;
  ops_ = 0;
  const int64_t T = plan.T();
  DSV4_CHECK(T <= chunk_);  // max_rows()
  // sample_rows trusts its rows (device data): a row with more candidates than topk_rows sorts
  // would pick from a truncated list, so it is refused here, before anything runs.
  DSV4_CHECK(plan.tail != StepPlan::Tail::Sample || static_cast<int64_t>(plan.sample.size()) <= T);
  for (const SampleRow& r : plan.sample)
    if (sample_candidates(r, c_.vocab) > gpu::sample_max_candidates(c_.vocab))
      throw Error("cuda backend: a sampled row has " + std::to_string(sample_candidates(r, c_.vocab)) +
                  " candidates; device sampling takes at most " + std::to_string(gpu::sample_max_candidates(c_.vocab)) +
                  " (top-k)");
  bool decode = use_graphs_ && T <= StepGraphs::kMaxRows;
  // The graph of a step depends on its shape, never on its sequences (their buffers are read
  // through the sequence table): T, and what ops it calls — a logits step and an ids step, a
  // main step and an MTP step (other layers), a step that reads the final states and one that
  // does not (the graph ends at read_hidden, and the head runs eagerly after it: an MTP draft
  // step vs a catch-up step).
  std::vector<uint64_t> key = {static_cast<uint64_t>(plan.tail), static_cast<uint64_t>(plan.stack),
                               static_cast<uint64_t>(plan.reads_hidden), static_cast<uint64_t>(T)};
  for (const StepSeq& q : plan.seqs) {
    sequence(*q.st);  // this backend's
    if (q.p0 + q.n > context_)
      throw Error("cuda backend: position " + std::to_string(q.p0 + q.n - 1) + " is past its context limit of " +
                  std::to_string(context_) + " tokens (set at load: --context)", ErrorKind::ResourceExhausted);
    decode = decode && q.n == 1;
  }
  // One copy: token ids, positions and (graph steps) each sequence's descriptor address.
  wait();  // the staging buffer may still feed the last step's copies
  uint8_t* stage = stage_.as<uint8_t>();
  int32_t* h = reinterpret_cast<int32_t*>(stage);
  for (int64_t t = 0; t < T; ++t) {
    h[t] = plan.tokens[t];
    h[T + t] = static_cast<int32_t>(plan.pos[t]);
  }
  size_t upload = table_offset(T);
  if (decode) {
    const void** table = reinterpret_cast<const void**>(stage + table_offset(T));
    for (size_t i = 0; i < plan.seqs.size(); ++i) table[i] = sequence(*plan.seqs[i].st).desc.get();
    upload = sample_offset(T);
  }
  if (plan.tail == StepPlan::Tail::Sample) {
    // The sampling parameters and drawn numbers ride with the token ids: sample_rows reads them
    // from the device, so a replayed graph picks with this step's values.
    std::copy(plan.sample.begin(), plan.sample.end(), reinterpret_cast<SampleRow*>(stage + sample_offset(T)));
    upload = sample_offset(T) + plan.sample.size() * sizeof(SampleRow);
  }
  gpu::copy_async(ws_.in.get(), stage, upload, stream_);
  uint8_t* in = ws_.in.as<uint8_t>();
  tokens_d_ = reinterpret_cast<int32_t*>(in);
  pos_d_ = tokens_d_ + T;
  seqs_d_ = reinterpret_cast<const void* const* const*>(in + table_offset(T));
  sample_d_ = reinterpret_cast<const SampleRow*>(in + sample_offset(T));
  if (mtp) {
    const size_t n = static_cast<size_t>(T * c_.hc * c_.dim);
    std::copy(plan.hidden, plan.hidden + n, hid_stage_.as<float>());
    gpu::copy_async(ws_.hid.get(), hid_stage_.as<float>(), n * sizeof(float), stream_);
  }
  if (decode) {
    if (graphs_.find(key)) {
      mode_ = StepGraphs::Mode::Replay;
    } else {
      key_ = std::move(key);
      gpu::begin_capture(stream_);
      mode_ = StepGraphs::Mode::Capture;
    }
  }
  Step s;
  s.plan = &plan;
  s.T = T;
  s.X = ws_.X.as<float>();
  s.x = ws_.x.as<float>();
  s.post = ws_.post.as<float>();
  s.comb = ws_.comb.as<float>();
  s.f = ws_.f.as<float>();
  if (replaying()) return s;
  if (mtp) {
    mtp_input(s);
  } else {
    gpu::embed(dev_.weight(w_.embed).view(), tokens_d_, T, c_.hc, s.X, stream_);
  }
  return s;
}

// The CPU backend's begin() for Stack::Mtp: X[t, i] = e_proj . RMSNorm(embed[u_t], enorm) +
// h_proj . RMSNorm(h_{t,i}, hnorm), the first term the same for every copy i. Computed as
// hp + ep (float addition commutes: the same bits as the CPU's ep + hp).
void CudaBackend::mtp_input(Step& s) {
  const MtpW& m = *w_.mtp;
  const int64_t T = s.T, D = c_.dim, hc = c_.hc;
  float* e = s.x;                  // [T, D], free until the first hc_pre
  float* ep = s.f;                 // [T, D], free until the first sublayer writes it
  float* h = ws_.hid.as<float>();  // [T * hc, D]: the uploaded final states, then ep per copy
  gpu::embed(dev_.weight(w_.embed).view(), tokens_d_, T, 1, e, stream_);
  gpu::rmsnorm(e, D, dev_.data(m.enorm), T, D, c_.eps, e, D, stream_);
  gpu::qmatmul(dev_.weight(m.e_proj), e, T, ep, stream_);
  gpu::rmsnorm(h, D, dev_.data(m.hnorm), T * hc, D, c_.eps, h, D, stream_);
  gpu::qmatmul(dev_.weight(m.h_proj), h, T * hc, s.X, stream_);
  gpu::gather_rows(ep, D, ws_.bcast.as<int32_t>(), T * hc, D, h, D, stream_);
  gpu::add(s.X, h, s.X, T * hc * D, stream_);
}

void CudaBackend::flush() {
  if (mode_ == StepGraphs::Mode::Eager) return;
  const bool captured = mode_ == StepGraphs::Mode::Capture;
  mode_ = StepGraphs::Mode::Eager;  // end_capture may throw: the capture is over either way
  if (captured) {
    graphs_.add(std::move(key_), gpu::end_capture(stream_), ops_);
  } else {
    DSV4_CHECK_MSG(ops_ == graphs_.front_ops(), "a replayed decode step called " + std::to_string(ops_) +
                                                    " ops where its capture called " + std::to_string(graphs_.front_ops()));
  }
  graphs_.front().launch(stream_);  // find / add leave the step's graph in front
}

void CudaBackend::hc_pre(int64_t l, Sub sub, Step& s) {
  if (replaying()) return;
  const DevLayer& L = layers_[l];
  gpu::hc_pre(sub == Sub::Attn ? L.hc_attn : L.hc_ffn, s.X, s.T, c_.hc, c_.dim, static_cast<int>(c_.sinkhorn_iters), c_.eps,
              c_.hc_eps, ws_.mixes.as<float>(), s.x, s.post, s.comb, stream_);
}

void CudaBackend::matmul(Step&, const Matmul& m) {
  if (replaying()) return;
  const DeviceWeight& w = dev_.weight(*m.w);
  const int64_t r1 = m.r1 < 0 ? w.rows : m.r1;
  gpu::qmatmul(w.view(), m.r0, r1, m.x, m.ldx < 0 ? w.cols : m.ldx, m.T, m.y, m.ldy < 0 ? r1 - m.r0 : m.ldy, stream_);
}

void CudaBackend::rmsnorm(Step&, const RmsNorm& n) {
  if (replaying()) return;
  gpu::rmsnorm(n.x, n.dim, n.weight ? dev_.data(*n.weight) : nullptr, n.rows, n.dim, n.eps, n.x, n.dim, stream_);
}

// All T * heads vectors at once, stage after stage.
void CudaBackend::vec_ops(Step& s, const VecOps& v) {
  if (replaying()) return;
  const int64_t N = s.T * v.heads, r = c_.rope_dim;
  if (v.norm == VecNorm::Rms) gpu::rmsnorm(v.v, v.dim, v.weight ? dev_.data(*v.weight) : nullptr, N, v.dim, v.eps, v.v, v.dim, stream_);
  if (v.rope != RopeDir::None)
    gpu::rope(v.v, N, v.dim, v.dim, layers_[v.layer].freq.as<float>(), r, pos_d_, v.heads,
              v.rope == RopeDir::Inverse, stream_);
  if (v.sim == QuantSim::Fp8) gpu::fp8sim_rows(v.v, N, v.dim - r, v.dim, 64, stream_);
  if (v.sim == QuantSim::HadamardFp4) {
    gpu::hadamard_rows(v.v, N, v.dim, v.dim, stream_);
    gpu::fp4sim_rows(v.v, N, v.dim, v.dim, 32, stream_);
  }
}

// compress_feed of backends/cpu/compressor.cpp: gpu::compress pools, norms, ropes and quantises
// the closing blocks and writes their entries in place.
void CudaBackend::compress(Step& s, const CompressFeed& f) {
  if (replaying()) return;
  const LayerW& L = w_.layer(f.layer);
  const StepSeq& q = *f.seq;
  DevLayerState& S = sequence(*q.st).layers[f.layer];
  const bool index = f.which == Comp::Index;
  const CompressorW& cw = index ? L.attn.indexer->comp : *L.attn.comp;
  const int64_t width = cw.coff * cw.out_dim;
  gpu::Compressor k;
  k.a = f.a + q.t0 * width;
  k.s = f.g + q.t0 * width;
  k.T = q.n;
  k.pos = pos_d_ + q.t0;
  k.ratio = L.ratio;
  k.dout = cw.out_dim;
  k.rope = c_.rope_dim;
  k.ape = dev_.data(cw.ape);
  k.norm = dev_.data(cw.norm);
  k.eps = c_.eps;
  k.indexer = index;
  k.ring_a = direct<float>(index ? S.index_comp_a : S.comp_a);
  k.ring_s = direct<float>(index ? S.index_comp_s : S.comp_s);
  k.entries = direct<uint8_t>(index ? S.index_keys : S.entries);
  k.ring_a_ref = ref(s, q, f.layer, index ? kIndexCompA : kCompA);
  k.ring_s_ref = ref(s, q, f.layer, index ? kIndexCompS : kCompS);
  k.entries_ref = ref(s, q, f.layer, index ? kIndexKeys : kEntries);
  k.entry_stride = static_cast<int64_t>(index ? ikb_ : kvb_);
  k.capacity = context_ / L.ratio;
  k.ring_rows = gpu::compressor_ring_rows(L.ratio) + kRewind;
  k.freq = layers_[f.layer].freq.as<float>();
  gpu::compress(k, stream_);
}

// Scores over the entries visible to each query, top-k per query.
void CudaBackend::index_topk(Step& s, const IndexTopk& k) {
  if (replaying()) return;
  const ModelConfig& c = c_;
  const StepSeq& q = *k.seq;
  DevLayerState& S = sequence(*q.st).layers[k.layer];
  const int64_t HI = c.index_heads, dI = c.index_dim, ratio = w_.layer(k.layer).ratio, K = c.index_topk;
  // Every entry the context can hold: the kernels derive each query's visible count from its
  // position (device), so the launch does not depend on the step (a graph replays it).
  const int64_t cap = context_ / ratio;
  const int32_t* pos = pos_d_ + q.t0;
  gpu::indexer_scores(k.q + q.t0 * HI * dI, k.w + q.t0 * HI, q.n, HI, dI, direct<uint8_t>(S.index_keys), static_cast<int64_t>(ikb_),
                      pos, ratio, cap, ws_.scores.as<float>(), cap, ws_.n_vis.as<int32_t>(), stream_,
                      ref(s, q, k.layer, kIndexKeys));
  gpu::topk_rows(ws_.scores.as<float>(), q.n, cap, cap, ws_.n_vis.as<int32_t>(), K, k.sel + q.t0 * K, k.sel_n + q.t0, stream_);
}

// Where the CPU decodes cached vectors and gathers keys per query, gpu::sparse_attention reads
// the compact caches directly, in the same key order (window, then the entries: CSA in each
// query's indexer top-k order).
void CudaBackend::attend(Step& s, const Attend& at) {
  if (replaying()) return;
  const ModelConfig& c = c_;
  const LayerW& L = w_.layer(at.layer);
  const StepSeq& q = *at.seq;
  DevLayerState& S = sequence(*q.st).layers[at.layer];
  const int64_t T = q.n, H = c.n_heads, d = c.head_dim, W = c.window, r = c.rope_dim, ratio = L.ratio;
  const int32_t* pos = pos_d_ + q.t0;
  const float* kv = at.kv + q.t0 * d;

  // This chunk's keys in the cache encoding (exact on fp8sim'd vectors, so the values equal the
  // CPU's floats), the ring for earlier window positions, the entries.
  gpu::kv_encode(kv, T, d, d, r, ws_.chunk_kv.as<uint8_t>(), static_cast<int64_t>(kvb_), stream_);
  gpu::SparseAttention a;
  a.q = at.q + q.t0 * H * d;
  a.T = T;
  a.H = H;
  a.d = d;
  a.rope = r;
  a.pos = pos;
  a.chunk_kv = ws_.chunk_kv.as<uint8_t>();
  a.ring = direct<uint8_t>(S.ring);
  a.ring_ref = ref(s, q, at.layer, kRing);
  a.window = W;
  a.ring_slots = W + kRewind;
  a.ratio = ratio;
  if (L.kind() != LayerKind::Window) {
    a.entries = direct<uint8_t>(S.entries);
    a.entries_ref = ref(s, q, at.layer, kEntries);
  }
  if (at.sel) {  // a query that sees no entry has sel_n 0
    a.sel = at.sel + q.t0 * c.index_topk;
    a.sel_n = at.sel_n + q.t0;
    a.ld_sel = c.index_topk;
  }
  a.kv_stride = static_cast<int64_t>(kvb_);
  a.sink = dev_.data(L.attn.sink);
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  a.out = at.out + q.t0 * H * d;
  gpu::sparse_attention(a, stream_);
  // The window ring keeps the last W + kRewind positions for later chunks.
  gpu::kv_encode_ring(kv, T, d, d, r, pos, W + kRewind, direct<uint8_t>(S.ring), static_cast<int64_t>(kvb_), stream_,
                      ref(s, q, at.layer, kRing));
}

// Routing on the device; the expert ids and weights come to the host (one synchronisation per
// layer), where model/moe_layer.cpp builds the per-expert lists.
void CudaBackend::route(Step& s, const Route& r) {
  const ModelConfig& c = c_;
  const int64_t Tk = s.T * c.n_active;
  const bool hash = r.by == RouteBy::Hash;
  const float* bias = hash ? nullptr : dev_.data(r.w->bias);
  const int32_t* table = hash ? dev_.data(r.w->tid2eid) : nullptr;
  DSV4_CHECK(mode_ == StepGraphs::Mode::Eager);  // a graph step routes on the device (moe_on_device)
  gpu::route(r.logits, s.T, c.n_experts, c.n_active, bias, table, tokens_d_, c.route_scale, ws_.ids.as<int32_t>(),
             ws_.wts.as<float>(), stream_);
  wait();  // the downloads below are on the legacy stream
  ws_.ids.download(r.ids, static_cast<size_t>(Tk) * sizeof(int32_t));
  ws_.wts.download(r.weights, static_cast<size_t>(Tk) * sizeof(float));
}

// The lists go back as one upload each.
RowList CudaBackend::dispatch(Step&, const std::vector<int32_t>& rows, const std::vector<float>& weights) {
  ws_.idx.upload(rows.data(), rows.size() * sizeof(int32_t));
  ws_.roww.upload(weights.data(), weights.size() * sizeof(float));
  return {ws_.idx.as<int32_t>(), ws_.roww.as<float>()};
}

void CudaBackend::zero_f(Step& s) {
  DSV4_CHECK(s.f == ws_.f.as<float>());
  if (!replaying()) gpu::zero_async(ws_.f.get(), ws_.f.bytes(), stream_);
}

// model/moe_layer.cpp's routed experts with the routing kept on the device: each (row, slot)
// through its expert (qmatmul_experts: the decode kernel's order, so the same floats as the
// expert loop over gathered rows), weighted by swiglu, added per row in ascending expert id.
void CudaBackend::routed_experts(Step& s, const RoutedExperts& r) {
  if (replaying()) return;
  const ModelConfig& c = c_;
  const int64_t T = s.T, k = c.n_active, Tk = T * k, D = c.dim, I = c.moe_inter;
  DSV4_CHECK(T <= StepGraphs::kMaxRows);
  const bool hash = r.by == RouteBy::Hash;
  const float* bias = hash ? nullptr : dev_.data(r.w->bias);
  const int32_t* table = hash ? dev_.data(r.w->tid2eid) : nullptr;
  int32_t* ids = ws_.ids.as<int32_t>();
  float* wts = ws_.wts.as<float>();
  gpu::route(r.logits, T, c.n_experts, k, bias, table, tokens_d_, c.route_scale, ids, wts, stream_);
  const auto it = experts_.find(r.w);
  DSV4_CHECK(it != experts_.end());
  float *g = ws_.sg.as<float>(), *u = ws_.su.as<float>(), *y = ws_.sy.as<float>();
  gpu::qmatmul_experts(it->second.w1.table, ids, Tk, s.x, D, k, g, I, stream_);
  gpu::qmatmul_experts(it->second.w3.table, ids, Tk, s.x, D, k, u, I, stream_);
  gpu::swiglu_clamped(g, I, u, I, Tk, I, static_cast<float>(c.swiglu_limit), wts, stream_);
  gpu::qmatmul_experts(it->second.w2.table, ids, Tk, g, I, 1, y, D, stream_);
  gpu::moe_combine(y, ids, T, k, D, s.f, stream_);
}

void CudaBackend::read_hidden(Step& s, const std::vector<int64_t>& rows, float* out) {
  flush();
  wait();
  const size_t row = static_cast<size_t>(c_.hc * c_.dim) * sizeof(float);
  for (size_t i = 0; i < rows.size(); ++i) ws_.X.download(out + i * row / sizeof(float), row, static_cast<size_t>(rows[i]) * row);
}

// x[i] = hc_head(X[rows[i]]): one launch per run of consecutive rows (a decode batch is one run).
void CudaBackend::hc_head(Stack stack, Step& s, const std::vector<int64_t>& rows) {
  if (replaying()) return;
  const gpu::DeviceHcMix& mix = stack == Stack::Main ? head_mix_ : mtp_head_mix_;
  const int64_t HD = c_.hc * c_.dim;
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    gpu::hc_head(mix, s.X + rows[i] * HD, static_cast<int64_t>(j - i), c_.hc, c_.dim, c_.eps, c_.hc_eps,
                 ws_.mixes.as<float>(), s.x + static_cast<int64_t>(i) * c_.dim, stream_);
    i = j;
  }
}

void CudaBackend::logits(Step& s, int64_t n, float* out) {
  if (!replaying()) gpu::qmatmul(dev_.weight(w_.head), s.x, n, ws_.logits.as<float>(), stream_);
  flush();
  wait();  // the download is on the legacy stream
  ws_.logits.download(out, static_cast<size_t>(n * c_.vocab) * sizeof(float));
}

// The head and argmax_rows on the device (in the step's graph); only n ids come back.
void CudaBackend::argmax(Step& s, int64_t n, int64_t vocab, int32_t* out) {
  DSV4_CHECK(vocab == c_.vocab);
  if (!replaying()) {
    gpu::qmatmul(dev_.weight(w_.head), s.x, n, ws_.logits.as<float>(), stream_);
    gpu::argmax_rows(ws_.logits.as<float>(), n, vocab, vocab, ws_.idx.as<int32_t>(), stream_);
  }
  flush();
  wait();
  ws_.idx.download(out, static_cast<size_t>(n) * sizeof(int32_t));
}

// The head and sample_rows on the device (in the step's graph, the rows' parameters read from the
// step's upload); only n ids come back.
void CudaBackend::sample(Step& s, int64_t n, int64_t vocab, int32_t* out) {
  DSV4_CHECK(vocab == c_.vocab && static_cast<int64_t>(s.plan->sample.size()) == n);
  if (!replaying()) {
    gpu::qmatmul(dev_.weight(w_.head), s.x, n, ws_.logits.as<float>(), stream_);
    gpu::sample_rows(ws_.logits.as<float>(), n, vocab, vocab, sample_d_, ws_.cand.as<int32_t>(), ws_.cand_n.as<int32_t>(),
                     ws_.prob.as<double>(), ws_.picked.as<int32_t>(), stream_);
  }
  flush();
  wait();
  ws_.picked.download(out, static_cast<size_t>(n) * sizeof(int32_t));
}

// The smallest bucket (1, 2, 4, 8, 16) that holds n decode rows, when steps are graphs.
int64_t CudaBackend::decode_bucket(int64_t n) const {
  if (!use_graphs_ || n < 1 || n > StepGraphs::kMaxRows) return 0;
  int64_t b = 1;
  while (b < n) b *= 2;
  return b <= chunk_ ? b : 0;
}

// Its rows write only its own buffers (at position 0, where nothing is read from its caches);
// zero-filled like any new sequence, so a padding row computes on defined values.
SequenceState& CudaBackend::padding_sequence() {
  if (!pad_) pad_ = new_sequence();
  return *pad_;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const ModelWeights& w, const CudaOptions& o) {
  return std::make_unique<CudaBackend>(w, o);
}

}  // namespace dsv4
