// Weight dequantisation: small tensors built by hand in each stored format, with the expected
// floats computed here from the format definitions (not through the library's decoders).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/weight.h"

using namespace dsv4;

namespace {

float ref_e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return static_cast<float>((b & 0x80) ? -mag : mag);
}

float ref_e8m0(uint8_t b) { return static_cast<float>(std::ldexp(1.0, b - 127)); }

float ref_e2m1(uint8_t c) {
  const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (c & 8) ? -mags[c & 7] : mags[c & 7];
}

// A byte that is a finite e4m3 value (0x7F / 0xFF are NaN).
uint8_t finite_e4m3(uint32_t v) {
  const auto b = static_cast<uint8_t>(v);
  return (b & 0x7F) == 0x7F ? static_cast<uint8_t>(b ^ 0x01) : b;
}

void expect_rows_match(const QWeight& w, const std::vector<float>& want) {
  ASSERT_EQ(want.size(), static_cast<size_t>(w.rows * w.cols));
  const std::vector<float> all = dequant_all(w);
  ASSERT_EQ(all.size(), want.size());
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    dequant_row(w, r, row.data());
    for (int64_t c = 0; c < w.cols; ++c) {
      const size_t i = static_cast<size_t>(r * w.cols + c);
      ASSERT_EQ(std::bit_cast<uint32_t>(row[c]), std::bit_cast<uint32_t>(want[i]))
          << w.name << " row " << r << " col " << c << ": " << row[c] << " vs " << want[i];
      ASSERT_EQ(std::bit_cast<uint32_t>(all[i]), std::bit_cast<uint32_t>(want[i]))
          << w.name << " (all) row " << r << " col " << c;
    }
  }
}

}  // namespace

TEST(Weight, FormatNames) {
  std::set<std::string> names;
  for (WFormat f : {WFormat::F32, WFormat::BF16, WFormat::F16, WFormat::FP8Block, WFormat::MXFP4,
                    WFormat::NVFP4}) {
    const std::string n = wformat_name(f);
    EXPECT_FALSE(n.empty());
    names.insert(n);
  }
  EXPECT_EQ(names.size(), 6u);
  EXPECT_STREQ(wformat_name(WFormat::FP8Block), "FP8Block");
}

TEST(Weight, F32) {
  const std::vector<float> v = {1.0f, -2.5f, 0.0f, 3e-40f, 1e30f, -0.0f};
  QWeight w;
  w.fmt = WFormat::F32;
  w.rows = 2;
  w.cols = 3;
  w.data = reinterpret_cast<const uint8_t*>(v.data());
  w.name = "f32";
  expect_rows_match(w, v);
  EXPECT_EQ(w.stored_bytes(), 24u);
}

TEST(Weight, Bf16) {
  // bf16 is the top half of f32, so values with <= 8 significant bits have known codes.
  const std::vector<float> v = {1.0f, -2.5f, 0.15625f, 3.0f * 0x1p-130f, 65536.0f, -0.0f,
                                0x1p-133f, 255.0f};
  std::vector<uint16_t> codes;
  for (float f : v) codes.push_back(static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16));
  EXPECT_EQ(codes[0], 0x3F80);
  EXPECT_EQ(codes[1], 0xC020);
  // Store through bytes at an odd offset: the payload has no alignment promise.
  std::vector<uint8_t> buf(1 + codes.size() * 2);
  std::memcpy(buf.data() + 1, codes.data(), codes.size() * 2);
  QWeight w;
  w.fmt = WFormat::BF16;
  w.rows = 2;
  w.cols = 4;
  w.data = buf.data() + 1;
  w.name = "bf16";
  expect_rows_match(w, v);
  EXPECT_EQ(w.stored_bytes(), 16u);
}

TEST(Weight, F16) {
  const std::vector<uint16_t> codes = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x3E00, 0x8000, 0x0400};
  const std::vector<float> v = {1.0f, -2.0f, 0.5f, 65504.0f, 0x1p-24f, 1.5f, -0.0f, 0x1p-14f};
  QWeight w;
  w.fmt = WFormat::F16;
  w.rows = 4;
  w.cols = 2;
  w.data = reinterpret_cast<const uint8_t*>(codes.data());
  w.name = "f16";
  expect_rows_match(w, v);
  EXPECT_EQ(w.stored_bytes(), 16u);
}

TEST(Weight, Fp8BlockRaggedEdges) {
  // 130 x 260: the scale grid is [2, 3], with partial blocks in both dimensions.
  const int64_t rows = 130, cols = 260, srows = 2, scols = 3;
  std::vector<uint8_t> data(rows * cols);
  std::mt19937 rng(42);
  for (auto& b : data) b = finite_e4m3(rng());
  const std::vector<uint8_t> scale = {127, 128, 120, 130, 100, 135};  // all distinct
  std::vector<float> want(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t s = scale[(r / 128) * scols + c / 128];
      want[r * cols + c] = ref_e4m3(data[r * cols + c]) * ref_e8m0(s);
    }
  }
  QWeight w;
  w.fmt = WFormat::FP8Block;
  w.rows = rows;
  w.cols = cols;
  w.data = data.data();
  w.scale = scale.data();
  w.scale_cols = scols;
  w.name = "fp8";
  expect_rows_match(w, want);
  EXPECT_EQ(w.stored_bytes(), static_cast<size_t>(rows * cols + srows * scols));

  // Spot checks by hand at block corners: code 0x38 = 1.0, 0x3C = 1.5, 0xC0 = -2.0.
  data[0] = 0x38;                       // block (0,0), scale 2^0
  data[127 * cols + 128] = 0x3C;        // block (0,1), scale 2^1
  data[128 * cols + 259] = 0xC0;        // block (1,2), scale 2^8
  data[129 * cols + 0] = 0x01;          // block (1,0), scale 2^3, smallest subnormal 2^-9
  std::vector<float> row(cols);
  dequant_row(w, 0, row.data());
  EXPECT_EQ(row[0], 1.0f);
  dequant_row(w, 127, row.data());
  EXPECT_EQ(row[128], 3.0f);
  dequant_row(w, 128, row.data());
  EXPECT_EQ(row[259], -512.0f);
  dequant_row(w, 129, row.data());
  EXPECT_EQ(row[0], 0x1p-6f);
}

TEST(Weight, Mxfp4) {
  const int64_t rows = 3, cols = 64, scols = 2;
  std::vector<uint8_t> data(rows * cols / 2);
  std::mt19937 rng(7);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  // Includes 0 (2^-127, a float subnormal) and a large exponent.
  const std::vector<uint8_t> scale = {127, 0, 130, 200, 118, 126};
  std::vector<float> want(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = data[r * cols / 2 + c / 2];
      const uint8_t code = (c % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
      want[r * cols + c] = ref_e2m1(code) * ref_e8m0(scale[r * scols + c / 32]);
    }
  }
  QWeight w;
  w.fmt = WFormat::MXFP4;
  w.rows = rows;
  w.cols = cols;
  w.data = data.data();
  w.scale = scale.data();
  w.scale_cols = scols;
  w.name = "mxfp4";
  expect_rows_match(w, want);
  EXPECT_EQ(w.stored_bytes(), static_cast<size_t>(rows * cols / 2 + rows * scols));

  // Nibble order by hand: byte 0x72 -> col 0 = code 2 (1.0), col 1 = code 7 (6.0); row 0's
  // first scale is 2^0. Byte 0x9B in row 2's second block (scale 2^-1): col 32 = code 0xB
  // (-1.5), col 33 = code 0x9 (-0.5).
  data[0] = 0x72;
  data[2 * cols / 2 + 16] = 0x9B;
  std::vector<float> row(cols);
  dequant_row(w, 0, row.data());
  EXPECT_EQ(row[0], 1.0f);
  EXPECT_EQ(row[1], 6.0f);
  dequant_row(w, 2, row.data());
  EXPECT_EQ(row[32], -0.75f);
  EXPECT_EQ(row[33], -0.25f);
}

TEST(Weight, Nvfp4) {
  const int64_t rows = 2, cols = 48, scols = 3;
  std::vector<uint8_t> data(rows * cols / 2);
  std::mt19937 rng(9);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const std::vector<uint8_t> scale = {0x38, 0x3C, 0x01, 0xB5, 0x7E, 0x0B};  // 1, 1.5, 2^-9, ...
  const float scale2 = 0.1f;  // not a power of two: the multiplication order is observable
  std::vector<float> want(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = data[r * cols / 2 + c / 2];
      const uint8_t code = (c % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
      want[r * cols + c] = ref_e2m1(code) * ref_e4m3(scale[r * scols + c / 16]) * scale2;
    }
  }
  QWeight w;
  w.fmt = WFormat::NVFP4;
  w.rows = rows;
  w.cols = cols;
  w.data = data.data();
  w.scale = scale.data();
  w.scale_cols = scols;
  w.scale2 = scale2;
  w.name = "nvfp4";
  expect_rows_match(w, want);
  EXPECT_EQ(w.stored_bytes(), static_cast<size_t>(rows * cols / 2 + rows * scols));

  // By hand: code 3 (1.5) in block 1 of row 0 (scale 0x3C = 1.5) -> 2.25 * 0.1f.
  data[8] = 0x03;  // cols 16 (low) and 17 (high = 0)
  std::vector<float> row(cols);
  dequant_row(w, 0, row.data());
  EXPECT_EQ(row[16], 2.25f * 0.1f);
  EXPECT_EQ(row[17], 0.0f);
}

// Every finite scale byte against every code, in both FP4 layouts. For NVFP4, scale2 = 0.1f
// makes (e2m1 * e4m3) * scale2 differ from e2m1 * (e4m3 * scale2) for many scale bytes (e.g.
// 0x0B with code 1.5), so the multiplication order the format defines is pinned down.
TEST(Weight, Fp4AllScalesAllCodes) {
  for (WFormat fmt : {WFormat::MXFP4, WFormat::NVFP4}) {
    const bool nv = fmt == WFormat::NVFP4;
    const int64_t block = nv ? 16 : 32, nblocks = 4, cols = nblocks * block;
    std::vector<uint8_t> scales;
    for (int b = 0; b < 256; ++b) {
      if (nv ? (b & 0x7F) != 0x7F : b != 0xFF) scales.push_back(static_cast<uint8_t>(b));
    }
    const auto rows = static_cast<int64_t>(scales.size());
    std::vector<uint8_t> data(rows * cols / 2), scale(rows * nblocks);
    std::vector<float> want(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < nblocks; ++k) scale[r * nblocks + k] = scales[(r + k) % rows];
      // Both nibble positions run through all 16 codes, each under every scale byte.
      for (int64_t j = 0; j < cols / 2; ++j) {
        data[r * cols / 2 + j] = static_cast<uint8_t>((j + r) % 16 | ((j * 3 + 5) % 16) << 4);
      }
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t byte = data[r * cols / 2 + c / 2];
        const uint8_t code = (c % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
        const uint8_t sb = scale[r * nblocks + c / block];
        want[r * cols + c] = nv ? ref_e2m1(code) * ref_e4m3(sb) * 0.1f : ref_e2m1(code) * ref_e8m0(sb);
      }
    }
    QWeight w;
    w.fmt = fmt;
    w.rows = rows;
    w.cols = cols;
    w.data = data.data();
    w.scale = scale.data();
    w.scale_cols = nblocks;
    w.scale2 = 0.1f;
    w.name = wformat_name(fmt);
    expect_rows_match(w, want);
  }
}

TEST(Weight, RowOutOfRangeAndEmpty) {
  const std::vector<float> v(6, 1.0f);
  QWeight w;
  w.fmt = WFormat::F32;
  w.rows = 2;
  w.cols = 3;
  w.name = "x";
  std::vector<float> row(3);
  EXPECT_TRUE(w.empty());
  EXPECT_THROW(dequant_row(w, 0, row.data()), Error);
  w.data = reinterpret_cast<const uint8_t*>(v.data());
  EXPECT_THROW(dequant_row(w, 2, row.data()), Error);
  EXPECT_THROW(dequant_row(w, -1, row.data()), Error);
  EXPECT_NO_THROW(dequant_row(w, 1, row.data()));
}
