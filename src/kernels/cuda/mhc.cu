// Manifold-constrained hyper-connections (model/mhc.cpp) and hc_head (Model::forward).
// The mixes X . fn^T run through qmatmul (fn is a small F32 weight); the per-token remainder
// (inverse RMS, sigmoids, Sinkhorn) is one block per token, its scalar part on one thread in
// the CPU's exact operation order.
#include "kernels/cuda/common.cuh"

namespace dsv4::gpu {
namespace {

constexpr int kMaxHc = 16;

__global__ void hc_pre_kernel(const float* __restrict__ X, int64_t hc, int64_t D, int iters, double eps, float hc_eps,
                              const float* __restrict__ mixes, const float* __restrict__ base,
                              const float* __restrict__ scale, float* x, float* post, float* comb) {
  __shared__ float pre[kMaxHc];
  const int64_t t = blockIdx.x, n = hc * D, M = (2 + hc) * hc;
  const float* xf = X + t * n;
  const float rs = block_inv_rms(xf, n, eps);
  if (threadIdx.x == 0) {
    float m[(2 + kMaxHc) * kMaxHc];
    for (int64_t k = 0; k < M; ++k) m[k] = mixes[t * M + k] * rs;
    for (int64_t i = 0; i < hc; ++i) pre[i] = sigmoidf_(mul_add(m[i], scale[0], base[i])) + hc_eps;
    for (int64_t j = 0; j < hc; ++j) post[t * hc + j] = 2.0f * sigmoidf_(mul_add(m[hc + j], scale[1], base[hc + j]));
    float C[kMaxHc * kMaxHc];
    for (int64_t k = 0; k < hc * hc; ++k) C[k] = mul_add(m[2 * hc + k], scale[2], base[2 * hc + k]);
    // Row softmax, then alternate column / row normalisation (Sinkhorn), as hc_pre.
    for (int64_t i = 0; i < hc; ++i) {
      float* row = C + i * hc;
      float mx = row[0], s = 0.0f;
      for (int64_t j = 1; j < hc; ++j) mx = row[j] > mx ? row[j] : mx;
      for (int64_t j = 0; j < hc; ++j) s += (row[j] = expf(row[j] - mx));
      for (int64_t j = 0; j < hc; ++j) row[j] = row[j] / s + hc_eps;
    }
    // hc_pre normalises the columns once, then (iters - 1) times rows and columns.
    for (int it = 0; it < (iters > 1 ? iters : 1); ++it) {
      if (it > 0) {
        for (int64_t i = 0; i < hc; ++i) {
          float s = 0.0f;
          for (int64_t j = 0; j < hc; ++j) s += C[i * hc + j];
          for (int64_t j = 0; j < hc; ++j) C[i * hc + j] /= s + hc_eps;
        }
      }
      for (int64_t j = 0; j < hc; ++j) {
        float s = 0.0f;
        for (int64_t i = 0; i < hc; ++i) s += C[i * hc + j];
        for (int64_t i = 0; i < hc; ++i) C[i * hc + j] /= s + hc_eps;
      }
    }
    for (int64_t k = 0; k < hc * hc; ++k) comb[t * hc * hc + k] = C[k];
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float s = 0.0f;
    for (int64_t i = 0; i < hc; ++i) s = mul_add(pre[i], xf[i * D + d], s);
    x[t * D + d] = s;
  }
}

__global__ void hc_post_kernel(const float* __restrict__ f, const float* __restrict__ post,
                               const float* __restrict__ comb, float* X, int64_t T, int64_t hc, int64_t D) {
  const int64_t total = T * D;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, d = i % D;
    float* Xt = X + t * hc * D;
    float old[kMaxHc];
    for (int64_t k = 0; k < hc; ++k) old[k] = Xt[k * D + d];  // this thread owns column d of token t
    const float* C = comb + t * hc * hc;
    const float fv = f[t * D + d];
    for (int64_t j = 0; j < hc; ++j) {
      float s = __fmul_rn(post[t * hc + j], fv);
      for (int64_t k = 0; k < hc; ++k) s = mul_add(C[k * hc + j], old[k], s);
      Xt[j * D + d] = s;
    }
  }
}

__global__ void hc_head_kernel(const float* __restrict__ X, int64_t hc, int64_t D, double eps, float hc_eps,
                               const float* __restrict__ mixes, const float* __restrict__ base,
                               const float* __restrict__ scale, float* y) {
  __shared__ float p[kMaxHc];
  const int64_t t = blockIdx.x, n = hc * D;
  const float* xf = X + t * n;
  const float rs = block_inv_rms(xf, n, eps);
  if (threadIdx.x == 0) {
    for (int64_t i = 0; i < hc; ++i)
      p[i] = sigmoidf_(mul_add(__fmul_rn(mixes[t * hc + i], rs), scale[0], base[i])) + hc_eps;
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float s = 0.0f;
    for (int64_t i = 0; i < hc; ++i) s = mul_add(p[i], xf[i * D + d], s);
    y[t * D + d] = s;
  }
}

void check_hc(const char* op, const DeviceHcMix& mix, int64_t rows, int64_t hc, int64_t D) {
  if (hc <= 0 || hc > kMaxHc) bad_arg(op, "hc must be in [1, 16]");
  if (mix.rows != rows || mix.width != hc * D)
    bad_arg(op, "mixer is [" + std::to_string(mix.rows) + ", " + std::to_string(mix.width) + "], expected [" +
                    std::to_string(rows) + ", " + std::to_string(hc * D) + "]");
  if (mix.scale.bytes() < sizeof(float) * (rows == hc ? 1 : 3)) bad_arg(op, "mixer scale too short");
}

}  // namespace

void hc_pre(const DeviceHcMix& mix, const float* X, int64_t T, int64_t hc, int64_t D, int sinkhorn_iters, double eps,
            double hc_eps, float* mixes, float* x, float* post, float* comb, Stream stream) {
  const int64_t M = (2 + hc) * hc;
  check_hc("hc_pre", mix, M, hc, D);
  if (T <= 0) return;
  qmatmul(f32_view(mix.fn.as<float>(), M, hc * D, hc * D), 0, M, X, hc * D, T, mixes, M, stream);
  DSV4_LAUNCH(static_cast<unsigned>(T), 256, 0, stream, hc_pre_kernel)(X, hc, D, sinkhorn_iters, eps, static_cast<float>(hc_eps),
                                                               mixes, mix.base.as<float>(), mix.scale.as<float>(), x,
                                                               post, comb);
  DSV4_CUDA_LAUNCHED("hc_pre_kernel");
}

void hc_post(const float* f, const float* post, const float* comb, float* X, int64_t T, int64_t hc, int64_t D,
             Stream stream) {
  if (hc <= 0 || hc > kMaxHc) bad_arg("hc_post", "hc must be in [1, 16]");
  if (T <= 0) return;
  DSV4_LAUNCH(grid_for(T * D, 256), 256, 0, stream, hc_post_kernel)(f, post, comb, X, T, hc, D);
  DSV4_CUDA_LAUNCHED("hc_post_kernel");
}

void hc_head(const DeviceHcMix& head, const float* X, int64_t T, int64_t hc, int64_t D, double eps, double hc_eps,
             float* mixes, float* y, Stream stream) {
  check_hc("hc_head", head, hc, hc, D);
  if (T <= 0) return;
  qmatmul(f32_view(head.fn.as<float>(), hc, hc * D, hc * D), 0, hc, X, hc * D, T, mixes, hc, stream);
  DSV4_LAUNCH(static_cast<unsigned>(T), 256, 0, stream, hc_head_kernel)(X, hc, D, eps, static_cast<float>(hc_eps), mixes,
                                                               head.base.as<float>(), head.scale.as<float>(), y);
  DSV4_CUDA_LAUNCHED("hc_head_kernel");
}

}  // namespace dsv4::gpu
