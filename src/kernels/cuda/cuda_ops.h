#pragma once
// CUDA kernel library of the dsv4 engine (issue 5): the host-facing API.
//
// Plain C++: no CUDA header is included and no CUDA type appears, so g++-compiled code (the
// forward, the tests) includes this file and links dsv4cuda. Only built when CMake finds nvcc;
// users see DSV4_HAVE_CUDA=1 then.
//
// Conventions (every function below):
// - Pointers named as device pointers live in GPU memory; the rest (shapes, strides, eps) are
//   host scalars that depend only on the model shape and the chunk length, never on data.
// - Data-dependent quantities — positions, token ids, expert ids, top-k indices and counts —
//   are read by the kernels from device arrays, so a decode step can be captured once in a CUDA
//   graph and replayed with no host synchronisation.
// - Every op is enqueued on `stream` (nullptr = the legacy default stream) and returns without
//   waiting. A bad launch throws dsv4::Error at once; a fault during execution surfaces as a
//   dsv4::Error from the next synchronising call (synchronize, DeviceBuffer::download).
// - No op allocates device memory: scratch is passed in by the caller (graph capture forbids
//   cudaMalloc inside the captured region).
// - Strides (ld*) count elements, not bytes, unless the name says bytes.
// - Each op mirrors the CPU function named in its comment (src/model, src/kv, src/cpu) and is
//   tested against it (tests/test_cuda_*.cpp). Exact-vs-tolerance notes are in docs/cuda.md.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/sampling.h"
#include "core/weight.h"

struct CUstream_st;      // cudaStream_t is CUstream_st*
struct CUgraphExec_st;  // cudaGraphExec_t is CUgraphExec_st*

namespace dsv4::gpu {

using Stream = CUstream_st*;

// Where a per-sequence kernel finds one of a sequence's cache buffers when a step graph serves
// whatever sequences its rows hold (docs/cuda.md "One graph per batch bucket"): `table` is a
// device array of per-row pointers, each to a device array of that sequence's buffer addresses
// (its descriptor), and the buffer is table[row][field]. Both levels are read by the kernel at
// run time, so a replay follows the table the step's upload filled, not the addresses seen at
// capture. Null table: the kernel uses the pointer passed directly.
struct SeqRef {
  const void* const* const* table = nullptr;
  int32_t row = 0, field = 0;
  bool set() const { return table != nullptr; }
};

// ================================================================ device, memory

// True when the CUDA runtime loads and reports at least one device (cudaGetDeviceCount). Never
// throws; the answer is computed once.
bool device_available();
// One line: "NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.1 GiB" or why no device is usable.
std::string device_summary();

void synchronize(Stream stream = nullptr);  // waits for the stream; throws on a pending fault
Stream create_stream();                     // non-blocking stream
void destroy_stream(Stream stream);

// Owning device allocation (cudaMalloc / cudaFree). Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }

  // Synchronous copies (cudaMemcpy) of n bytes at byte `offset`; throw on a range error.
  void upload(const void* src, size_t n, size_t offset = 0);
  void download(void* dst, size_t n, size_t offset = 0) const;
  void fill_zero();                 // synchronous memset 0
  void fill_bytes(int value);       // synchronous memset to a byte value (tests poison with 0xFF)

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <class T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

template <class T>
std::vector<T> to_host(const DeviceBuffer& b, size_t count) {
  std::vector<T> v(count);
  if (count) b.download(v.data(), count * sizeof(T));
  return v;
}

// ================================================================ graphs (graph.cu)

// Page-locked host memory (cudaMallocHost / cudaFreeHost), move-only: the host side of copies a
// graph may replay (a captured copy from pageable memory is refused by CUDA).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Stream-ordered copy of n bytes (either side device or pinned host; cudaMemcpyDefault) and
// memset 0. Return without waiting.
void copy_async(void* dst, const void* src, size_t n, Stream stream);
void zero_async(void* dst, size_t n, Stream stream);

// An instantiated CUDA graph (cudaGraphExec_t), move-only.
class Graph {
 public:
  Graph() = default;
  explicit Graph(CUgraphExec_st* exec) : exec_(exec) {}
  ~Graph();
  Graph(Graph&& o) noexcept : exec_(o.exec_) { o.exec_ = nullptr; }
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  bool empty() const { return exec_ == nullptr; }
  void launch(Stream stream) const;  // replays every captured node on `stream`, in order

 private:
  CUgraphExec_st* exec_ = nullptr;
};

// Work enqueued on `stream` (a created stream, not the legacy one) between begin_capture and
// end_capture is recorded instead of run; end_capture instantiates it. A forbidden call inside
// (allocation, synchronisation, pageable copy) throws there and makes end_capture throw.
// abort_capture ends a capture left open by an exception (no-op otherwise).
void begin_capture(Stream stream);
Graph end_capture(Stream stream);
void abort_capture(Stream stream);

// ================================================================ weights

// A weight [rows, cols] in device memory in its stored encoding (core/weight.h), rows `pitch`
// bytes apart. Non-owning; what the kernels take.
struct WeightView {
  WFormat fmt = WFormat::F32;
  int64_t rows = 0, cols = 0;
  int64_t pitch = 0;                // bytes between rows of the payload
  const uint8_t* data = nullptr;    // payload
  const uint8_t* scale = nullptr;   // block scales as stored, row-major, scale_cols per row
  int64_t scale_cols = 0;
  float scale2 = 1.0f;              // NVFP4 global scale
};

// An uploaded QWeight. The bytes are the checkpoint's bytes, not dequantised: payload rows
// (F32 / BF16 / F16 values, E4M3 codes, packed E2M1 pairs) and the scale tensor unchanged (FP8Block:
// E8M0 [ceil(rows/128), ceil(cols/128)]; MXFP4: E8M0 [rows, ceil(cols/32)]; NVFP4: E4M3
// [rows, ceil(cols/16)] + the float scale2). The only change: each payload row starts on a
// 16-byte boundary (pitch = stored row bytes rounded up to 16, the pad zeroed), which is the
// stored layout itself for every real checkpoint (cols a multiple of 128).
struct DeviceWeight {
  WFormat fmt = WFormat::F32;
  int64_t rows = 0, cols = 0, pitch = 0, scale_cols = 0;
  float scale2 = 1.0f;
  std::string name;
  DeviceBuffer data, scale;

  WeightView view() const;
  size_t device_bytes() const { return data.bytes() + scale.bytes(); }
};

DeviceWeight upload_weight(const QWeight& w);

// A float32 matrix already on the device viewed as a weight [rows, cols] with `ld` floats per
// row (mHC mixers, tests). ld * 4 and the pointer must be multiples of 16 bytes (checked).
WeightView f32_view(const float* dev, int64_t rows, int64_t cols, int64_t ld);

// ================================================================ matmul (cpu/qmatmul.h)

// y[t*ldy + (r - r0)] = sum_c W[r, c] * x[t*ldx + c] for r in [r0, r1), t < T: exactly
// qmatmul's contract. x, y device. T <= qmatmul_gemv_max_tokens() runs the decode kernel (weights
// streamed once, decoded in registers), larger T the tiled kernel (weight tile decoded into
// shared memory, reused over a token tile). Both accumulate every output in the same canonical
// order (docs/cuda.md), so an output is bit-identical whatever T, the token's place in the batch,
// [r0, r1), the strides and the path. Decoded values equal dequant_row's bit for bit, except
// E4M3 NaN codes (0x7F/0xFF decode as +-480, as in the CPU qmatmul).
void qmatmul(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y,
             int64_t ldy, Stream stream = nullptr);
inline void qmatmul(const DeviceWeight& w, const float* x, int64_t T, float* y, Stream stream = nullptr) {
  qmatmul(w.view(), 0, w.rows, x, w.cols, T, y, w.rows, stream);
}
// Largest T for the decode kernel (default 16). 0 sends every T to the tiled kernel; a negative
// value restores the default. For tests and benchmarks.
void set_qmatmul_gemv_max_tokens(int t);
int qmatmul_gemv_max_tokens();

// ================================================================ elementwise (model/ops.h, moe.h)

// y = w * x / sqrt(mean(x^2) + eps) per row of n values (rmsnorm); w device or null (no weight).
// Sum of squares in double, as inv_rms. In place (x == y, same ld) allowed.
void rmsnorm(const float* x, int64_t ldx, const float* w, int64_t rows, int64_t n, double eps, float* y, int64_t ldy,
             Stream stream = nullptr);

// RopeTable::apply on nvec vectors v[i*ld .. i*ld + n): the last rope_dim values, interleaved pairs,
// rotated by pos[i / vecs_per_pos] * freq (inverse: by minus that). freq: device [rope_dim/2]
// (RopeTable::freq uploaded); pos: device int32. Angle float32 pos*freq, cos/sin in double, as
// RopeTable::at.
void rope(float* v, int64_t nvec, int64_t n, int64_t ld, const float* freq, int64_t rope_dim, const int32_t* pos,
          int64_t vecs_per_pos, bool inverse, Stream stream = nullptr);

// swiglu_clamped per row: g = silu(min(g, lim)) * clamp(u, -lim, lim) * row_w[row] (lim > 0; no
// clamp when lim <= 0). row_w device [rows] or null (weight 1). Result in g.
void swiglu_clamped(float* g, int64_t ldg, const float* u, int64_t ldu, int64_t rows, int64_t n, float lim,
                    const float* row_w, Stream stream = nullptr);

// out[(t*copies + i) * cols + c] = table[tokens[t], c] for i < copies (dequant_row of the token's
// row, repeated: copies = hc for the residual stream). tokens device [T]. An id outside
// [0, rows) writes NaN rows (the host validates ids before upload; the kernel cannot throw).
void embed(const WeightView& table, const int32_t* tokens, int64_t T, int64_t copies, float* out,
           Stream stream = nullptr);

// fp8sim / fp4sim (core/formats.h) on the first n values of each row (n % block == 0).
void fp8sim_rows(float* x, int64_t rows, int64_t n, int64_t ld, int64_t block, Stream stream = nullptr);
void fp4sim_rows(float* x, int64_t rows, int64_t n, int64_t ld, int64_t block, Stream stream = nullptr);
// hadamard (ops.h) on the first n values of each row; n a power of two, n <= 8192.
void hadamard_rows(float* x, int64_t rows, int64_t n, int64_t ld, Stream stream = nullptr);
// y = a + b elementwise over n floats (y may alias a or b).
void add(const float* a, const float* b, float* y, int64_t n, Stream stream = nullptr);

// ================================================================ rows (the MoE dispatch, model/cpu_backend.cpp)

// y[r*ldy + c] = x[idx[r]*ldx + c] for r < n, c < cols (idx device int32).
void gather_rows(const float* x, int64_t ldx, const int32_t* idx, int64_t n, int64_t cols, float* y, int64_t ldy,
                 Stream stream = nullptr);
// out[idx[r]*ldo + c] += y[r*ldy + c] for r < n, c < cols; the idx[r] of one call must be
// distinct (an expert serves a token once). One float add per element, as the CPU's `+=`.
void scatter_add_rows(const float* y, int64_t ldy, const int32_t* idx, int64_t n, int64_t cols, float* out, int64_t ldo,
                      Stream stream = nullptr);
// x[i] *= s for i < n (one float multiply, as the CPU's `v *= s`).
void scale(float* x, int64_t n, float s, Stream stream = nullptr);

// ================================================================ sampling

// out[r] = index of the largest of x[r*ld .. r*ld + n) (the first one on ties, as the greedy
// sampler's std::max_element). One block per row. NaNs are never chosen unless all are NaN.
void argmax_rows(const float* x, int64_t rows, int64_t n, int64_t ld, int32_t* out, Stream stream = nullptr);

// Sampling on the device: out[r] = sample_logits(x[r*ld .. r*ld + n), params[r]) (core/sampling.h)
// for every row, the same double operations in the same order (on a GPU the device exp may
// differ from the host's libm in the last bit: docs/cuda.md). params: device [rows]. Each row's
// candidates (sample_candidates(params[r], n)) must be at most sample_max_candidates(n) — the
// caller checks on the host (the parameters are host values before they are uploaded). Scratch:
// idx [rows * sample_max_candidates(n)] int32, count [rows] int32, prob [rows *
// sample_max_candidates(n)] double.
int64_t sample_max_candidates(int64_t n);  // min(n, 4096): topk_rows' limit
void sample_rows(const float* x, int64_t rows, int64_t n, int64_t ld, const SampleRow* params, int32_t* idx, int32_t* count,
                 double* prob, int32_t* out, Stream stream = nullptr);

// ================================================================ MoE on the device (moe.cu)
// A decode step's routed experts with no host read of the routing: route() writes ids [T, k] and
// weights on the device, qmatmul_experts runs each (token, slot) through its expert's matrix,
// swiglu_clamped scales each slot by its weight, moe_combine adds the slots per token.

// One kind of matrix (w1, w3 or w2) of a layer's routed experts: a device array of their views,
// all of one format and shape.
struct ExpertTable {
  const WeightView* views = nullptr;  // device [count]
  int64_t count = 0, rows = 0, cols = 0;
  WFormat fmt = WFormat::F32;
};
struct DeviceExpertTable {
  DeviceBuffer views;
  ExpertTable table;
};
// Throws when the experts differ in format or shape.
DeviceExpertTable make_expert_table(const std::vector<const DeviceWeight*>& experts);

// y[s * ldy + r] = table[ids[s]][r, :] . x[(s / x_div) * ldx ..] for slots s < slots (ids device):
// the decode kernel's canonical order, so each output equals qmatmul's bit for bit.
void qmatmul_experts(const ExpertTable& t, const int32_t* ids, int64_t slots, const float* x, int64_t ldx, int64_t x_div,
                     float* y, int64_t ldy, Stream stream = nullptr);
// f[t, :] = 0 + y[t*k + j0, :] + y[t*k + j1, :] + ... with the slots j in ascending ids[t*k + j]
// (ties by slot): the CPU's zero_f + scatter_add per expert in ascending id, bit for bit.
// y [T*k, D], f [T, D].
void moe_combine(const float* y, const int32_t* ids, int64_t T, int64_t k, int64_t D, float* f, Stream stream = nullptr);

// ================================================================ mHC (model/mhc.h, forward.cpp hc_head)

// An mHC mixer on the device: fn [rows, width] F32, base [rows], scale [3] (hc_head uses scale[0]).
struct DeviceHcMix {
  int64_t rows = 0, width = 0;
  DeviceBuffer fn, base, scale;
};
DeviceHcMix upload_hc_mix(const std::vector<float>& fn, const std::vector<float>& base, const std::vector<float>& scale,
                          int64_t rows, int64_t width);

// hc_pre for X [T, hc, D]: x [T, D], post [T, hc], comb [T, hc, hc]. mixes: device scratch of
// T * (2 + hc) * hc floats. hc <= 16.
void hc_pre(const DeviceHcMix& mix, const float* X, int64_t T, int64_t hc, int64_t D, int sinkhorn_iters, double eps,
            double hc_eps, float* mixes, float* x, float* post, float* comb, Stream stream = nullptr);
// hc_post: X'_j = post_j * f + sum_i C_ij X_i, in place on X [T, hc, D].
void hc_post(const float* f, const float* post, const float* comb, float* X, int64_t T, int64_t hc, int64_t D,
             Stream stream = nullptr);
// hc_head before the final norm (Model::forward): y [T, D] = sum_i p_i X_i with
// p_i = sigmoid(m_i * rs * scale[0] + base[i]) + hc_eps. mixes: scratch of T * hc floats.
void hc_head(const DeviceHcMix& head, const float* X, int64_t T, int64_t hc, int64_t D, double eps, double hc_eps,
             float* mixes, float* y, Stream stream = nullptr);

// ================================================================ MoE routing (model/moe.h)

// route_token for each token t < T of logits [T, E] (device): a = sqrt(softplus(logits));
// experts = tid2eid[tokens[t] * k + j] (hash layer: tid2eid and tokens device, non-null) or the
// top k of a + bias (bias device or null; ties to the lower id); weights = a_e / sum a * scale.
// ids [T, k] int32 and weights [T, k] device. k <= 32.
void route(const float* logits, int64_t T, int64_t E, int64_t k, const float* bias, const int32_t* tid2eid,
           const int32_t* tokens, double scale, int32_t* ids, float* weights, Stream stream = nullptr);

// ================================================================ KV codecs (kv/codec.h)

// Byte layouts identical to KvCodec / Fp4Codec (a CPU-encoded cache uploads as is). Vectors sit
// `stride` bytes apart (>= the codec's bytes).
size_t kv_codec_bytes(int64_t dim, int64_t rope);
size_t fp4_codec_bytes(int64_t dim);
// Encode rows of v [rows, ldv] into out + row*stride. KvCodec: dim - rope a multiple of 64;
// Fp4Codec: dim a multiple of 32.
void kv_encode(const float* v, int64_t rows, int64_t ldv, int64_t dim, int64_t rope, uint8_t* out, int64_t stride,
               Stream stream = nullptr);
void kv_decode(const uint8_t* in, int64_t rows, int64_t stride, int64_t dim, int64_t rope, float* v, int64_t ldv,
               Stream stream = nullptr);
void fp4_encode(const float* v, int64_t rows, int64_t ldv, int64_t dim, uint8_t* out, int64_t stride,
                Stream stream = nullptr);
void fp4_decode(const uint8_t* in, int64_t rows, int64_t stride, int64_t dim, float* v, int64_t ldv,
                Stream stream = nullptr);
// The window ring update after a chunk's attention (Model::attention's last loop): rows t of
// kv [T, ldv] with t >= T - slots are KvCodec-encoded into ring slot pos[t] % slots. slots: the
// ring's length, the window or more (the CUDA backend keeps window + kRewind, so a rewind of up
// to kRewind positions finds its window intact, as kv/state.h's ring).
// ring_ref, when set, names the ring instead of `ring` (SeqRef).
void kv_encode_ring(const float* kv, int64_t T, int64_t ldv, int64_t dim, int64_t rope, const int32_t* pos,
                    int64_t slots, uint8_t* ring, int64_t stride, Stream stream = nullptr, SeqRef ring_ref = {});

// ================================================================ sparse attention (model/attention.h)

// One chunk of T queries at positions pos[t] = pos[0] + t (device). For the query at p = pos[t],
// the visible keys are, in this order:
//   window: positions max(0, p - window + 1) .. p; a position >= pos[0] is row (q - pos[0]) of
//           chunk_kv (this chunk's keys), an earlier one is slot q % ring_slots of ring;
//   compressed (ratio > 0): sel == null: entries 0 .. (p+1)/ratio - 1; else the sel_n[t] entry
//           indices sel[t * ld_sel + i] (the indexer's top-k).
// Every cached vector is KvCodec bytes (dim d, rope dims) `kv_stride` apart. Then, as
// attend_heads: out[t, h] = sum_j p_hj K_j with p_hj = exp(q_h.K_j * scale) /
// (sum_j' exp(q_h.K_j' * scale) + exp(sink[h])). d a multiple of 32, d <= 512.
struct SparseAttention {
  const float* q = nullptr;    // [T, H, d]
  int64_t T = 0, H = 0, d = 0, rope = 0;
  const int32_t* pos = nullptr;
  const uint8_t* chunk_kv = nullptr;  // [T] vectors
  const uint8_t* ring = nullptr;      // [ring_slots] vectors
  int64_t window = 0;
  int64_t ring_slots = 0;             // the ring's length (>= window); 0: window
  const uint8_t* entries = nullptr;   // compressed entries
  int64_t ratio = 0;
  const int32_t* sel = nullptr;       // [T, ld_sel] or null
  const int32_t* sel_n = nullptr;     // [T] (with sel)
  int64_t ld_sel = 0;
  int64_t kv_stride = 0;              // bytes
  const float* sink = nullptr;        // [H]
  float scale = 1.0f;
  float* out = nullptr;               // [T, H, d]
  SeqRef ring_ref, entries_ref;       // when set, name ring / entries instead (SeqRef)
};
void sparse_attention(const SparseAttention& a, Stream stream = nullptr);

// Indexer scores, the CPU's (kernels/cpu/indexer_scores.h) bit for bit, in its order:
// scores[t * ld + b] = sum_h w[t, h] * relu(q[t, h] . K_b)
// for b < vis = min((pos[t]+1)/ratio, n), -inf for the other b < n; n_visible[t] = vis (device,
// may be null) feeds topk_rows. q [T, HI, dI], w [T, HI], keys Fp4Codec bytes `key_stride` apart.
// dI a multiple of 32; HI * (dI + 1) floats must fit in shared memory (checked). keys_ref, when
// set, names the keys instead of `keys` (SeqRef).
void indexer_scores(const float* q, const float* w, int64_t T, int64_t HI, int64_t dI, const uint8_t* keys,
                    int64_t key_stride, const int32_t* pos, int64_t ratio, int64_t n, float* scores, int64_t ld,
                    int32_t* n_visible, Stream stream = nullptr, SeqRef keys_ref = {});

// topk (ops.h) per row: idx[r * k + i], i < count[r] = min(k, m) with m = n_valid[r] (device,
// clamped to [0, n]) or n (n_valid null): the indices of the m-prefix's largest values in
// descending order, ties to the lower index (-0 == +0). Unused idx slots are -1. k <= 4096.
void topk_rows(const float* v, int64_t rows, int64_t n, int64_t ld, const int32_t* n_valid, int64_t k, int32_t* idx,
               int32_t* count, Stream stream = nullptr);

// ================================================================ compressor (model/compressor.h)

// compress() for one chunk of T positions pos[t] = pos[0] + t. Inputs a = wkv.x and s = wgate.x
// ([T, width], width = (ratio == 4 ? 2 : 1) * dout; qmatmul beforehand; ape NOT added). Each
// block b closing at a position of the chunk is pooled (softmax over positions per channel;
// ratio 4 overlaps the previous block through channels [0, dout)), RMSNorm'd, RoPE'd at b*ratio,
// then fp8sim'd (main: the first dout - rope values, block 64) or Hadamard + fp4sim'd
// (indexer), and written encoded at entries + b * entry_stride (KvCodec or Fp4Codec bytes;
// skipped when b >= capacity). Rows of positions before the chunk come from the state ring
// (ring_a, ring_s: [ring_rows, width], slot q % ring_rows, ring_rows = Compressor::ring_rows, at
// least compressor_ring_rows(ratio); s with ape added), which this call then updates. A new sequence starts at pos 0: the ring's
// contents are never read for positions < 0, so it needs no clearing.
struct Compressor {
  const float* a = nullptr;
  const float* s = nullptr;
  int64_t T = 0;
  const int32_t* pos = nullptr;
  int64_t ratio = 0, dout = 0, rope = 0;
  const float* ape = nullptr;    // [ratio, width]
  const float* norm = nullptr;   // [dout]
  double eps = 1e-6;
  const float* freq = nullptr;   // [rope/2] the layer's RoPE table
  bool indexer = false;
  float* ring_a = nullptr;
  float* ring_s = nullptr;
  uint8_t* entries = nullptr;
  int64_t entry_stride = 0, capacity = 0;
  // The ring's length: 0 = compressor_ring_rows(ratio), the rows a block's pooling needs; the
  // CUDA backend adds kRewind rows, so a rewind of up to kRewind positions can reopen a block.
  int64_t ring_rows = 0;
  SeqRef ring_a_ref, ring_s_ref, entries_ref;  // when set, name ring_a / ring_s / entries instead (SeqRef)
};
// The rows the pooling needs: ratio, or 2 * ratio for the overlapping ratio 4.
int64_t compressor_ring_rows(int64_t ratio);
void compress(const Compressor& c, Stream stream = nullptr);

}  // namespace dsv4::gpu
