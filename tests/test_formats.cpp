// Scalar format conversions, checked against plain math written independently here: decoders
// against ldexp formulas over every code, encoders against a double-precision round-to-nearest-
// even reference, on every representable value, every midpoint and its neighbours.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/formats.h"

using namespace dsv4;

namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// Same float, including the sign of zero (NaN handled by callers).
bool same(float a, float b) { return a == b && std::signbit(a) == std::signbit(b); }

// Rounds x to a binary format with `mbits` stored mantissa bits and minimum normal exponent
// `emin`, nearest-even, unbounded above. Everything is exact in double: x has 24 significant
// bits and the quantum is a power of two.
double ref_round(double x, int mbits, int emin) {
  if (x == 0.0) return x;
  const double a = std::fabs(x);
  int k;
  std::frexp(a, &k);  // a = f * 2^k, f in [0.5, 1) => floor(log2 a) = k - 1
  const int e = std::max(k - 1, emin);
  const double q = std::ldexp(1.0, e - mbits);
  const double r = a / q;
  double n = std::floor(r);
  const double frac = r - n;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(n, 2.0) != 0.0)) n += 1.0;
  const double out = n * q;
  return std::signbit(x) ? -out : out;
}

// Reference IEEE-style encode result as a float value: overflow goes to infinity.
float ref_ieee(float x, int mbits, int emin, int emax) {
  const double r = ref_round(x, mbits, emin);
  if (std::fabs(r) >= std::ldexp(1.0, emax + 1)) return std::copysign(INFINITY, x);
  return static_cast<float>(r);
}

// Reference E4M3FN encode as a value: saturate to +-448.
float ref_e4m3(float x) {
  const double r = ref_round(x, 3, -6);
  if (std::fabs(r) > 448.0) return std::copysign(448.0f, x);
  return static_cast<float>(r);
}

double e4m3_formula(int b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}

bool e4m3_is_nan_code(int b) { return (b & 0x7F) == 0x7F; }

}  // namespace

// ------------------------------------------------------------------------------ BF16

TEST(Bf16, DecodeAllCodes) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const int s = h >> 15, e = (h >> 7) & 0xFF, m = h & 0x7F;
    const float got = bf16_to_f32(static_cast<uint16_t>(h));
    if (e == 255) {
      if (m == 0) {
        EXPECT_TRUE(std::isinf(got)) << h;
        EXPECT_EQ(std::signbit(got), s == 1) << h;
      } else {
        EXPECT_TRUE(std::isnan(got)) << h;
      }
      continue;
    }
    double mag = e == 0 ? std::ldexp(m, -126 - 7) : std::ldexp(128 + m, e - 127 - 7);
    const float want = static_cast<float>(s ? -mag : mag);
    EXPECT_TRUE(same(got, want)) << std::hex << h << " got " << got << " want " << want;
  }
}

TEST(Bf16, RoundTripAllNonNanCodes) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_bf16(f), h) << std::hex << h;
  }
}

TEST(Bf16, EncodeRandomBitsMatchesReferences) {
  std::mt19937 rng(1234);
  std::vector<uint32_t> patterns;
  for (int i = 0; i < 2000000; ++i) patterns.push_back(rng());
  // Exact ties and their neighbours across exponents, including the overflow boundary.
  for (uint32_t hi = 0; hi < 65536; hi += 7) {
    for (uint32_t lo : {0x7FFFu, 0x8000u, 0x8001u, 0x0001u, 0xFFFFu}) patterns.push_back(hi << 16 | lo);
  }
  patterns.push_back(0x7F7FFFFFu);  // FLT_MAX -> inf
  patterns.push_back(0x7F7F7FFFu);  // just below the overflow midpoint -> max finite
  patterns.push_back(0x7F7F8000u);  // overflow midpoint (max finite is odd) -> inf
  for (uint32_t u : patterns) {
    const float f = from_bits(u);
    const uint16_t got = f32_to_bf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(got))) << std::hex << u;
      EXPECT_TRUE(got & 0x0040) << "quiet bit " << std::hex << u;
      EXPECT_EQ(got >> 15, u >> 31);
      continue;
    }
    // Integer reference: look at the dropped half-word directly.
    uint32_t want = u >> 16;
    const uint32_t rest = u & 0xFFFF;
    if (rest > 0x8000 || (rest == 0x8000 && (want & 1))) ++want;
    ASSERT_EQ(got, want) << std::hex << u;
    // Value reference in double.
    ASSERT_TRUE(same(bf16_to_f32(got), ref_ieee(f, 7, -126, 127))) << std::hex << u;
  }
}

TEST(Bf16, Specials) {
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xFF80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  // A signalling NaN whose payload lives only in the low 16 bits must not become infinity.
  const uint16_t n = f32_to_bf16(from_bits(0x7F800001u));
  EXPECT_TRUE(std::isnan(bf16_to_f32(n)));
  EXPECT_TRUE(n & 0x0040);
  EXPECT_EQ(f32_to_bf16(from_bits(0xFF800001u)) >> 15, 1);
  // f32 subnormals: 2^-149 is far below half a bf16 ulp; 0x8000 in the dropped half is a tie.
  EXPECT_EQ(f32_to_bf16(from_bits(0x00000001u)), 0x0000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000u)), 0x0000);  // tie to even (0)
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000u)), 0x0002);  // tie to even (2)
}

// ------------------------------------------------------------------------------ F16

TEST(F16, DecodeAllCodes) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const int s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    const float got = f16_to_f32(static_cast<uint16_t>(h));
    if (e == 31) {
      if (m == 0) {
        EXPECT_TRUE(std::isinf(got)) << h;
        EXPECT_EQ(std::signbit(got), s == 1) << h;
      } else {
        EXPECT_TRUE(std::isnan(got)) << h;
        EXPECT_TRUE(bits(got) & 0x00400000u) << "quiet " << h;
      }
      continue;
    }
    const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
    const float want = static_cast<float>(s ? -mag : mag);
    EXPECT_TRUE(same(got, want)) << std::hex << h << " got " << got << " want " << want;
  }
}

TEST(F16, EncodeAllValuesMidpointsAndNeighbours) {
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    for (uint32_t s : {0u, 0x8000u}) {
      const uint16_t code = static_cast<uint16_t>(h | s);
      const float v = f16_to_f32(code);
      ASSERT_EQ(f32_to_f16(v), code) << std::hex << code;
      // Midpoint to the next code up in magnitude; the top one is halfway to 2^16 (= inf).
      const double lo = std::fabs(v);
      const double hi = h + 1 == 0x7C00 ? 65536.0 : std::fabs(f16_to_f32(static_cast<uint16_t>(h + 1)));
      const float mid = static_cast<float>((lo + hi) / 2);
      ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2) << "midpoint exact in f32";
      const float sm = s ? -mid : mid;
      const uint16_t even = static_cast<uint16_t>(((h & 1) ? h + 1 : h) | s);
      ASSERT_EQ(f32_to_f16(sm), even) << std::hex << code;
      ASSERT_EQ(f32_to_f16(std::nextafter(sm, 0.0f)), code) << std::hex << code;
      ASSERT_EQ(f32_to_f16(std::nextafter(sm, s ? -INFINITY : INFINITY)), (h + 1) | s)
          << std::hex << code;
    }
  }
}

TEST(F16, EncodeRandomMatchesReference) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> exp(100, 145);  // spans f16 underflow .. overflow
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = rng();
    if (i % 2) u = (u & 0x807FFFFFu) | (static_cast<uint32_t>(exp(rng)) << 23);
    const float f = from_bits(u);
    if (std::isnan(f)) continue;
    ASSERT_TRUE(same(f16_to_f32(f32_to_f16(f)), ref_ieee(f, 10, -14, 15))) << std::hex << u;
  }
}

TEST(F16, Specials) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // tie rounds to even = overflow
  EXPECT_EQ(f32_to_f16(1e10f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xFC00);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7C00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xFC00);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);                    // tie to even (0)
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(-0x1p-25f), 0x8000);
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);                // tie to even (2)
  EXPECT_EQ(f32_to_f16(from_bits(1)), 0x0000);                // f32 subnormal
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-14f, 0.0f)), 0x0400);  // rounds up into normals
  const uint16_t n = f32_to_f16(from_bits(0x7F800001u));
  EXPECT_EQ(n & 0x7C00, 0x7C00);
  EXPECT_NE(n & 0x03FF, 0);
  EXPECT_TRUE(n & 0x0200);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::quiet_NaN()) >> 15, 1);
}

// ------------------------------------------------------------------------------ E4M3

TEST(E4m3, DecodeAllCodes) {
  for (int b = 0; b < 256; ++b) {
    const float got = e4m3_to_f32(static_cast<uint8_t>(b));
    if (e4m3_is_nan_code(b)) {
      EXPECT_TRUE(std::isnan(got)) << b;
      continue;
    }
    EXPECT_TRUE(same(got, static_cast<float>(e4m3_formula(b)))) << b << " got " << got;
  }
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_f32(0x08), 0x1p-6f);
  EXPECT_EQ(e4m3_to_f32(0x78), 256.0f);
}

TEST(E4m3, EncodeAllValuesMidpointsAndNeighbours) {
  for (int h = 0; h <= 0x7E; ++h) {
    for (int s : {0, 0x80}) {
      const uint8_t code = static_cast<uint8_t>(h | s);
      const float v = e4m3_to_f32(code);
      ASSERT_EQ(f32_to_e4m3(v), code) << h;
      if (h == 0x7E) continue;  // beyond 448 is saturation, tested below
      const float lo = std::fabs(v), hi = e4m3_to_f32(static_cast<uint8_t>(h + 1));
      const float mid = (lo + hi) / 2;  // exact: 5 significant bits at most
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(lo) + hi) / 2);
      const float sm = s ? -mid : mid;
      const int even = (h & 1) ? h + 1 : h;
      ASSERT_EQ(f32_to_e4m3(sm), even | s) << h;
      ASSERT_EQ(f32_to_e4m3(std::nextafter(sm, 0.0f)), code) << h;
      ASSERT_EQ(f32_to_e4m3(std::nextafter(sm, s ? -INFINITY : INFINITY)), (h + 1) | s) << h;
    }
  }
}

TEST(E4m3, EncodeRandomMatchesReference) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> exp(110, 140);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = rng();
    if (i % 4) u = (u & 0x807FFFFFu) | (static_cast<uint32_t>(exp(rng)) << 23);
    const float f = from_bits(u);
    if (std::isnan(f)) continue;
    const uint8_t b = f32_to_e4m3(f);
    ASSERT_FALSE(e4m3_is_nan_code(b)) << std::hex << u;
    ASSERT_TRUE(same(e4m3_to_f32(b), ref_e4m3(f))) << std::hex << u << " " << f;
  }
}

TEST(E4m3, SaturationZeroAndNan) {
  for (float big : {448.5f, 449.0f, 463.99f, 464.0f, 464.01f, 480.0f, 1e6f,
                    std::numeric_limits<float>::max(), INFINITY}) {
    EXPECT_EQ(f32_to_e4m3(big), 0x7E) << big;
    EXPECT_EQ(f32_to_e4m3(-big), 0xFE) << big;
  }
  EXPECT_EQ(f32_to_e4m3(432.0f), 0x7E);  // midpoint 416|448: 448 is the even one (m=6)
  EXPECT_EQ(f32_to_e4m3(std::nextafter(432.0f, 0.0f)), 0x7D);
  EXPECT_EQ(f32_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_TRUE(std::signbit(e4m3_to_f32(0x80)));
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);  // half the smallest subnormal: tie to 0
  EXPECT_EQ(f32_to_e4m3(-0x1p-10f), 0x80);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(0x1p-10f, 1.0f)), 0x01);
  EXPECT_EQ(f32_to_e4m3(from_bits(1)), 0x00);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(f32_to_e4m3(from_bits(0x7F800001u)), 0x7F);
}

// ------------------------------------------------------------------------------ E8M0

TEST(E8m0, AllBytes) {
  for (int b = 0; b < 255; ++b) {
    const float got = e8m0_to_f32(static_cast<uint8_t>(b));
    EXPECT_EQ(static_cast<double>(got), std::ldexp(1.0, b - 127)) << b;
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xFF)));
  EXPECT_EQ(bits(e8m0_to_f32(0)), 0x00400000u);  // 2^-127, subnormal, exact
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(254), 0x1p127f);
}

// ------------------------------------------------------------------------------ E2M1

TEST(E2m1, DecodeAllCodes) {
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    const float got = e2m1_to_f32(static_cast<uint8_t>(c));
    const float want = static_cast<float>((c & 8) ? -mags[c & 7] : mags[c & 7]);
    EXPECT_TRUE(same(got, want)) << c;
    // Only the low 4 bits matter.
    EXPECT_TRUE(same(e2m1_to_f32(static_cast<uint8_t>(c | 0xA0)), want)) << c;
  }
}

TEST(E2m1, GridTiesAndSaturation) {
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(static_cast<uint8_t>(c))), c) << c;
  }
  struct Tie { float x; float want; };
  for (Tie t : {Tie{0.25f, 0.0f}, Tie{0.75f, 1.0f}, Tie{1.25f, 1.0f}, Tie{1.75f, 2.0f},
                Tie{2.5f, 2.0f}, Tie{3.5f, 4.0f}, Tie{5.0f, 4.0f}}) {
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(t.x)), t.want) << t.x;
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-t.x)), -t.want) << t.x;
  }
  EXPECT_EQ(f32_to_e2m1(std::nextafter(0.25f, 1.0f)), 1);
  EXPECT_EQ(f32_to_e2m1(std::nextafter(0.75f, 0.0f)), 1);
  EXPECT_EQ(f32_to_e2m1(std::nextafter(1.25f, 2.0f)), 3);
  EXPECT_EQ(f32_to_e2m1(std::nextafter(1.75f, 0.0f)), 3);
  EXPECT_EQ(f32_to_e2m1(std::nextafter(2.5f, 3.0f)), 5);
  EXPECT_EQ(f32_to_e2m1(std::nextafter(3.5f, 0.0f)), 5);
  EXPECT_EQ(f32_to_e2m1(std::nextafter(5.0f, 6.0f)), 7);
  for (float big : {6.0f, 6.5f, 100.0f, INFINITY}) {
    EXPECT_EQ(f32_to_e2m1(big), 7) << big;
    EXPECT_EQ(f32_to_e2m1(-big), 15) << big;
  }
  EXPECT_EQ(f32_to_e2m1(-0.0f), 8);
  EXPECT_EQ(f32_to_e2m1(-0.1f), 8);
  // E2M1 has no NaN; the encoder maps it to +0 rather than to a finite extreme.
  EXPECT_EQ(f32_to_e2m1(std::numeric_limits<float>::quiet_NaN()), 0);
}

TEST(E2m1, DenseSweepMatchesNearestEven) {
  // Brute-force reference: nearest grid value; on a tie the code with mantissa bit 0 wins.
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int i = -8 * 256; i <= 8 * 256; ++i) {
    const float x = static_cast<float>(i) / 256.0f;
    const double a = std::fabs(x);
    int best = 0;
    for (int c = 1; c < 8; ++c) {
      const double d = std::fabs(mags[c] - a), db = std::fabs(mags[best] - a);
      if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    const int want = best | (std::signbit(x) ? 8 : 0);
    ASSERT_EQ(f32_to_e2m1(x), want) << x;
  }
}

// ------------------------------------------------------------------------------ pow2_ceil

TEST(Pow2Ceil, PowersAndNeighbours) {
  for (int k = -149; k <= 127; ++k) {
    const float p = std::ldexp(1.0f, k);
    ASSERT_EQ(pow2_ceil(p), p) << k;
    if (k < 127) {
      ASSERT_EQ(pow2_ceil(std::nextafter(p, INFINITY)), std::ldexp(1.0f, k + 1)) << k;
    }
    // Below 2^-148 the next float down is 2^-149, itself a power of two.
    if (k > -148) {
      ASSERT_EQ(pow2_ceil(std::nextafter(p, 0.0f)), p) << k;
    }
  }
  EXPECT_EQ(pow2_ceil(3.0f), 4.0f);
  EXPECT_EQ(pow2_ceil(0.75f), 1.0f);
  EXPECT_EQ(pow2_ceil(from_bits(3)), from_bits(4));                  // subnormal
  EXPECT_EQ(pow2_ceil(from_bits(0x00400001u)), 0x1p-126f);           // into the normals
  EXPECT_EQ(pow2_ceil(std::numeric_limits<float>::denorm_min()), from_bits(1));
}

TEST(Pow2Ceil, RandomMatchesLog2Reference) {
  std::mt19937 rng(5);
  for (int i = 0; i < 1000000; ++i) {
    const float y = from_bits(rng() & 0x7EFFFFFFu);  // positive, finite, below 2^126
    if (y == 0.0f) continue;
    // In double, log2 of a non-power-of-two float is never rounded onto an integer.
    const double want = std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(static_cast<double>(y)))));
    ASSERT_EQ(static_cast<double>(pow2_ceil(y)), want) << y;
  }
}

// ------------------------------------------------------------------------------ fp8sim

TEST(Fp8Sim, HandComputedBlocks) {
  // Block 1: amax 3.5 -> scale = pow2_ceil(3.5/448 = 2^-7) = 2^-7. Scaled values sit on e4m3
  // midpoints: 100 (96|104 -> 96), 108 (104|112 -> 112), 17 (16|18 -> 16), 1.5*2^-9 (1|2
  // subnormal ulps -> 2), and one just past a midpoint.
  // Block 2: amax 1000 -> 1000/448 = 2.23 -> scale 4. 250 -> 256 (240|256), 0.25, 0.75 exact,
  // 1.975 -> 2 (grid step 0.125 in [1,2)).
  const float s1 = 0x1p-7f;
  std::vector<float> x = {3.5f,        100 * s1,  -108 * s1,  17 * s1,
                          3 * 0x1p-17f, std::nextafter(100 * s1, 1.0f), -0.0f, 448 * s1,
                          1000.0f,     1.0f,      -3.0f,      7.9f};
  const std::vector<float> want = {3.5f,         96 * s1,  -112 * s1, 16 * s1,
                                   2 * 0x1p-16f, 104 * s1, -0.0f,     448 * s1,
                                   1024.0f,      1.0f,     -3.0f,     8.0f};
  fp8sim(x.data(), 8, 8);
  fp8sim(x.data() + 8, 4, 4);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(same(x[i], want[i])) << i << ": " << x[i];
}

TEST(Fp8Sim, AmaxFloor) {
  // max|x| = 2e-6 < 1e-4, so amax = 1e-4 and scale = pow2_ceil(1e-4/448 = 2.23e-7) = 2^-22.
  // 1e-6/2^-22 = 4.19 -> 4; -2e-6/2^-22 = -8.39 -> -8; zero stays zero.
  std::vector<float> x = {0.0f, 1e-6f, -2e-6f, 0.0f};
  fp8sim(x.data(), 4, 4);
  EXPECT_EQ(x[0], 0.0f);
  EXPECT_EQ(x[1], 4 * 0x1p-22f);
  EXPECT_EQ(x[2], -8 * 0x1p-22f);
  EXPECT_EQ(x[3], 0.0f);
  std::vector<float> z(16, 0.0f);
  fp8sim(z.data(), 16, 16);
  for (float v : z) EXPECT_EQ(v, 0.0f);
}

TEST(Fp8Sim, MatchesPerElementReference) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t block = 64, n = block * 200;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = nd(rng) * std::ldexp(1.0f, static_cast<int>(i / block % 40) - 20);
  std::vector<float> y = x;
  fp8sim(y.data(), n, block);
  for (size_t b = 0; b < n; b += block) {
    double amax = 1e-4f;
    for (size_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(static_cast<double>(x[b + i])));
    const double scale = std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(static_cast<float>(amax) / 448.0f))));
    for (size_t i = 0; i < block; ++i) {
      const float q = static_cast<float>(std::clamp(x[b + i] / scale, -448.0, 448.0));
      ASSERT_EQ(static_cast<double>(y[b + i]), ref_e4m3(q) * scale) << b + i;
    }
  }
}

TEST(Fp8Sim, Idempotent) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t block = 32, n = block * 500;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = nd(rng) * std::ldexp(1.0f, static_cast<int>(i / block % 50) - 25);
  // A block whose amax lands just above 224*scale: it rounds down to 224*scale, so the second
  // pass picks a scale half as large; the result must still not move.
  for (size_t i = 0; i < block; ++i) x[i] = 0.001f * static_cast<float>(i);
  x[0] = 225.0f;
  fp8sim(x.data(), n, block);
  std::vector<float> once = x;
  fp8sim(x.data(), n, block);
  for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same(x[i], once[i])) << i;
  EXPECT_EQ(once[0], 224.0f);
}

// ------------------------------------------------------------------------------ fp4sim

TEST(Fp4Sim, HandComputedBlocks) {
  // Block 1: amax 6 -> scale 1; ties go to the even-mantissa neighbour.
  // Block 2: amax 12 -> scale 2: 2.5/2 = 1.25 -> 1, 1/2 = 0.5, -7/2 = -3.5 -> -4.
  // Block 3: amax 7 -> 7/6 -> scale 2: 7/2 = 3.5 -> 4, so the output exceeds the input;
  // 1/2 = 0.5 is on the grid.
  std::vector<float> x = {6.0f, 1.25f, -0.75f, 0.25f, 5.0f, 2.6f, -3.5f, 0.1f,
                          12.0f, 2.5f, 1.0f, -7.0f,
                          7.0f, 0.0f, -0.0f, 1.0f};
  const std::vector<float> want = {6.0f, 1.0f, -1.0f, 0.0f, 4.0f, 3.0f, -4.0f, 0.0f,
                                   12.0f, 2.0f, 1.0f, -8.0f,
                                   8.0f, 0.0f, -0.0f, 1.0f};
  fp4sim(x.data(), 8, 8);
  fp4sim(x.data() + 8, 8, 4);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(same(x[i], want[i])) << i << ": " << x[i];
}

TEST(Fp4Sim, AmaxFloorWithSubnormals) {
  // max|x| = 1.5*2^-126 < 6*2^-126, so scale = 2^-126: subnormal inputs divide exactly.
  // 3*2^-127 -> 1.5 (on grid); 5*2^-128 -> 1.25 -> 1; 2^-128 -> 0.25 -> 0.
  std::vector<float> x = {3 * 0x1p-127f, 5 * 0x1p-128f, -0x1p-128f, 0.0f};
  fp4sim(x.data(), 4, 4);
  EXPECT_EQ(x[0], 3 * 0x1p-127f);
  EXPECT_EQ(x[1], 0x1p-126f);
  EXPECT_TRUE(same(x[2], -0.0f));
  EXPECT_EQ(x[3], 0.0f);
}

// Every element as the per-element definition gives it: clamp(x / scale), f32_to_e2m1,
// e2m1_to_f32, times scale (fp4sim computes it without branches). Blocks of grid points, ties,
// their neighbours, zeros of both signs, NaN, subnormals and random values.
TEST(Fp4Sim, MatchesPerElementReference) {
  std::vector<float> v;
  for (float g : {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f, 7.0f})
    for (float s : {1.0f, -1.0f})
      for (float d : {-1.0f, 0.0f, 1.0f}) v.push_back(s * (d == 0 ? g : std::nextafter(g, g + d)));
  v.push_back(std::numeric_limits<float>::quiet_NaN());
  v.push_back(-std::numeric_limits<float>::quiet_NaN());
  v.push_back(0x1p-140f);
  v.push_back(-0x1p-149f);
  std::mt19937 g(7);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  while (v.size() % 32 != 0 || v.size() < 4096) v.push_back(u(g) * (v.size() % 7 == 0 ? 1e-3f : 1.0f));
  // Blocks with amax 6 (so the scale is 1 and the grid points above are the values quantised),
  // and the same values in blocks of their own amax.
  for (size_t b = 0; b + 32 <= v.size(); b += 32) v[b] = 6.0f;
  for (size_t block : {size_t{32}, size_t{16}}) {
    std::vector<float> got = v;
    fp4sim(got.data(), got.size(), block);
    for (size_t b0 = 0; b0 < v.size(); b0 += block) {
      float amax = 6.0f * 0x1p-126f;
      for (size_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(v[b0 + i]));
      const float scale = pow2_ceil(amax / 6.0f);
      for (size_t i = 0; i < block; ++i) {
        const float want = e2m1_to_f32(f32_to_e2m1(std::clamp(v[b0 + i] / scale, -6.0f, 6.0f))) * scale;
        EXPECT_TRUE(same(got[b0 + i], want)) << "x " << v[b0 + i] << " got " << got[b0 + i] << " want " << want;
      }
    }
  }
}

TEST(Fp4Sim, Idempotent) {
  std::mt19937 rng(8);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t block = 32, n = block * 500;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = nd(rng) * std::ldexp(1.0f, static_cast<int>(i / block % 50) - 25);
  // amax 3.2 rounds to 3 = scale/2 * 6: the second pass uses a halved scale.
  for (size_t i = 0; i < block; ++i) x[i] = 0.1f * static_cast<float>(i % 30);
  x[0] = 3.2f;
  fp4sim(x.data(), n, block);
  std::vector<float> once = x;
  fp4sim(x.data(), n, block);
  for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same(x[i], once[i])) << i;
  EXPECT_EQ(once[0], 3.0f);
}

TEST(ActSim, RejectsPartialBlocks) {
  std::vector<float> x(10, 1.0f);
  EXPECT_THROW(fp8sim(x.data(), 10, 4), Error);
  EXPECT_THROW(fp4sim(x.data(), 10, 4), Error);
  EXPECT_THROW(fp8sim(x.data(), 10, 0), Error);
}
