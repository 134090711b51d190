#pragma once
// Manifold-constrained hyper-connections (mHC): the residual stream is hc copies of the hidden
// state; each sublayer reads a mix of them (hc_pre) and writes back through post weights and a
// Sinkhorn-normalised hc x hc combination (hc_post).
#include <cstdint>

#include "io/config.h"
#include "model/weights.h"

namespace dsv4 {

// For every token t < T of X [T, hc, D]: the mixed sublayer input x [T, D], post [T, hc] and
// the combination C [T, hc, hc] (MODEL.md "Block_l").
void hc_pre(const ModelConfig& c, const HcMixW& mix, const float* X, int64_t T, float* x, float* post, float* comb);

// X'_j = post_j * f + sum_i C_ij X_i, in place on X [T, hc, D].
void hc_post(const ModelConfig& c, const float* f, const float* post, const float* comb, float* X, int64_t T);

}  // namespace dsv4
