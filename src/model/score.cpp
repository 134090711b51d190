#include "model/score.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dsv4 {

std::vector<float> score_tokens(const Model& model, const std::vector<int32_t>& tokens, int64_t prefill, int64_t chunk) {
  const int64_t T = static_cast<int64_t>(tokens.size()), V = model.config().vocab;
  if (prefill < 0 || prefill > T) throw Error("prefill " + std::to_string(prefill) + " outside [0, " + std::to_string(T) + "]");
  if (chunk < 0) throw Error("chunk must be >= 0");
  std::vector<float> logits(static_cast<size_t>(T * V));
  SequenceState st = model.new_sequence();
  const int64_t step = chunk == 0 ? std::max<int64_t>(prefill, 1) : chunk;
  for (int64_t p = 0; p < prefill; p += step)
    model.forward(st, tokens.data() + p, std::min(step, prefill - p), logits.data() + p * V);
  for (int64_t p = prefill; p < T; ++p) model.forward(st, tokens.data() + p, 1, logits.data() + p * V);
  return logits;
}

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
