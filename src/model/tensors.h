#pragma once
// The one list of DeepSeek-V4 tensors (STYLE.md 5; gemma.cpp ForEachTensor). For a config it
// says, per tensor: its native checkpoint name (other layouts: io/names.h), what it is, its
// shape, how the published checkpoints store it, and where it lands in ModelWeights. Which
// tensors exist follows the config: a compressor on every CSA and HCA layer, an indexer on
// CSA layers, a hash table (tid2eid) instead of a router bias on the first n_hash layers,
// the mtp.0 block when n_mtp > 0.
//
// Everything that walks the model's tensors goes through for_each_tensor: binding
// (model/weights.cpp), make-tiny's writer (tools/make_tiny.cpp), the CUDA upload and the
// memory accounting below (dsv4 inspect). The visiting order is the checkpoint
// order make-tiny writes (its files are byte-for-byte defined by it).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/weight.h"
#include "io/config.h"
#include "io/names.h"

namespace dsv4 {

struct ModelWeights;

// How the published checkpoints store a tensor. The loader accepts any supported encoding for a
// linear (the decoder is chosen per tensor from its dtype and companions) and F32/BF16/F16 for
// small float tensors; make-tiny writes exactly this.
enum class Stored {
  DenseLinear,   // FP8 E4M3 + E8M0 128x128 block scales in the FP8 releases, BF16 in HF exports
  ExpertLinear,  // routed expert: MXFP4 (official), NVFP4 (NVIDIA's release; MTP stays MXFP4), BF16 HF
  Bf16Linear,    // a matrix kept in BF16 in every release (embedding, head, router, compressors)
  F32,           // small float tensor, F32
  Bf16,          // small float tensor, BF16 (RMSNorm weights)
  I64,           // integer table (hash routing)
};

// What the engine holds after binding.
enum class TensorKind {
  Linear,  // a QWeight viewing the stored (possibly quantised) bytes
  Floats,  // std::vector<float>, converted at load
  Ids,     // std::vector<int32_t>, converted and range-checked at load
};
TensorKind tensor_kind(Stored s);

// What a tensor is, at the granularity make-tiny needs to draw plausible values.
enum class Role {
  Embedding,   // embed [V, D]
  Linear,      // any other matrix [out, in] (projections, head, router gate, shared expert)
  ExpertUp,    // routed expert w1 (gate) / w3 (up)
  ExpertDown,  // routed expert w2 (down)
  Norm,        // RMSNorm weight
  MixFn,       // mHC mixer fn [rows, hc*D]
  MixBase,     // mHC sublayer mixer base [(2+hc)*hc]
  HeadBase,    // hc_head mixer base [hc]
  MixScale,    // mHC mixer scale [3] (sublayer) or [1] (head)
  Sink,        // attention sink [H]
  Ape,         // compressor position bias [ratio, coff*out_dim]
  RouterBias,  // router score correction [E]
  HashTable,   // tid2eid [V, k]
};

// The part of the model a tensor belongs to (memory accounting).
enum class Part { Embedding, Attention, Compressor, Indexer, Router, RoutedExperts, SharedExpert, Mixing, Norms, Head, MtpInput };
inline constexpr int kNumParts = 11;
const char* part_name(Part p);

struct TensorDesc {
  std::string name;  // native checkpoint name of the main tensor ("layers.3.attn.wq_a.weight")
  Role role = Role::Linear;
  Stored stored = Stored::F32;
  Part part = Part::Attention;
  std::vector<int64_t> shape;  // logical shape; [out, in] for a linear whatever its encoding
  int64_t limit = 0;           // Ids: values lie in [0, limit)
  int64_t layer = -1;          // main layer index, or -1 (top level and the MTP block)
  bool mtp = false;            // inside the mtp.0 block
  int64_t expert = -1;         // routed expert index

  TensorKind kind() const { return tensor_kind(stored); }
  // A linear's native name without ".weight": its companions (".scale", ".weight_scale", ...)
  // are base + suffix.
  std::string base() const;
  // The name in a checkpoint layout (io/names.h: HF names are rules on the native ones).
  std::string name_in(Layout layout) const { return layout_tensor_name(layout, name); }
};

// Where a tensor lands in ModelWeights: the one pointer matching desc.kind() is set.
template <bool Const>
struct TensorTarget {
  template <class T>
  using Ptr = std::conditional_t<Const, const T*, T*>;
  Ptr<QWeight> linear = nullptr;
  Ptr<std::vector<float>> floats = nullptr;
  Ptr<std::vector<int32_t>> ids = nullptr;

  const void* address() const {
    return linear ? static_cast<const void*>(linear) : floats ? static_cast<const void*>(floats) : static_cast<const void*>(ids);
  }
};

using TensorVisitor = std::function<void(const TensorDesc&, TensorTarget<false>)>;
using ConstTensorVisitor = std::function<void(const TensorDesc&, TensorTarget<true>)>;

// Visits every tensor of the model w.cfg describes. The mutable form first gives `w` the shape
// of that model (layers, their ratio / hash flags, the compressor and indexer slots, the experts,
// the MTP block), so the visitor only fills the tensors. The const form walks a model built that
// way (load_model) and throws dsv4::Error if its structure disagrees with its config.
void for_each_tensor(ModelWeights& w, const TensorVisitor& visit);
void for_each_tensor(const ModelWeights& w, const ConstTensorVisitor& visit);
// The same list from a config alone (no weights anywhere): make-tiny.
void for_each_tensor(const ModelConfig& c, const std::function<void(const TensorDesc&)>& visit);

// ---- memory accounting

// Bytes the bound model holds per part: linears as stored (payload + scales, QWeight::
// stored_bytes), small tensors as converted (4 bytes per value).
struct WeightBytes {
  struct Row {
    size_t tensors = 0, bytes = 0;
  };
  Row main[kNumParts], mtp[kNumParts];
  size_t main_bytes() const;
  size_t mtp_bytes() const;
};
WeightBytes weight_bytes(const ModelWeights& w);

}  // namespace dsv4
