#include "backends/cpu/mhc.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/threads.h"
#include "backends/cpu/ops.h"

namespace dsv4 {

// hc_pre of one sublayer for every token: the mixed input x [T, D], post [T, hc] and the
// Sinkhorn-normalised combination C [T, hc, hc].
void hc_pre(const ModelConfig& c, const HcMixW& mix, const float* X, int64_t T, float* x, float* post, float* comb) {
  const int64_t hc = c.hc, D = c.dim, n = hc * D, M = c.hc_mix();
  const float eps = static_cast<float>(c.hc_eps);
  // The mixes of every token as one matrix product: fn [M, hc*D] is a small F32 weight.
  std::vector<float> mixes(static_cast<size_t>(T * M));
  matmul(f32_weight(mix.fn.data(), M, n), X, T, mixes.data());
  thread_pool().parallel_for(T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* xf = X + t * n;
      const float rs = inv_rms(xf, n, c.eps);
      float* m = mixes.data() + t * M;
      for (int64_t k = 0; k < M; ++k) m[k] *= rs;
      float pre[16];
      for (int64_t i = 0; i < hc; ++i) pre[i] = sigmoid(m[i] * mix.scale[0] + mix.base[i]) + eps;
      for (int64_t j = 0; j < hc; ++j) post[t * hc + j] = 2.0f * sigmoid(m[hc + j] * mix.scale[1] + mix.base[hc + j]);
      float* C = comb + t * hc * hc;
      for (int64_t k = 0; k < hc * hc; ++k) C[k] = m[2 * hc + k] * mix.scale[2] + mix.base[2 * hc + k];
      // Row softmax, then alternate column / row normalisation (Sinkhorn).
      for (int64_t i = 0; i < hc; ++i) {
        float* row = C + i * hc;
        float mx = *std::max_element(row, row + hc), s = 0;
        for (int64_t j = 0; j < hc; ++j) s += (row[j] = std::exp(row[j] - mx));
        for (int64_t j = 0; j < hc; ++j) row[j] = row[j] / s + eps;
      }
      auto norm_cols = [&] {
        for (int64_t j = 0; j < hc; ++j) {
          float s = 0;
          for (int64_t i = 0; i < hc; ++i) s += C[i * hc + j];
          for (int64_t i = 0; i < hc; ++i) C[i * hc + j] /= s + eps;
        }
      };
      auto norm_rows = [&] {
        for (int64_t i = 0; i < hc; ++i) {
          float s = 0;
          for (int64_t j = 0; j < hc; ++j) s += C[i * hc + j];
          for (int64_t j = 0; j < hc; ++j) C[i * hc + j] /= s + eps;
        }
      };
      norm_cols();
      for (int64_t it = 1; it < c.sinkhorn_iters; ++it) {
        norm_rows();
        norm_cols();
      }
      // xo[d] = ((0 + pre_0 X_0[d]) + pre_1 X_1[d]) + ..., one stream at a time over all d (the
      // same additions per element, in loops the compiler vectorises).
      float* xo = x + t * D;
      std::fill(xo, xo + D, 0.0f);
      for (int64_t i = 0; i < hc; ++i) {
        const float p = pre[i];
        const float* xi = xf + i * D;
        for (int64_t d = 0; d < D; ++d) xo[d] += p * xi[d];
      }
    }
  });
}

// hc_post: X'_j = post_j * f + sum_i C_ij X_i, in place on X.
void hc_post(const ModelConfig& c, const float* f, const float* post, const float* comb, float* X, int64_t T) {
  const int64_t hc = c.hc, D = c.dim;
  thread_pool().parallel_for(T, [&](int64_t b, int64_t e) {
    std::vector<float> old(static_cast<size_t>(hc * D));
    for (int64_t t = b; t < e; ++t) {
      float* Xt = X + t * hc * D;
      std::copy(Xt, Xt + hc * D, old.begin());
      const float* C = comb + t * hc * hc;
      // X'_j[d] = ((post_j f[d] + C_0j X_0[d]) + C_1j X_1[d]) + ..., one term at a time over all
      // d (the same additions per element, in loops the compiler vectorises).
      for (int64_t j = 0; j < hc; ++j) {
        float* xj = Xt + j * D;
        const float pj = post[t * hc + j];
        const float* ft = f + t * D;
        for (int64_t d = 0; d < D; ++d) xj[d] = pj * ft[d];
        for (int64_t i = 0; i < hc; ++i) {
          const float cij = C[i * hc + j];
          const float* oi = old.data() + i * D;
          for (int64_t d = 0; d < D; ++d) xj[d] += cij * oi[d];
        }
      }
    }
  });
}

}  // namespace dsv4
