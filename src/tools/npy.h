#pragma once
// NumPy .npy (format 1.0) for float32 C-order arrays: logits out, golden logits in.
#include <cstdint>
#include <string>
#include <vector>

namespace dsv4 {

struct NpyF32 {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const float* data);
NpyF32 read_npy_f32(const std::string& path);  // '<f4', C order; throws dsv4::Error otherwise

}  // namespace dsv4
