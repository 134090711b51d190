#pragma once
// RoPE tables: the model math every backend shares (MODEL.md "Building blocks").
#include <cstdint>
#include <vector>

#include "io/config.h"

namespace dsv4 {

// RoPE frequencies of one layer (MODEL.md "Building blocks"): base^(-2i/r) in float32, with
// YaRN correction when `yarn` is set.
struct RopeTable {
  int64_t rope_dim = 0;
  std::vector<float> freq;  // rope_dim / 2
  // Rotates the last rope_dim values of v (length n) by pos (inverse: by -pos), interleaved pairs.
  void apply(float* v, int64_t n, int64_t pos, bool inverse = false) const;

  // The same rotation for many vectors at one position: cos/sin computed once.
  struct At {
    std::vector<float> cos, sin;
    void apply(float* v, int64_t n, bool inverse = false) const;
  };
  At at(int64_t pos) const;
};
RopeTable make_rope(int64_t rope_dim, double base, bool yarn, double factor, int64_t original, double beta_fast, double beta_slow);
// Main layer l's table: CSA and HCA layers use compress_rope_theta with YaRN, the
// others rope_theta without.
RopeTable layer_rope(const ModelConfig& c, int64_t l);

}  // namespace dsv4
