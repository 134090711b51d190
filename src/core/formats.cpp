#include "core/formats.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "core/error.h"

namespace dsv4 {
namespace {

constexpr uint32_t kF32SignMask = 0x80000000u;
constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
constexpr uint32_t kF32Inf = 0x7F800000u;
constexpr uint32_t kF32QuietBit = 0x00400000u;

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float float_of(uint32_t u) { return std::bit_cast<float>(u); }

// Rounds |x| * 2^k to an integer, nearest-even, where abs_bits is the bit pattern of a finite
// non-negative float. Done on the integer significand so it never depends on the FPU rounding
// mode and never double-rounds. The caller keeps the result small (it is used for subnormal
// targets, where the result is at most 1024).
uint32_t round_scaled_to_int(uint32_t abs_bits, int k) {
  const uint32_t biased = abs_bits >> 23;
  uint32_t mant = abs_bits & 0x007FFFFFu;
  int exp2 = -149;  // value = mant * 2^exp2 for f32 subnormals
  if (biased != 0) {
    mant |= 0x00800000u;
    exp2 = static_cast<int>(biased) - 150;
  }
  const int e = exp2 + k;
  if (e >= 0) return mant << e;
  const int shift = -e;
  if (shift >= 25) return 0;  // mant < 2^24, so the value is below 1/2
  const uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return (rem > half || (rem == half && (q & 1u))) ? q + 1u : q;
}

// Drops the low `drop` bits of a bit pattern with round-to-nearest-even. A carry out of the
// mantissa correctly bumps the exponent (and reaches infinity on overflow), which is why the
// normal-range encoders can work on the whole pattern at once.
uint32_t rne_drop_bits(uint32_t v, int drop) {
  const uint32_t lsb = (v >> drop) & 1u;
  return (v + ((1u << (drop - 1)) - 1u) + lsb) >> drop;
}

}  // namespace

// ---------------------------------------------------------------- BF16

float bf16_to_f32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t u = bits_of(f);
  if ((u & kF32AbsMask) > kF32Inf) {
    // Truncating could turn a NaN with only low payload bits into infinity; force quiet.
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  // Round the magnitude alone; the largest finite values carry into exponent 0xFF with a zero
  // mantissa, which is infinity, as RNE requires.
  const uint32_t sign = (u & kF32SignMask) >> 16;
  return static_cast<uint16_t>(sign | rne_drop_bits(u & kF32AbsMask, 16));
}

// ---------------------------------------------------------------- F16

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x03FFu;
  if (exp == 0) {
    // Subnormal (or zero): mant * 2^-24; both factors exact, product exact in f32.
    const float mag = static_cast<float>(mant) * 0x1p-24f;
    return float_of(sign | bits_of(mag));
  }
  if (exp == 31) {
    if (mant == 0) return float_of(sign | kF32Inf);
    return float_of(sign | kF32Inf | kF32QuietBit | (mant << 13));
  }
  // Rebias 15 -> 127.
  return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & kF32AbsMask;
  if (a > kF32Inf) {
    return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x03FFu));  // quiet NaN
  }
  if (a >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 2^16 (incl. inf)
  if (a >= 0x38800000u) {
    // Normal f16 range [2^-14, 2^16): rebias 127 -> 15 and round off 13 bits. Values at or
    // above 65520 carry into exponent 31 with mantissa 0, i.e. infinity, as RNE requires.
    const uint32_t rebiased = a - (112u << 23);
    return static_cast<uint16_t>(sign | rne_drop_bits(rebiased, 13));
  }
  // Subnormal f16: the code is round(|x| * 2^24); a result of 1024 is the smallest normal,
  // whose encoding is exactly 0x0400, so no special case is needed.
  return static_cast<uint16_t>(sign | round_scaled_to_int(a, 24));
}

// ---------------------------------------------------------------- E4M3FN

float e4m3_to_f32(uint8_t b) {
  const bool neg = (b & 0x80u) != 0;
  const int exp = (b >> 3) & 0x0F;
  const int mant = b & 0x07;
  float mag;
  if (exp == 15 && mant == 7) {
    mag = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    mag = static_cast<float>(mant) * 0x1p-9f;
  } else {
    mag = std::ldexp(static_cast<float>(8 + mant), exp - 7 - 3);
  }
  return neg ? -mag : mag;
}

uint8_t f32_to_e4m3(float f) {
  const uint32_t u = bits_of(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & kF32AbsMask;
  if (a > kF32Inf) return 0x7F;
  // Anything above 448 (which rounds to 448 or to the non-existent 480) saturates; infinity
  // too, since the format has none and we saturate rather than produce NaN.
  if (a > bits_of(448.0f)) return static_cast<uint8_t>(sign | 0x7Eu);
  if (a >= bits_of(0x1p-6f)) {
    // Normal range: rebias 127 -> 7, keep 3 mantissa bits. Cannot carry past 0x7E here.
    const uint32_t rebiased = a - (120u << 23);
    return static_cast<uint8_t>(sign | rne_drop_bits(rebiased, 20));
  }
  // Subnormal: code = round(|x| * 2^9); 8 is the smallest normal, encoded as 0x08.
  return static_cast<uint8_t>(sign | round_scaled_to_int(a, 9));
}

// ---------------------------------------------------------------- E8M0

float e8m0_to_f32(uint8_t b) {
  if (b == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  // 2^-127 is a float subnormal: set the top mantissa bit instead of the exponent.
  if (b == 0) return float_of(0x00400000u);
  return float_of(static_cast<uint32_t>(b) << 23);
}

// ---------------------------------------------------------------- E2M1

const float* e4m3_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = e4m3_to_f32(static_cast<uint8_t>(b));
    return t;
  }();
  return table.data();
}

float e2m1_to_f32(uint8_t code) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float mag = kMag[code & 7u];
  return (code & 8u) ? -mag : mag;
}

uint8_t f32_to_e2m1(float f) {
  const uint8_t sign = (bits_of(f) & kF32SignMask) ? 8u : 0u;
  const float a = std::fabs(f);
  if (std::isnan(a)) return 0;  // no NaN in E2M1; treat as zero
  // Thresholds are the midpoints between neighbours; a tie goes to the even code (mantissa
  // bit 0), so "<=" where the lower neighbour is even and "<" where the upper one is.
  uint8_t mag;
  if (a <= 0.25f) mag = 0;
  else if (a < 0.75f) mag = 1;
  else if (a <= 1.25f) mag = 2;
  else if (a < 1.75f) mag = 3;
  else if (a <= 2.5f) mag = 4;
  else if (a < 3.5f) mag = 5;
  else if (a <= 5.0f) mag = 6;
  else mag = 7;  // saturate at 6
  return static_cast<uint8_t>(sign | mag);
}

// ---------------------------------------------------------------- pow2_ceil

float pow2_ceil(float y) {
  const uint32_t u = bits_of(y);
  if (!(y > 0.0f) || !std::isfinite(y)) return y;  // outside the contract; pass through
  const uint32_t biased = u >> 23;
  const uint32_t mant = u & 0x007FFFFFu;
  if (biased == 0) {
    // Subnormal: value = mant * 2^-149, so the answer is bit_ceil(mant) in the same units;
    // 2^23 lands on the smallest normal's encoding, which is exactly right.
    return float_of(std::bit_ceil(mant));
  }
  if (mant == 0) return y;                // already a power of two
  return float_of((biased + 1u) << 23);   // 2^128 becomes +inf, the only honest answer
}

// ---------------------------------------------------------------- simulations

namespace {

void check_blocks(size_t n, size_t block) {
  if (block == 0 || n % block != 0) {
    throw Error("activation simulation: n=" + std::to_string(n) +
                " is not a multiple of block=" + std::to_string(block));
  }
}

float block_amax(const float* x, size_t block) {
  float amax = 0.0f;
  for (size_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

}  // namespace

void fp8sim(float* x, size_t n, size_t block) {
  check_blocks(n, block);
  const float* dec = e4m3_table();
  for (size_t b0 = 0; b0 < n; b0 += block) {
    float* xb = x + b0;
    const float amax = std::max(block_amax(xb, block), 1e-4f);
    const float scale = pow2_ceil(amax / 448.0f);
    for (size_t i = 0; i < block; ++i) {
      const float q = std::clamp(xb[i] / scale, -448.0f, 448.0f);
      xb[i] = dec[f32_to_e4m3(q)] * scale;
    }
  }
}

void fp4sim(float* x, size_t n, size_t block) {
  check_blocks(n, block);
  const float floor_amax = 6.0f * 0x1p-126f;
  for (size_t b0 = 0; b0 < n; b0 += block) {
    float* xb = x + b0;
    const float amax = std::max(block_amax(xb, block), floor_amax);
    const float scale = pow2_ceil(amax / 6.0f);
    // e2m1_to_f32(f32_to_e2m1(q)) without branches (the same thresholds, ties to even; NaN to
    // +0, -0 kept): the magnitude as the sum of the grid's steps that |q| passes. The seven
    // branches of f32_to_e2m1 mispredicted on activations; this loop vectorises.
    for (size_t i = 0; i < block; ++i) {
      const float v = xb[i] / scale;
      const float a = std::fabs(v);  // the clamp to 6 changes no step below
      const float mag = (a > 0.25f ? 0.5f : 0.0f) + (a >= 0.75f ? 0.5f : 0.0f) + (a > 1.25f ? 0.5f : 0.0f) +
                        (a >= 1.75f ? 0.5f : 0.0f) + (a > 2.5f ? 1.0f : 0.0f) + (a >= 3.5f ? 1.0f : 0.0f) +
                        (a > 5.0f ? 2.0f : 0.0f);
      const uint32_t sign = v == v ? bits_of(v) & kF32SignMask : 0u;  // NaN: +0
      xb[i] = float_of(bits_of(mag) | sign) * scale;
    }
  }
}

}  // namespace dsv4
