// Row movement for the MoE dispatch (Model's expert loop, model/cpu_backend.cpp): gather the
// rows of the tokens an expert serves, add its outputs back into their rows, and a scalar
// scale (the indexer's head weights). Plain copies and single float ops: bit-exact with the CPU.
#include "kernels/cuda/common.cuh"

namespace dsv4::gpu {
namespace {

__global__ void gather_rows_kernel(const float* __restrict__ x, int64_t ldx, const int32_t* __restrict__ idx, int64_t n,
                                   int64_t cols, float* __restrict__ y, int64_t ldy) {
  const int64_t total = n * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    y[r * ldy + c] = x[static_cast<int64_t>(idx[r]) * ldx + c];
  }
}

// Rows idx[r] are distinct within one call (an expert serves a token at most once), so no two
// threads touch the same output: a plain read-add-write, the CPU's `out += y`.
__global__ void scatter_add_rows_kernel(const float* __restrict__ y, int64_t ldy, const int32_t* __restrict__ idx, int64_t n,
                                        int64_t cols, float* out, int64_t ldo) {
  const int64_t total = n * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    float* o = out + static_cast<int64_t>(idx[r]) * ldo + c;
    *o = __fadd_rn(*o, y[r * ldy + c]);
  }
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __fmul_rn(x[i], s);
}

}  // namespace

void gather_rows(const float* x, int64_t ldx, const int32_t* idx, int64_t n, int64_t cols, float* y, int64_t ldy,
                 Stream stream) {
  if (n < 0 || cols < 0 || ldx < cols || ldy < cols) bad_arg("gather_rows", "bad shape");
  if (n == 0 || cols == 0) return;
  DSV4_LAUNCH(grid_for(n * cols, 256), 256, 0, stream, gather_rows_kernel)(x, ldx, idx, n, cols, y, ldy);
  DSV4_CUDA_LAUNCHED("gather_rows_kernel");
}

void scatter_add_rows(const float* y, int64_t ldy, const int32_t* idx, int64_t n, int64_t cols, float* out, int64_t ldo,
                      Stream stream) {
  if (n < 0 || cols < 0 || ldy < cols || ldo < cols) bad_arg("scatter_add_rows", "bad shape");
  if (n == 0 || cols == 0) return;
  DSV4_LAUNCH(grid_for(n * cols, 256), 256, 0, stream, scatter_add_rows_kernel)(y, ldy, idx, n, cols, out, ldo);
  DSV4_CUDA_LAUNCHED("scatter_add_rows_kernel");
}

void scale(float* x, int64_t n, float s, Stream stream) {
  if (n <= 0) return;
  DSV4_LAUNCH(grid_for(n, 256), 256, 0, stream, scale_kernel)(x, n, s);
  DSV4_CUDA_LAUNCHED("scale_kernel");
}

}  // namespace dsv4::gpu
