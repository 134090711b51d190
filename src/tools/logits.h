#pragma once
// Comparing logits (tests, golden checks): per-row relative L2 error.
#include <cstdint>
#include <vector>

namespace dsv4 {

// Per-position relative L2 error ||got - want|| / ||want|| over rows of `cols` values.
std::vector<double> rel_l2_rows(const float* got, const float* want, int64_t rows, int64_t cols);

}  // namespace dsv4
