// Quantised matmul over stored weights (cuda_ops.h qmatmul), two kernels with one canonical
// summation order.
//
// Canonical order of an output y(r, t) (both kernels follow it, so results are bit-identical
// whatever the batch, the row range, the strides or the kernel):
//   - the columns form groups of 4 (group g = columns 4g .. 4g+3);
//   - "lane" l = 0..31 owns the groups g with g % 32 == l and accumulates
//       P_l = fma(W[r,c], x[t,c], P_l) over its groups in ascending order, columns ascending
//     inside a group, starting from +0 (columns >= cols skipped), where W[r,c] is the decoded
//     value exactly as dequant_row computes it;
//   - y = the xor-butterfly sum of P_0..P_31 (offsets 16, 8, 4, 2, 1; commutative at every step,
//     so every lane holds the same bits).
// Decode kernel (qgemv): a warp owns R rows, lane l reads its group of each row (4-byte FP8,
// 2-byte FP4, 8-byte 16-bit, 16-byte F32 loads, contiguous across the warp), decodes in
// registers and applies it to NT tokens whose x tile sits in shared memory.
// Tiled kernel (qgemm): a block decodes a 32-row x 128-column weight tile into shared memory
// (128 columns = 32 groups = one group per lane) and multiplies it with a 16-token x tile; each
// lane keeps the partials P_l of its warp's 8x8 outputs. FP32 FMA, no tensor cores (v1).
#include <algorithm>
#include <atomic>

#include "kernels/cuda/common.cuh"

namespace dsv4::gpu {
namespace {

// ---------------------------------------------------------------- group decode

// Bytes one group of 4 columns occupies in the payload.
__host__ __device__ constexpr int group_bytes(WFormat f) {
  return f == WFormat::F32 ? 16 : (f == WFormat::BF16 || f == WFormat::F16) ? 8 : f == WFormat::FP8Block ? 4 : 2;
}

// Decodes group c0 / 4 (c0 a multiple of 4) of row r into v[0..3]. Columns past cols in the
// last group decode whatever the row pad holds; callers never use them.
template <WFormat F>
__device__ __forceinline__ void decode_group(const WeightView& w, int64_t r, int64_t c0, float v[4]) {
  const uint8_t* row = w.data + r * w.pitch;
  if constexpr (F == WFormat::F32) {
    const float4 q = __ldg(reinterpret_cast<const float4*>(row + c0 * 4));
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
  } else if constexpr (F == WFormat::BF16 || F == WFormat::F16) {
    const uint2 q = __ldg(reinterpret_cast<const uint2*>(row + c0 * 2));
    const uint32_t h[4] = {q.x & 0xFFFFu, q.x >> 16, q.y & 0xFFFFu, q.y >> 16};
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = F == WFormat::BF16 ? bf16_dec(h[j]) : f16_dec(h[j]);
  } else if constexpr (F == WFormat::FP8Block) {
    const uint32_t q = __ldg(reinterpret_cast<const unsigned int*>(row + c0));
    const float s = e8m0_dec(__ldg(w.scale + (r / 128) * w.scale_cols + c0 / 128));
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = e4m3_dec((q >> (8 * j)) & 0xFFu) * s;
  } else {  // MXFP4, NVFP4: two bytes, low nibble first
    const uint32_t q = __ldg(reinterpret_cast<const unsigned short*>(row + c0 / 2));
    if constexpr (F == WFormat::MXFP4) {
      const float s = e8m0_dec(__ldg(w.scale + r * w.scale_cols + c0 / 32));
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = e2m1_dec((q >> (4 * j)) & 0xFu) * s;
    } else {
      const float s = e4m3_dec(__ldg(w.scale + r * w.scale_cols + c0 / 16));
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = (e2m1_dec((q >> (4 * j)) & 0xFu) * s) * w.scale2;
    }
  }
}

// acc = fma(w[j], x[j], acc) for the first n (1..4) columns of a group, in order.
__device__ __forceinline__ float fma_group(const float w[4], const float4& x, float acc, int n) {
  if (n >= 4) {
    acc = fmaf(w[0], x.x, acc);
    acc = fmaf(w[1], x.y, acc);
    acc = fmaf(w[2], x.z, acc);
    acc = fmaf(w[3], x.w, acc);
  } else {
    acc = fmaf(w[0], x.x, acc);
    if (n > 1) acc = fmaf(w[1], x.y, acc);
    if (n > 2) acc = fmaf(w[2], x.z, acc);
  }
  return acc;
}

// ---------------------------------------------------------------- decode kernel

constexpr int kGemvWarps = 4;
constexpr int kGemvRows = 2;  // rows per warp

// Block: 4 warps x R rows. Tokens in groups of NT; per group, the columns in tiles of KT whose x
// values (NT x KT floats = 16 KiB) are staged in shared memory. Lane l handles tile group l, l+32,
// ... — since KT/4 is a multiple of 32, that is global group g with g % 32 == l, ascending.
// The body of one block (row block `rb` of [r0, r1)): shared by qgemv_kernel and the per-slot
// expert kernel (qgemv_experts_kernel), so both follow the canonical order bit for bit.
template <WFormat F, int NT>
__device__ __forceinline__ void qgemv_block(const WeightView& w, int64_t r0, int64_t r1, const float* __restrict__ x,
                                            int64_t ldx, int64_t T, float* __restrict__ y, int64_t ldy, int64_t rb) {
  constexpr int R = kGemvRows;
  constexpr int KT = 4096 / NT;  // columns per tile, a multiple of 128
  static_assert(KT % 128 == 0, "tile must hold whole rounds of 32 groups");
  __shared__ float4 xs[NT * KT / 4];
  float* xsf = reinterpret_cast<float*>(xs);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = r0 + (rb * kGemvWarps + warp) * R;
  const int64_t cols = w.cols;
  bool live[R];
#pragma unroll
  for (int i = 0; i < R; ++i) live[i] = row0 + i < r1;

  for (int64_t t0 = 0; t0 < T; t0 += NT) {
    const int nt = static_cast<int>(T - t0 < NT ? T - t0 : NT);
    float acc[R][NT];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[i][t] = 0.0f;

    for (int64_t k0 = 0; k0 < cols; k0 += KT) {
      __syncthreads();  // the previous tile has been consumed
      const int64_t kn = cols - k0 < KT ? cols - k0 : KT;
      for (int i = threadIdx.x; i < NT * KT; i += blockDim.x) {
        const int t = i / KT, c = i % KT;
        xsf[i] = (t < nt && c < kn) ? x[(t0 + t) * ldx + k0 + c] : 0.0f;
      }
      __syncthreads();
#pragma unroll 4
      for (int lg = lane; 4 * lg < kn; lg += 32) {
        const int64_t c0 = k0 + 4 * lg;
        const int n = cols - c0 < 4 ? static_cast<int>(cols - c0) : 4;
        float wv[R][4];
#pragma unroll
        for (int i = 0; i < R; ++i) {
          if (live[i]) {
            decode_group<F>(w, row0 + i, c0, wv[i]);
          } else {
            wv[i][0] = wv[i][1] = wv[i][2] = wv[i][3] = 0.0f;
          }
        }
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          const float4 xv = xs[t * (KT / 4) + lg];
#pragma unroll
          for (int i = 0; i < R; ++i) acc[i][t] = fma_group(wv[i], xv, acc[i][t], n);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float v = warp_sum(acc[i][t]);
        if (lane == ((i * NT + t) & 31) && live[i] && t < nt) y[(t0 + t) * ldy + (row0 + i - r0)] = v;
      }
  }
}

template <WFormat F, int NT>
__global__ void __launch_bounds__(kGemvWarps * 32) qgemv_kernel(WeightView w, int64_t r0, int64_t r1, const float* __restrict__ x,
                                                            int64_t ldx, int64_t T, float* __restrict__ y, int64_t ldy) {
  qgemv_block<F, NT>(w, r0, r1, x, ldx, T, y, ldy, blockIdx.x);
}

// Slot s = blockIdx.y: y[s * ldy ..] = table[ids[s]] . x[(s / x_div) * ldx ..], one token. The
// weight is chosen on the device (the MoE's routed experts: no host read of the routing).
template <WFormat F>
__global__ void __launch_bounds__(kGemvWarps * 32)
    qgemv_experts_kernel(const WeightView* __restrict__ table, const int32_t* __restrict__ ids, const float* __restrict__ x,
                         int64_t ldx, int64_t x_div, float* __restrict__ y, int64_t ldy) {
  const int64_t slot = blockIdx.y;
  const WeightView w = table[ids[slot]];
  qgemv_block<F, 1>(w, 0, w.rows, x + (slot / x_div) * ldx, ldx, 1, y + slot * ldy, ldy, blockIdx.x);
}

// ---------------------------------------------------------------- tiled kernel

constexpr int kBR = 32, kBT = 16, kKT = 128, kRR = 8, kTT = 8;

template <WFormat F>
__global__ void __launch_bounds__(256) qgemm_kernel(WeightView w, int64_t r0, int64_t r1, const float* __restrict__ x,
                                                    int64_t ldx, int64_t T, float* __restrict__ y, int64_t ldy) {
  static_assert(kKT == 128, "one group per lane per tile");
  __shared__ float4 ws[kBR][kKT / 4];  // decoded weights, 16 KiB
  __shared__ float4 xs[kBT][kKT / 4];  // activations, 8 KiB
  float* xsf = reinterpret_cast<float*>(&xs[0][0]);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wr = warp & 3, wt = warp >> 2;  // 4 row groups x 2 token groups of 8
  const int64_t rbase = r0 + static_cast<int64_t>(blockIdx.x) * kBR;
  const int64_t tbase = static_cast<int64_t>(blockIdx.y) * kBT;
  const int64_t cols = w.cols;

  float acc[kRR][kTT];
#pragma unroll
  for (int i = 0; i < kRR; ++i)
#pragma unroll
    for (int t = 0; t < kTT; ++t) acc[i][t] = 0.0f;

  for (int64_t k0 = 0; k0 < cols; k0 += kKT) {
    __syncthreads();
    for (int i = threadIdx.x; i < kBR * (kKT / 4); i += blockDim.x) {
      const int rr = i / (kKT / 4), lg = i % (kKT / 4);
      const int64_t r = rbase + rr, c0 = k0 + 4 * lg;
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (r < r1 && c0 < cols) decode_group<F>(w, r, c0, v);
      ws[rr][lg] = make_float4(v[0], v[1], v[2], v[3]);
    }
    const int64_t kn = cols - k0 < kKT ? cols - k0 : kKT;
    for (int i = threadIdx.x; i < kBT * kKT; i += blockDim.x) {
      const int tt = i / kKT, c = i % kKT;
      xsf[i] = (tbase + tt < T && c < kn) ? x[(tbase + tt) * ldx + k0 + c] : 0.0f;
    }
    __syncthreads();
    const int64_t c0 = k0 + 4 * lane;
    if (c0 < cols) {
      const int n = cols - c0 < 4 ? static_cast<int>(cols - c0) : 4;
      float4 xv[kTT];
#pragma unroll
      for (int t = 0; t < kTT; ++t) xv[t] = xs[wt * kTT + t][lane];
#pragma unroll
      for (int i = 0; i < kRR; ++i) {
        const float4 q = ws[wr * kRR + i][lane];
        const float wv[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int t = 0; t < kTT; ++t) acc[i][t] = fma_group(wv, xv[t], acc[i][t], n);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRR; ++i)
#pragma unroll
    for (int t = 0; t < kTT; ++t) {
      const float v = warp_sum(acc[i][t]);
      const int64_t r = rbase + wr * kRR + i, tok = tbase + wt * kTT + t;
      if (lane == ((i * kTT + t) & 31) && r < r1 && tok < T) y[tok * ldy + (r - r0)] = v;
    }
}

// ---------------------------------------------------------------- dispatch

std::atomic<int> g_gemv_max{16};

template <WFormat F>
void launch(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y, int64_t ldy,
            Stream s) {
  const int64_t n = r1 - r0;
  if (T <= qmatmul_gemv_max_tokens()) {
    const unsigned grid = static_cast<unsigned>(ceil_div(n, kGemvWarps * kGemvRows));
    const int threads = kGemvWarps * 32;
    if (T == 1) DSV4_LAUNCH(grid, threads, 0, s, qgemv_kernel<F, 1>)(w, r0, r1, x, ldx, T, y, ldy);
    else if (T == 2) DSV4_LAUNCH(grid, threads, 0, s, qgemv_kernel<F, 2>)(w, r0, r1, x, ldx, T, y, ldy);
    else if (T <= 4) DSV4_LAUNCH(grid, threads, 0, s, qgemv_kernel<F, 4>)(w, r0, r1, x, ldx, T, y, ldy);
    else DSV4_LAUNCH(grid, threads, 0, s, qgemv_kernel<F, 8>)(w, r0, r1, x, ldx, T, y, ldy);
    DSV4_CUDA_LAUNCHED("qgemv_kernel");
  } else {
    const dim3 grid(static_cast<unsigned>(ceil_div(n, kBR)), static_cast<unsigned>(ceil_div(T, kBT)));
    DSV4_LAUNCH(grid, 256, 0, s, qgemm_kernel<F>)(w, r0, r1, x, ldx, T, y, ldy);
    DSV4_CUDA_LAUNCHED("qgemm_kernel");
  }
}

template <WFormat F>
void launch_experts(const ExpertTable& t, const int32_t* ids, int64_t slots, const float* x, int64_t ldx, int64_t x_div,
                    float* y, int64_t ldy, Stream s) {
  const dim3 grid(static_cast<unsigned>(ceil_div(t.rows, kGemvWarps * kGemvRows)), static_cast<unsigned>(slots));
  DSV4_LAUNCH(grid, kGemvWarps * 32, 0, s, qgemv_experts_kernel<F>)(t.views, ids, x, ldx, x_div, y, ldy);
  DSV4_CUDA_LAUNCHED("qgemv_experts_kernel");
}

}  // namespace

void qmatmul_experts(const ExpertTable& t, const int32_t* ids, int64_t slots, const float* x, int64_t ldx, int64_t x_div,
                     float* y, int64_t ldy, Stream stream) {
  const char* op = "qmatmul_experts";
  if (!t.views || t.count <= 0) bad_arg(op, "empty expert table");
  if (x_div < 1 || ldx < t.cols || ldy < t.rows) bad_arg(op, "bad strides");
  if (slots > 65535) bad_arg(op, "too many slots for one launch");
  if (slots <= 0 || t.rows == 0) return;
  switch (t.fmt) {
    case WFormat::F32: return launch_experts<WFormat::F32>(t, ids, slots, x, ldx, x_div, y, ldy, stream);
    case WFormat::BF16: return launch_experts<WFormat::BF16>(t, ids, slots, x, ldx, x_div, y, ldy, stream);
    case WFormat::F16: return launch_experts<WFormat::F16>(t, ids, slots, x, ldx, x_div, y, ldy, stream);
    case WFormat::FP8Block: return launch_experts<WFormat::FP8Block>(t, ids, slots, x, ldx, x_div, y, ldy, stream);
    case WFormat::MXFP4: return launch_experts<WFormat::MXFP4>(t, ids, slots, x, ldx, x_div, y, ldy, stream);
    case WFormat::NVFP4: return launch_experts<WFormat::NVFP4>(t, ids, slots, x, ldx, x_div, y, ldy, stream);
  }
}

void set_qmatmul_gemv_max_tokens(int t) { g_gemv_max.store(t < 0 ? 16 : t); }
int qmatmul_gemv_max_tokens() { return g_gemv_max.load(); }

void qmatmul(const WeightView& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y, int64_t ldy,
             Stream stream) {
  const char* op = "qmatmul";
  if (!w.data) bad_arg(op, "weight has no data");
  if (r0 < 0 || r1 < r0 || r1 > w.rows)
    bad_arg(op, "rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ") out of range for " +
                    std::to_string(w.rows) + " rows");
  if (T < 0) bad_arg(op, "negative token count");
  if ((w.fmt == WFormat::MXFP4 || w.fmt == WFormat::NVFP4) && w.cols % 2 != 0)
    bad_arg(op, "FP4 weight has odd cols " + std::to_string(w.cols));
  if (w.fmt != WFormat::F32 && w.fmt != WFormat::BF16 && w.fmt != WFormat::F16 && !w.scale)
    bad_arg(op, "quantised weight without scales");
  const int gb = group_bytes(w.fmt);
  if (w.pitch % gb != 0 || reinterpret_cast<uintptr_t>(w.data) % gb != 0)
    bad_arg(op, "payload rows must be " + std::to_string(gb) + "-byte aligned (pitch " + std::to_string(w.pitch) + ")");
  if (T > 1 && ldy < r1 - r0) bad_arg(op, "ldy smaller than the row range");
  if (T > 1 && ldx < w.cols) bad_arg(op, "ldx smaller than cols");
  if (T == 0 || r1 == r0) return;
  switch (w.fmt) {
    case WFormat::F32: return launch<WFormat::F32>(w, r0, r1, x, ldx, T, y, ldy, stream);
    case WFormat::BF16: return launch<WFormat::BF16>(w, r0, r1, x, ldx, T, y, ldy, stream);
    case WFormat::F16: return launch<WFormat::F16>(w, r0, r1, x, ldx, T, y, ldy, stream);
    case WFormat::FP8Block: return launch<WFormat::FP8Block>(w, r0, r1, x, ldx, T, y, ldy, stream);
    case WFormat::MXFP4: return launch<WFormat::MXFP4>(w, r0, r1, x, ldx, T, y, ldy, stream);
    case WFormat::NVFP4: return launch<WFormat::NVFP4>(w, r0, r1, x, ldx, T, y, ldy, stream);
  }
}

}  // namespace dsv4::gpu
