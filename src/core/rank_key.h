#pragma once
// The one order of candidates that every top-k and every sampler uses, CPU and CUDA alike:
// value descending, ties to the lower index, -0 equal to +0, NaN after everything (a NaN never
// beats a number, as kernels/cuda/common.cuh's `beats` has it). A float comparator is no order
// once NaN is in the data (std::partial_sort's result is then undefined), so the order goes
// through this key.
#include <cstdint>
#include <cstring>

namespace dsv4 {

// Ascending key of that order: a smaller key ranks first; equal keys tie (then the lower index).
inline uint32_t rank_key(float f) {
  if (f != f) return 0xFFFFFFFFu;
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  if (b == 0x80000000u) b = 0;
  const uint32_t up = (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // increasing with f
  return ~up;
}

}  // namespace dsv4
