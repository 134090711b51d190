#pragma once
// Logits for every position of a token sequence, fed as the CLI's `score` does: the first
// `prefill` tokens in chunks of `chunk` (0 = one chunk), the rest one decode step at a time.
#include <cstdint>
#include <vector>

#include "model/forward.h"

namespace dsv4 {

std::vector<float> score_tokens(const Model& model, const std::vector<int32_t>& tokens, int64_t prefill, int64_t chunk);

// Per-position relative L2 error ||got - want|| / ||want|| over rows of `cols` values.
std::vector<double> rel_l2_rows(const float* got, const float* want, int64_t rows, int64_t cols);

}  // namespace dsv4
