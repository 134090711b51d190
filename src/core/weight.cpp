#include "core/weight.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/formats.h"

namespace dsv4 {
namespace {

// Decode tables: dequant_row is the reference CPU path's inner loop, so every per-element
// conversion is a lookup rather than bit arithmetic.
struct Tables {
  std::array<float, 256> e4m3{};
  std::array<float, 256> e8m0{};
  std::array<float, 16> e2m1{};
};

const Tables& tables() {
  static const Tables t = [] {
    Tables x;
    for (int b = 0; b < 256; ++b) {
      x.e4m3[b] = e4m3_to_f32(static_cast<uint8_t>(b));
      x.e8m0[b] = e8m0_to_f32(static_cast<uint8_t>(b));
    }
    for (int c = 0; c < 16; ++c) x.e2m1[c] = e2m1_to_f32(static_cast<uint8_t>(c));
    return x;
  }();
  return t;
}

constexpr int64_t kFp8Block = 128;  // FP8Block scale granularity, both dimensions
constexpr int64_t kMxBlock = 32;    // MXFP4 columns per scale
constexpr int64_t kNvBlock = 16;    // NVFP4 columns per scale

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void row_f32(const QWeight& w, int64_t r, float* out) {
  std::memcpy(out, w.data + r * w.cols * 4, static_cast<size_t>(w.cols) * 4);
}

void row_bf16(const QWeight& w, int64_t r, float* out) {
  // memcpy per element: the mmap'd payload carries no alignment promise.
  const uint8_t* p = w.data + r * w.cols * 2;
  for (int64_t c = 0; c < w.cols; ++c) {
    uint16_t h;
    std::memcpy(&h, p + 2 * c, 2);
    out[c] = bf16_to_f32(h);
  }
}

void row_f16(const QWeight& w, int64_t r, float* out) {
  const uint8_t* p = w.data + r * w.cols * 2;
  for (int64_t c = 0; c < w.cols; ++c) {
    uint16_t h;
    std::memcpy(&h, p + 2 * c, 2);
    out[c] = f16_to_f32(h);
  }
}

void row_fp8_block(const QWeight& w, int64_t r, float* out) {
  const Tables& t = tables();
  const uint8_t* p = w.data + r * w.cols;
  const uint8_t* srow = w.scale + (r / kFp8Block) * w.scale_cols;
  for (int64_t c0 = 0; c0 < w.cols; c0 += kFp8Block) {
    const float s = t.e8m0[srow[c0 / kFp8Block]];
    const int64_t c1 = std::min(c0 + kFp8Block, w.cols);
    for (int64_t c = c0; c < c1; ++c) out[c] = t.e4m3[p[c]] * s;
  }
}

// Shared by both FP4 layouts: codes two per byte (even column in the low nibble), one scale
// byte per `block` columns. `scale_of` maps a scale byte to the float multiplier, and `post`
// is applied after it, so NVFP4 gets (e2m1 * e4m3) * scale2 in exactly that order.
template <int64_t kBlock, typename ScaleFn>
void row_fp4(const QWeight& w, int64_t r, float* out, ScaleFn scale_of, float post) {
  const Tables& t = tables();
  const uint8_t* p = w.data + r * (w.cols / 2);
  const uint8_t* srow = w.scale + r * w.scale_cols;
  for (int64_t c0 = 0; c0 < w.cols; c0 += kBlock) {
    const float s = scale_of(srow[c0 / kBlock]);
    const int64_t c1 = std::min(c0 + kBlock, w.cols);
    for (int64_t c = c0; c < c1; c += 2) {
      const uint8_t byte = p[c / 2];
      out[c] = (t.e2m1[byte & 0x0F] * s) * post;
      out[c + 1] = (t.e2m1[byte >> 4] * s) * post;
    }
  }
}

void check_row(const QWeight& w, int64_t r) {
  if (w.empty()) throw Error("dequant_row: weight '" + w.name + "' has no data");
  if (r < 0 || r >= w.rows) {
    throw Error("dequant_row: row " + std::to_string(r) + " out of range for '" + w.name +
                "' with " + std::to_string(w.rows) + " rows");
  }
  // The FP4 loops decode whole bytes (two columns), so an odd width would write past the row.
  if ((w.fmt == WFormat::MXFP4 || w.fmt == WFormat::NVFP4) && w.cols % 2 != 0) {
    throw Error("dequant_row: FP4 weight '" + w.name + "' has odd cols " + std::to_string(w.cols));
  }
}

}  // namespace

const char* wformat_name(WFormat f) {
  switch (f) {
    case WFormat::F32: return "F32";
    case WFormat::BF16: return "BF16";
    case WFormat::F16: return "F16";
    case WFormat::FP8Block: return "FP8Block";
    case WFormat::MXFP4: return "MXFP4";
    case WFormat::NVFP4: return "NVFP4";
  }
  return "?";
}

size_t QWeight::stored_bytes() const {
  const auto n = static_cast<size_t>(rows * cols);
  switch (fmt) {
    case WFormat::F32: return n * 4;
    case WFormat::BF16:
    case WFormat::F16: return n * 2;
    case WFormat::FP8Block:
      return n + static_cast<size_t>(ceil_div(rows, kFp8Block) * scale_cols);
    case WFormat::MXFP4:
    case WFormat::NVFP4:
      // The scalar scale2 is a separate 4-byte tensor and not counted here.
      return static_cast<size_t>(rows * (cols / 2) + rows * scale_cols);
  }
  return 0;
}

void measure_scale_range(QWeight& w) {
  if (w.fmt != WFormat::MXFP4 || w.scale == nullptr) return;
  const int64_t nb = ceil_div(w.cols, kMxBlock);
  uint8_t lo = 255, hi = 0;
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* s = w.scale + r * w.scale_cols;
    for (int64_t b = 0; b < nb; ++b) {  // vectorised by the compiler (byte min / max)
      lo = std::min(lo, s[b]);
      hi = std::max(hi, s[b]);
    }
  }
  if (lo <= hi) {  // else no blocks: keep the whole range
    w.scale_lo = lo;
    w.scale_hi = hi;
  }
}

void dequant_row(const QWeight& w, int64_t r, float* out) {
  check_row(w, r);
  const Tables& t = tables();
  switch (w.fmt) {
    case WFormat::F32: return row_f32(w, r, out);
    case WFormat::BF16: return row_bf16(w, r, out);
    case WFormat::F16: return row_f16(w, r, out);
    case WFormat::FP8Block: return row_fp8_block(w, r, out);
    case WFormat::MXFP4:
      // Multiplying by a power of two is exact, so the trailing "* 1" changes nothing.
      return row_fp4<kMxBlock>(w, r, out, [&](uint8_t b) { return t.e8m0[b]; }, 1.0f);
    case WFormat::NVFP4:
      return row_fp4<kNvBlock>(w, r, out, [&](uint8_t b) { return t.e4m3[b]; }, w.scale2);
  }
}

std::vector<float> dequant_all(const QWeight& w) {
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r) dequant_row(w, r, out.data() + r * w.cols);
  return out;
}

}  // namespace dsv4
