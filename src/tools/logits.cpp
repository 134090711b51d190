#include "tools/logits.h"

#include <algorithm>
#include <cmath>

namespace dsv4 {

std::vector<double> rel_l2_rows(const float* got, const float* want, int64_t rows, int64_t cols) {
  std::vector<double> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double num = 0, den = 0;
    for (int64_t c = 0; c < cols; ++c) {
      double d = static_cast<double>(got[r * cols + c]) - want[r * cols + c];
      num += d * d;
      den += static_cast<double>(want[r * cols + c]) * want[r * cols + c];
    }
    out[r] = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
  }
  return out;
}

}  // namespace dsv4
