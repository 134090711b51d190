// MoE routing (model/moe.cpp route_token): one block per token.
#include "kernels/cuda/common.cuh"

namespace dsv4::gpu {
namespace {

constexpr int kMaxK = 32;

// Shared memory: a[E] (sqrt(softplus(logit))), biased[E] (a + bias, selection only), taken[E].
__global__ void route_kernel(const float* __restrict__ logits, int64_t E, int k, const float* __restrict__ bias,
                             const int32_t* __restrict__ tid2eid, const int32_t* __restrict__ tokens, float scale,
                             int32_t* ids, float* weights) {
  DSV4_EXTERN_SHARED(float, rs);
  float* a = rs;
  float* biased = rs + E;
  unsigned char* taken = reinterpret_cast<unsigned char*>(rs + 2 * E);
  __shared__ int32_t chosen[kMaxK];
  const int64_t t = blockIdx.x;
  const float* lg = logits + t * E;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    a[e] = sqrtf(softplusf_(lg[e]));
    biased[e] = a[e] + (bias ? bias[e] : 0.0f);  // the bias only selects
    taken[e] = 0;
  }
  __syncthreads();
  if (tid2eid) {
    if (threadIdx.x < k) chosen[threadIdx.x] = tid2eid[static_cast<int64_t>(tokens[t]) * k + threadIdx.x];
  } else {
    for (int j = 0; j < k; ++j) {
      float bv = 0.0f;
      int32_t bi = -1;
      for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
        if (!taken[e] && beats(biased[e], static_cast<int32_t>(e), bv, bi)) bv = biased[e], bi = static_cast<int32_t>(e);
      block_argmax(bv, bi);
      if (threadIdx.x == 0) {
        chosen[j] = bi;
        if (bi >= 0) taken[bi] = 1;
      }
      __syncthreads();
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // As route_token: the sum in selection order, then a_e / sum * scale.
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += chosen[j] >= 0 && chosen[j] < E ? a[chosen[j]] : 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t e = chosen[j];
      ids[t * k + j] = e;
      weights[t * k + j] = e >= 0 && e < E ? a[e] / sum * scale : 0.0f;
    }
  }
}

}  // namespace

void route(const float* logits, int64_t T, int64_t E, int64_t k, const float* bias, const int32_t* tid2eid,
           const int32_t* tokens, double scale, int32_t* ids, float* weights, Stream stream) {
  if (E <= 0 || k <= 0 || k > kMaxK || k > E) bad_arg("route", "need 0 < k <= min(E, 32)");
  if (tid2eid && !tokens) bad_arg("route", "hash routing needs the token ids");
  if (T <= 0) return;
  const size_t smem = static_cast<size_t>(E) * (2 * sizeof(float) + 1);
  if (smem > 48 * 1024) bad_arg("route", "too many experts for one block");
  DSV4_LAUNCH(static_cast<unsigned>(T), 256, smem, stream, route_kernel)(logits, E, static_cast<int>(k), bias, tid2eid, tokens,
                                                               static_cast<float>(scale), ids, weights);
  DSV4_CUDA_LAUNCHED("route_kernel");
}

}  // namespace dsv4::gpu
