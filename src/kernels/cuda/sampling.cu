// Greedy sampling: argmax over the vocabulary, one block per row (the sampler's
// std::max_element: the first index of the largest value).
#include "kernels/cuda/common.cuh"

namespace dsv4::gpu {
namespace {

__global__ void argmax_kernel(const float* __restrict__ x, int64_t n, int64_t ld, int32_t* out) {
  const float* xr = x + blockIdx.x * ld;
  float bv = 0.0f;
  int32_t bi = -1;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = xr[i];
    if (beats(v, static_cast<int32_t>(i), bv, bi)) bv = v, bi = static_cast<int32_t>(i);
  }
  block_argmax(bv, bi);
  if (threadIdx.x == 0) out[blockIdx.x] = bi < 0 ? 0 : bi;
}

}  // namespace

void argmax_rows(const float* x, int64_t rows, int64_t n, int64_t ld, int32_t* out, Stream stream) {
  if (n <= 0 || n > 0x7FFFFFFF) bad_arg("argmax_rows", "n must be in [1, 2^31)");
  if (rows <= 0) return;
  DSV4_LAUNCH(static_cast<unsigned>(rows), 1024, 0, stream, argmax_kernel)(x, n, ld, out);
  DSV4_CUDA_LAUNCHED("argmax_kernel");
}

}  // namespace dsv4::gpu
