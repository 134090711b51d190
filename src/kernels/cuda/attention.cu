// Sparse attention with sink over the window + compressed entries, read straight from the
// compact KV layout; the CSA indexer's scores and a top-k (model/attention.cpp, forward.cpp).
#include "kernels/cuda/common.cuh"

namespace dsv4::gpu {
namespace {

// ================================================================ sparse attention

constexpr int kAttnHeads = 4;    // heads (warps) per block
constexpr int kAttnTile = 8;     // keys decoded per shared-memory tile
constexpr int kAttnMaxPL = 16;   // values per lane: d <= 512

// The bytes of visible key j of the query at position p (see SparseAttention for the order).
__device__ __forceinline__ const uint8_t* attn_key(const SparseAttention& a, int64_t t, int64_t p, int64_t p0,
                                                   int64_t first, int64_t nwin, int64_t j) {
  if (j < nwin) {
    const int64_t q = first + j;
    const int64_t slots = a.ring_slots > 0 ? a.ring_slots : a.window;
    return q >= p0 ? a.chunk_kv + (q - p0) * a.kv_stride : a.ring + (q % slots) * a.kv_stride;
  }
  const int64_t e = a.sel ? a.sel[t * a.ld_sel + (j - nwin)] : j - nwin;
  return a.entries + e * a.kv_stride;
}

// Block (t, head group): one warp per head, online softmax (running max m, denominator l, output
// accumulator) started from the sink: m = sink, l = exp(sink - sink) = 1, acc = 0. Keys are
// decoded kAttnTile at a time into shared memory and shared by the block's heads.
__global__ void __launch_bounds__(kAttnHeads * 32) sparse_attention_kernel(SparseAttention a) {
  __shared__ float ks[kAttnTile][kAttnMaxPL * 32];
  a.ring = seq_buffer(a.ring_ref, a.ring);
  a.entries = seq_buffer(a.entries_ref, a.entries);
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t h = static_cast<int64_t>(blockIdx.y) * kAttnHeads + warp;
  const bool live = h < a.H;
  const int d = static_cast<int>(a.d), pl = d / 32, nope = static_cast<int>(a.d - a.rope);

  const int64_t p0 = a.pos[0], p = a.pos[t];
  const int64_t first = p - a.window + 1 > 0 ? p - a.window + 1 : 0;
  const int64_t nwin = p - first + 1;
  int64_t ncomp = 0;
  if (a.ratio > 0) {
    if (a.sel) {
      ncomp = a.sel_n[t];
      ncomp = ncomp < 0 ? 0 : ncomp > a.ld_sel ? a.ld_sel : ncomp;
    } else {
      ncomp = (p + 1) / a.ratio;
    }
  }
  const int64_t n = nwin + ncomp;

  float q[kAttnMaxPL], acc[kAttnMaxPL];
  const float* qh = a.q + (t * a.H + (live ? h : 0)) * a.d;
#pragma unroll
  for (int i = 0; i < kAttnMaxPL; ++i) {
    q[i] = i < pl ? qh[i * 32 + lane] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = live ? a.sink[h] : 0.0f, l = 1.0f;

  for (int64_t j0 = 0; j0 < n; j0 += kAttnTile) {
    const int nk = n - j0 < kAttnTile ? static_cast<int>(n - j0) : kAttnTile;
    __syncthreads();  // the previous tile has been consumed
    for (int i = threadIdx.x; i < nk * d; i += blockDim.x) {
      const int kk = i / d, c = i % d;
      ks[kk][c] = kv_elem(attn_key(a, t, p, p0, first, nwin, j0 + kk), nope, c);
    }
    __syncthreads();
    for (int kk = 0; kk < nk; ++kk) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kAttnMaxPL; ++i)
        if (i < pl) dot = fmaf(q[i], ks[kk][i * 32 + lane], dot);
      const float s = warp_sum(dot) * a.scale;
      const float mn = s > m ? s : m;
      const float corr = expf(m - mn), e = expf(s - mn);
      l = l * corr + e;
#pragma unroll
      for (int i = 0; i < kAttnMaxPL; ++i)
        if (i < pl) acc[i] = acc[i] * corr + e * ks[kk][i * 32 + lane];
      m = mn;
    }
  }
  if (live) {
    float* o = a.out + (t * a.H + h) * a.d;
    const float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < kAttnMaxPL; ++i)
      if (i < pl) o[i * 32 + lane] = acc[i] * inv;
  }
}

// ================================================================ indexer scores

constexpr int kIdxWarps = 8;
constexpr int kIdxPerWarp = 8;  // entries per warp per block

// Block (t, entry tile). Shared: q_t [HI][dI + 1] (padded: lane h reads row h conflict-free),
// w_t [HI], per warp one decoded key [dI] and its heads' relu'd dots [HI]. Lane l computes
// heads l, l + 32, ...: each dot one fma chain over the columns; then lane 0 chains
// fma(w_h, relu_h, score) over h in order -- the CPU's order (kernels/cpu/indexer_scores.h), so
// the scores are the CPU's floats bit for bit.
__global__ void __launch_bounds__(kIdxWarps * 32)
    indexer_scores_kernel(const float* __restrict__ q, const float* __restrict__ w, int64_t HI, int64_t dI,
                          const uint8_t* __restrict__ keys, int64_t key_stride, const int32_t* __restrict__ pos,
                          int64_t ratio, int64_t n, float* scores, int64_t ld, int32_t* n_visible, SeqRef keys_ref) {
  DSV4_EXTERN_SHARED(float, sm);
  keys = seq_buffer(keys_ref, keys);
  const int64_t qld = dI + 1;
  float* qs = sm;
  float* ws = qs + HI * qld;
  float* kb = ws + HI;
  float* rb = kb + kIdxWarps * dI;
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t vis = (static_cast<int64_t>(pos[t]) + 1) / ratio;
  vis = vis > n ? n : vis;
  if (n_visible && blockIdx.y == 0 && threadIdx.x == 0) n_visible[t] = static_cast<int32_t>(vis);
  const int64_t b0 = static_cast<int64_t>(blockIdx.y) * kIdxWarps * kIdxPerWarp;
  const bool any = b0 < vis;
  if (any) {
    for (int64_t i = threadIdx.x; i < HI * dI; i += blockDim.x) qs[(i / dI) * qld + i % dI] = q[t * HI * dI + i];
    for (int64_t i = threadIdx.x; i < HI; i += blockDim.x) ws[i] = w[t * HI + i];
  }
  __syncthreads();
  float* kw = kb + warp * dI;
  float* rw = rb + warp * HI;
  for (int e = 0; e < kIdxPerWarp; ++e) {
    const int64_t b = b0 + warp * kIdxPerWarp + e;
    if (b >= n) break;
    if (b >= vis) {
      if (lane == 0) scores[t * ld + b] = -INFINITY;
      continue;
    }
    const uint8_t* kp = keys + b * key_stride;
    for (int64_t c = lane; c < dI; c += 32) kw[c] = fp4_elem(kp, static_cast<int>(dI), static_cast<int>(c));
    __syncwarp();
    for (int64_t hh = lane; hh < HI; hh += 32) {
      const float* qr = qs + hh * qld;
      float dot = 0.0f;
      for (int64_t c = 0; c < dI; ++c) dot = fmaf(qr[c], kw[c], dot);
      rw[hh] = dot > 0.0f ? dot : 0.0f;  // NaN and -0 give +0
    }
    __syncwarp();
    if (lane == 0) {
      float s = 0.0f;
      for (int64_t h = 0; h < HI; ++h) s = fmaf(ws[h], rw[h], s);
      scores[t * ld + b] = s;
    }
    __syncwarp();  // kw and rw are rewritten for the next entry
  }
}

// ================================================================ top-k

constexpr int kTopkThreads = 1024;
constexpr int kTopkMaxK = 4096;

// Order-preserving map float -> uint32 (larger float, larger key); -0 counts as +0 and NaN is
// below -inf: core/rank_key.h's order, reversed (a device twin of rank_key; the two are compared
// in CudaModel.TopKRowsEqualsCpuTopK).
__device__ __forceinline__ uint32_t order_key(float v) {
  if (isnan(v)) return 0u;
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Unique 64-bit rank of element i: value first, then the lower index wins.
__device__ __forceinline__ unsigned long long composite(const float* v, int64_t i) {
  return (static_cast<unsigned long long>(order_key(v[i])) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}

// One block per row: (1) radix-select, 8 bits at a time from the top, the prefix that exactly k
// composites reach (unique composites make the selected set exactly the top k); (2) gather the
// selected composites; (3) bitonic-sort them descending; (4) write their indices.
__global__ void __launch_bounds__(kTopkThreads)
    topk_kernel(const float* __restrict__ v, int64_t n, int64_t ld, const int32_t* __restrict__ n_valid, int k,
                int32_t* idx, int32_t* count) {
  __shared__ unsigned long long sel[kTopkMaxK];
  __shared__ unsigned int hist[256];
  __shared__ unsigned long long s_prefix;
  __shared__ int s_need, s_shift, s_done;
  __shared__ unsigned int s_n;
  const int64_t row = blockIdx.x;
  const float* vr = v + row * ld;
  int64_t m = n;
  if (n_valid) {
    m = n_valid[row];
    m = m < 0 ? 0 : m > n ? n : m;
  }
  const int kk = static_cast<int>(m < k ? m : k);

  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_need = k;
    s_shift = 64;  // selection rule: (c >> s_shift) >= (s_prefix >> s_shift); 64 = everything
    s_done = m <= k;
    s_n = 0;
  }
  __syncthreads();
  for (int shift = 56; shift >= 0 && !s_done; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    const unsigned long long prefix = s_prefix;
    for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
      const unsigned long long c = composite(vr, i);
      if (shift == 56 || ((c ^ prefix) >> (shift + 8)) == 0) atomicAdd(&hist[(c >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // The digit where the running count (from the top) reaches the remaining need.
      int need = s_need;
      unsigned int cum = 0;
      int dsel = 0;
      for (int dgt = 255; dgt >= 0; --dgt) {
        if (cum + hist[dgt] >= static_cast<unsigned int>(need)) {
          dsel = dgt;
          break;
        }
        cum += hist[dgt];
      }
      need -= static_cast<int>(cum);
      s_prefix = prefix | (static_cast<unsigned long long>(dsel) << shift);
      s_need = need;
      if (hist[dsel] == static_cast<unsigned int>(need)) {  // all of this digit's elements are in
        s_shift = shift;
        s_done = 1;
      }
    }
    __syncthreads();
  }
  const int shift = s_shift;
  const unsigned long long thr = shift >= 64 ? 0ull : (s_prefix >> shift);
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
    const unsigned long long c = composite(vr, i);
    if (shift >= 64 || (c >> shift) >= thr) {
      const unsigned int at = atomicAdd(&s_n, 1u);
      if (at < static_cast<unsigned int>(kTopkMaxK)) sel[at] = c;
    }
  }
  __syncthreads();
  int P = 1;
  while (P < kk) P <<= 1;
  for (int i = kk + threadIdx.x; i < P; i += blockDim.x) sel[i] = 0ull;  // sorts last
  __syncthreads();
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < P; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const unsigned long long x = sel[i], y = sel[j];
          const bool desc = (i & size) == 0;
          if (desc ? x < y : x > y) {
            sel[i] = y;
            sel[j] = x;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < k; i += blockDim.x)
    idx[row * k + i] = i < kk ? static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(sel[i] & 0xFFFFFFFFull)) : -1;
  if (threadIdx.x == 0) count[row] = kk;
}

}  // namespace

void sparse_attention(const SparseAttention& a, Stream stream) {
  const char* op = "sparse_attention";
  if (a.d <= 0 || a.d % 32 != 0 || a.d > 32 * kAttnMaxPL) bad_arg(op, "d must be a multiple of 32, at most 512");
  if (a.rope < 0 || (a.d - a.rope) % 64 != 0) bad_arg(op, "d - rope must be a multiple of 64");
  if (a.window <= 0) bad_arg(op, "window must be positive");
  if (a.ring_slots != 0 && a.ring_slots < a.window) bad_arg(op, "ring_slots must be 0 or at least the window");
  if (a.kv_stride < static_cast<int64_t>(kv_codec_bytes(a.d, a.rope))) bad_arg(op, "kv_stride too small");
  if (a.ratio < 0) bad_arg(op, "negative ratio");
  if (a.sel && (!a.sel_n || a.ld_sel <= 0)) bad_arg(op, "sel needs sel_n and ld_sel");
  if (!a.q || !a.pos || !a.chunk_kv || (!a.ring && !a.ring_ref.set()) || !a.sink || !a.out ||
      (a.ratio > 0 && !a.entries && !a.entries_ref.set()))
    bad_arg(op, "missing pointer");
  if (a.T <= 0 || a.H <= 0) return;
  const dim3 grid(static_cast<unsigned>(a.T), static_cast<unsigned>(ceil_div(a.H, kAttnHeads)));
  DSV4_LAUNCH(grid, kAttnHeads * 32, 0, stream, sparse_attention_kernel)(a);
  DSV4_CUDA_LAUNCHED("sparse_attention_kernel");
}

void indexer_scores(const float* q, const float* w, int64_t T, int64_t HI, int64_t dI, const uint8_t* keys,
                    int64_t key_stride, const int32_t* pos, int64_t ratio, int64_t n, float* scores, int64_t ld,
                    int32_t* n_visible, Stream stream, SeqRef keys_ref) {
  const char* op = "indexer_scores";
  if (dI <= 0 || dI % 32 != 0 || HI <= 0 || ratio <= 0) bad_arg(op, "bad shape");
  if (key_stride < static_cast<int64_t>(fp4_codec_bytes(dI))) bad_arg(op, "key_stride too small");
  if (ld < n) bad_arg(op, "ld < n");
  const size_t smem = sizeof(float) * static_cast<size_t>(HI * (dI + 1) + HI + kIdxWarps * (dI + HI));
  static constexpr size_t kMaxSmem = 227 * 1024;
  if (smem > kMaxSmem) bad_arg(op, "HI x dI too large for shared memory");
  if (T <= 0) return;
  if (smem > 48 * 1024)
    DSV4_CUDA_CHECK(cudaFuncSetAttribute(indexer_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  const int64_t tiles = n > 0 ? ceil_div(n, kIdxWarps * kIdxPerWarp) : 1;
  if (tiles > 65535) bad_arg(op, "too many entries for one launch");
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(tiles));
  DSV4_LAUNCH(grid, kIdxWarps * 32, smem, stream, indexer_scores_kernel)(q, w, HI, dI, keys, key_stride, pos, ratio, n, scores,
                                                                ld, n_visible, keys_ref);
  DSV4_CUDA_LAUNCHED("indexer_scores_kernel");
}

void topk_rows(const float* v, int64_t rows, int64_t n, int64_t ld, const int32_t* n_valid, int64_t k, int32_t* idx,
               int32_t* count, Stream stream) {
  if (k <= 0 || k > kTopkMaxK) bad_arg("topk_rows", "k must be in [1, 4096]");
  if (n < 0 || n > 0x7FFFFFFF) bad_arg("topk_rows", "n out of range");
  if (rows <= 0) return;
  DSV4_LAUNCH(static_cast<unsigned>(rows), kTopkThreads, 0, stream, topk_kernel)(v, n, ld, n_valid, static_cast<int>(k), idx,
                                                                         count);
  DSV4_CUDA_LAUNCHED("topk_kernel");
}

}  // namespace dsv4::gpu
