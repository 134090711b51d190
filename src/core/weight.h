#pragma once
// A linear weight [rows, cols] ("out, in") in its stored form, plus row dequantisation.
// Nothing here copies the payload: data/scale point into the mmap'd checkpoint.
#include <cstdint>
#include <string>
#include <vector>

namespace dsv4 {

enum class WFormat {
  F32,       // float32 [rows, cols]
  BF16,      // bf16 [rows, cols]
  F16,       // f16 [rows, cols]
  FP8Block,  // e4m3 [rows, cols] + E8M0 scale [ceil(rows/128), ceil(cols/128)]
  MXFP4,     // uint8 [rows, cols/2] (low nibble = even col) + E8M0 scale [rows, cols/32]
  NVFP4,     // uint8 [rows, cols/2] + E4M3 scale [rows, cols/16] + f32 scale2 (global)
};

const char* wformat_name(WFormat f);

struct QWeight {
  WFormat fmt = WFormat::F32;
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;   // payload, layout per fmt
  const uint8_t* scale = nullptr;  // block scales (FP8Block, MXFP4, NVFP4), row-major
  int64_t scale_cols = 0;          // columns of the scale tensor
  float scale2 = 1.0f;             // NVFP4 weight_scale_2
  // MXFP4: the smallest and largest scale byte over every block, once measure_scale_range ran
  // (the loader does for weights read into memory; mapped ones would have to be read for it).
  // Until then the whole byte range. The CPU kernels check once per call, from this range, what
  // they otherwise check per row tile (qmatmul_kernels.inc, deferral_exact).
  uint8_t scale_lo = 0, scale_hi = 255;
  std::string name;                // checkpoint tensor name, for messages

  bool empty() const { return data == nullptr; }
  // Bytes of payload + scales as stored.
  size_t stored_bytes() const;
};

// One matrix product over a weight's rows, the unit of Backend::matmul(s) and qmatmul_many:
// y[t*ldy + (r - r0)] = w[r, :] . x[t*ldx ..] for rows r in [r0, r1) of w and t < T.
struct Matmul {
  const QWeight* w = nullptr;
  const float* x = nullptr;
  int64_t T = 0;
  float* y = nullptr;
  int64_t r0 = 0, r1 = -1;     // -1: to the last row
  int64_t ldx = -1, ldy = -1;  // -1: dense (w->cols, r1 - r0)
};

// Sets scale_lo / scale_hi of an MXFP4 weight from its scale bytes (other formats: unchanged).
void measure_scale_range(QWeight& w);

// Dequantises row r (cols values) into out.
void dequant_row(const QWeight& w, int64_t r, float* out);

// Dequantises the whole weight (rows*cols floats). Only for small tensors and tests.
std::vector<float> dequant_all(const QWeight& w);

}  // namespace dsv4
