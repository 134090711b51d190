// Greedy sampling: argmax over the vocabulary, one block per row (the sampler's
// std::max_element: the first index of the largest value). Sampling with temperature / top-k /
// top-p / min-p: core/sampling.cpp's sample_logits ported (topk_rows sorts the candidates).
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

constexpr int kSampleThreads = 128;

// One block per row, after topk_rows wrote the row's candidates best first (ties to the lower id,
// the CPU's sample_logits order). The exps are independent, so the block computes them; the sums,
// which must run in the CPU's order, are one thread's.
__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const float* __restrict__ x, int64_t n, int64_t ld, int K, const SampleRow* __restrict__ params,
                  const int32_t* __restrict__ idx, double* prob, int32_t* out) {
  const int64_t row = blockIdx.x;
  const SampleRow r = params[row];
  const float* l = x + row * ld;
  const int32_t* id = idx + row * K;
  double* p = prob + row * K;
  if (r.temperature == 0.0f) {  // greedy: the first largest, the candidates' head (uniform over the block)
    if (threadIdx.x == 0) out[row] = id[0];
    return;
  }
  int64_t k = r.top_k > 0 && r.top_k < n ? r.top_k : n;
  k = k < K ? k : K;  // the host checked k <= K
  const double mx = l[id[0]], temp = r.temperature;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) p[i] = exp((static_cast<double>(l[id[i]]) - mx) / temp);
  __syncthreads();
  if (threadIdx.x != 0) return;
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += p[i];
  for (int64_t i = 0; i < k; ++i) p[i] /= sum;
  int64_t keep = k;
  if (r.top_p < 1.0f) {
    double acc = 0;
    for (int64_t i = 0; i < k; ++i) {
      acc += p[i];
      if (acc >= static_cast<double>(r.top_p)) {
        keep = i + 1;
        break;
      }
    }
  }
  if (r.min_p > 0.0f)
    while (keep > 1 && p[keep - 1] < static_cast<double>(r.min_p) * p[0]) --keep;
  double mass = 0;
  for (int64_t i = 0; i < keep; ++i) mass += p[i];
  double u = r.u * mass;
  for (int64_t i = 0; i < keep; ++i) {
    if (u < p[i]) {
      out[row] = id[i];
      return;
    }
    u -= p[i];
  }
  out[row] = id[keep - 1];
}

}  // namespace

int64_t sample_max_candidates(int64_t n) { return n < 4096 ? n : 4096; }

void sample_rows(const float* x, int64_t rows, int64_t n, int64_t ld, const SampleRow* params, int32_t* idx, int32_t* count,
                 double* prob, int32_t* out, Stream stream) {
  if (n <= 0 || n > 0x7FFFFFFF) bad_arg("sample_rows", "n must be in [1, 2^31)");
  if (!x || !params || !idx || !count || !prob || !out) bad_arg("sample_rows", "missing pointer");
  if (rows <= 0) return;
  const int64_t K = sample_max_candidates(n);
  topk_rows(x, rows, n, ld, nullptr, K, idx, count, stream);
  DSV4_LAUNCH(static_cast<unsigned>(rows), kSampleThreads, 0, stream, sample_kernel)(x, n, ld, static_cast<int>(K), params, idx,
                                                                                  prob, out);
  DSV4_CUDA_LAUNCHED("sample_kernel");
}

void argmax_rows(const float* x, int64_t rows, int64_t n, int64_t ld, int32_t* out, Stream stream) {
  if (n <= 0 || n > 0x7FFFFFFF) bad_arg("argmax_rows", "n must be in [1, 2^31)");
  if (rows <= 0) return;
  DSV4_LAUNCH(static_cast<unsigned>(rows), 1024, 0, stream, argmax_kernel)(x, n, ld, out);
  DSV4_CUDA_LAUNCHED("argmax_kernel");
}

}  // namespace dsv4::gpu
