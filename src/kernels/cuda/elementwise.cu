// Norms, RoPE, clamped SwiGLU, embedding gather, fp8sim/fp4sim, Hadamard (model/ops.h, moe.h,
// core/formats.h). Each kernel repeats the CPU arithmetic step for step; only reductions
// (sums of squares) and libm-vs-CUDA transcendental rounding can differ.
#include "kernels/cuda/common.cuh"

namespace dsv4::gpu {
namespace {

// ---------------------------------------------------------------- rmsnorm: one block per row

__global__ void rmsnorm_kernel(const float* x, int64_t ldx, const float* __restrict__ w, int64_t n, double eps, float* y,
                               int64_t ldy) {
  const float* xr = x + blockIdx.x * ldx;
  float* yr = y + blockIdx.x * ldy;
  const float rs = block_inv_rms(xr, n, eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (w ? w[i] : 1.0f) * (xr[i] * rs);
}

// ---------------------------------------------------------------- RoPE: one thread per pair

__global__ void rope_kernel(float* v, int64_t nvec, int64_t n, int64_t ld, const float* __restrict__ freq, int64_t half,
                            const int32_t* __restrict__ pos, int64_t vecs_per_pos, bool inverse) {
  const int64_t total = nvec * half;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t vec = i / half, p = i % half;
    float c, s;
    rope_cs(pos[vec / vecs_per_pos], freq[p], c, s);
    if (inverse) s = -s;
    float* pr = v + vec * ld + (n - 2 * half) + 2 * p;
    float a = pr[0], b = pr[1];
    rope_pair(a, b, c, s);
    pr[0] = a;
    pr[1] = b;
  }
}

// ---------------------------------------------------------------- clamped SwiGLU

__global__ void swiglu_kernel(float* g, int64_t ldg, const float* __restrict__ u, int64_t ldu, int64_t rows, int64_t n,
                              float lim, const float* __restrict__ row_w) {
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, j = i % n;
    float gv = g[r * ldg + j], uv = u[r * ldu + j];
    if (lim > 0.0f) {  // asymmetric: the up projection both ways, the gate only from above
      uv = uv < -lim ? -lim : (lim < uv ? lim : uv);
      gv = lim < gv ? lim : gv;
    }
    g[r * ldg + j] = siluf_(gv) * uv * (row_w ? row_w[r] : 1.0f);
  }
}

// ---------------------------------------------------------------- embedding gather

__global__ void embed_kernel(WeightView w, const int32_t* __restrict__ tokens, int64_t copies, float* out) {
  const int64_t t = blockIdx.x;
  const int32_t tok = tokens[t];
  const bool ok = tok >= 0 && tok < w.rows;
  for (int64_t c = threadIdx.x; c < w.cols; c += blockDim.x) {
    const float v = ok ? weight_elem(w, tok, c) : __int_as_float(0x7FC00000);
    for (int64_t i = 0; i < copies; ++i) out[(t * copies + i) * w.cols + c] = v;
  }
}

// ---------------------------------------------------------------- fp8sim / fp4sim: one warp per block

template <bool FP8>
__global__ void sim_kernel(float* x, int64_t rows, int64_t n, int64_t ld, int64_t block) {
  const int64_t per_row = n / block;
  const int64_t total = rows * per_row;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + (threadIdx.x >> 5); b < total; b += warps) {
    float* v = x + (b / per_row) * ld + (b % per_row) * block;
    if (FP8) warp_fp8sim(v, static_cast<int>(block));
    else warp_fp4sim(v, static_cast<int>(block));
  }
}

// ---------------------------------------------------------------- Hadamard: one block per row

__global__ void hadamard_kernel(float* x, int64_t n, int64_t ld) {
  DSV4_EXTERN_SHARED(float, hs);
  float* xr = x + blockIdx.x * ld;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) hs[i] = xr[i];
  __syncthreads();
  block_hadamard(hs, n);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xr[i] = hs[i];
}

__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = a[i] + b[i];
}

}  // namespace

void rmsnorm(const float* x, int64_t ldx, const float* w, int64_t rows, int64_t n, double eps, float* y, int64_t ldy,
             Stream stream) {
  if (rows < 0 || n <= 0) bad_arg("rmsnorm", "bad shape");
  if (rows == 0) return;
  if (rows > 0x7FFFFFFF) bad_arg("rmsnorm", "too many rows");
  DSV4_LAUNCH(static_cast<unsigned>(rows), 256, 0, stream, rmsnorm_kernel)(x, ldx, w, n, eps, y, ldy);
  DSV4_CUDA_LAUNCHED("rmsnorm_kernel");
}

void rope(float* v, int64_t nvec, int64_t n, int64_t ld, const float* freq, int64_t rope_dim, const int32_t* pos,
          int64_t vecs_per_pos, bool inverse, Stream stream) {
  if (rope_dim <= 0 || rope_dim % 2 != 0 || rope_dim > n || vecs_per_pos <= 0)
    bad_arg("rope", "bad rope_dim " + std::to_string(rope_dim) + " for vectors of " + std::to_string(n));
  if (nvec <= 0) return;
  const int64_t half = rope_dim / 2;
  DSV4_LAUNCH(grid_for(nvec * half, 256), 256, 0, stream, rope_kernel)(v, nvec, n, ld, freq, half, pos, vecs_per_pos, inverse);
  DSV4_CUDA_LAUNCHED("rope_kernel");
}

void swiglu_clamped(float* g, int64_t ldg, const float* u, int64_t ldu, int64_t rows, int64_t n, float lim,
                    const float* row_w, Stream stream) {
  if (rows <= 0 || n <= 0) return;
  DSV4_LAUNCH(grid_for(rows * n, 256), 256, 0, stream, swiglu_kernel)(g, ldg, u, ldu, rows, n, lim, row_w);
  DSV4_CUDA_LAUNCHED("swiglu_kernel");
}

void embed(const WeightView& table, const int32_t* tokens, int64_t T, int64_t copies, float* out, Stream stream) {
  if (copies < 1) bad_arg("embed", "copies must be >= 1");
  if ((table.fmt == WFormat::MXFP4 || table.fmt == WFormat::NVFP4) && table.cols % 2 != 0)
    bad_arg("embed", "FP4 table with odd cols");
  if (T <= 0) return;
  DSV4_LAUNCH(static_cast<unsigned>(T), 256, 0, stream, embed_kernel)(table, tokens, copies, out);
  DSV4_CUDA_LAUNCHED("embed_kernel");
}

void fp8sim_rows(float* x, int64_t rows, int64_t n, int64_t ld, int64_t block, Stream stream) {
  if (block <= 0 || n % block != 0) bad_arg("fp8sim_rows", "n is not a multiple of block");
  if (rows <= 0 || n == 0) return;
  DSV4_LAUNCH(grid_for(rows * (n / block), 8), 256, 0, stream, sim_kernel<true>)(x, rows, n, ld, block);
  DSV4_CUDA_LAUNCHED("sim_kernel<fp8>");
}

void fp4sim_rows(float* x, int64_t rows, int64_t n, int64_t ld, int64_t block, Stream stream) {
  if (block <= 0 || n % block != 0) bad_arg("fp4sim_rows", "n is not a multiple of block");
  if (rows <= 0 || n == 0) return;
  DSV4_LAUNCH(grid_for(rows * (n / block), 8), 256, 0, stream, sim_kernel<false>)(x, rows, n, ld, block);
  DSV4_CUDA_LAUNCHED("sim_kernel<fp4>");
}

void hadamard_rows(float* x, int64_t rows, int64_t n, int64_t ld, Stream stream) {
  if (n <= 0 || (n & (n - 1)) != 0 || n > 8192) bad_arg("hadamard_rows", "n must be a power of two <= 8192");
  if (rows <= 0) return;
  DSV4_LAUNCH(static_cast<unsigned>(rows), 256, static_cast<size_t>(n) * sizeof(float), stream, hadamard_kernel)(x, n, ld);
  DSV4_CUDA_LAUNCHED("hadamard_kernel");
}

void add(const float* a, const float* b, float* y, int64_t n, Stream stream) {
  if (n <= 0) return;
  DSV4_LAUNCH(grid_for(n, 256), 256, 0, stream, add_kernel)(a, b, y, n);
  DSV4_CUDA_LAUNCHED("add_kernel");
}

}  // namespace dsv4::gpu
