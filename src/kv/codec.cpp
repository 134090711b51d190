#include "kv/codec.h"

#include <array>
#include <cmath>
#include <cstring>

#include "core/formats.h"

namespace dsv4 {

namespace {

// The E8M0 byte of the smallest power of two s with amax / s <= limit (s >= 2^-127).
uint8_t block_scale(const float* v, int64_t n, float limit) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(v[i]));
  if (amax == 0) return 0;
  int e;
  std::frexp(pow2_ceil(amax / limit), &e);  // pow2_ceil(...) = 2^(e-1)
  int b = e - 1 + 127;
  return static_cast<uint8_t>(b < 0 ? 0 : b > 254 ? 254 : b);
}

}  // namespace

size_t KvCodec::bytes() const {
  const int64_t nope = dim - rope;
  return static_cast<size_t>(nope + nope / 64 + 4 * rope);
}

void KvCodec::encode(const float* v, uint8_t* out) const {
  const int64_t nope = dim - rope;
  uint8_t* scales = out + nope;
  for (int64_t b = 0; b < nope / 64; ++b) {
    const uint8_t sb = block_scale(v + b * 64, 64, 448.0f);
    scales[b] = sb;
    const float inv = 1.0f / e8m0_to_f32(sb);  // a power of two: exact
    for (int64_t i = b * 64; i < (b + 1) * 64; ++i) out[i] = f32_to_e4m3(v[i] * inv);
  }
  std::memcpy(scales + nope / 64, v + nope, static_cast<size_t>(rope) * sizeof(float));
}

void KvCodec::decode(const uint8_t* in, float* v) const {
  const int64_t nope = dim - rope;
  const uint8_t* scales = in + nope;
  const float* dec = e4m3_table();
  for (int64_t b = 0; b < nope / 64; ++b) {
    const float s = e8m0_to_f32(scales[b]);
    for (int64_t i = b * 64; i < (b + 1) * 64; ++i) v[i] = dec[in[i]] * s;
  }
  std::memcpy(v + nope, scales + nope / 64, static_cast<size_t>(rope) * sizeof(float));
}

size_t Fp4Codec::bytes() const { return static_cast<size_t>(dim / 2 + dim / 32); }

void Fp4Codec::encode(const float* v, uint8_t* out) const {
  uint8_t* scales = out + dim / 2;
  for (int64_t b = 0; b < dim / 32; ++b) {
    const uint8_t sb = block_scale(v + b * 32, 32, 6.0f);
    scales[b] = sb;
    const float inv = 1.0f / e8m0_to_f32(sb);
    for (int64_t i = b * 32; i < (b + 1) * 32; i += 2)
      out[i / 2] = static_cast<uint8_t>(f32_to_e2m1(v[i] * inv) | (f32_to_e2m1(v[i + 1] * inv) << 4));
  }
}

void Fp4Codec::decode(const uint8_t* in, float* v) const {
  // The 16 codes' values once (e2m1_to_f32's): every decode step decodes every index key of the
  // context, and a call per value made this loop 5 ns per value (64K context: ~5 ms per CSA
  // layer and step, docs/perf.md). Same floats, same products.
  static const std::array<float, 16> kValue = [] {
    std::array<float, 16> t{};
    for (int c = 0; c < 16; ++c) t[static_cast<size_t>(c)] = e2m1_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  const uint8_t* scales = in + dim / 2;
  for (int64_t b = 0; b < dim / 32; ++b) {
    const float s = e8m0_to_f32(scales[b]);
    for (int64_t i = b * 32; i < (b + 1) * 32; i += 2) {
      v[i] = kValue[in[i / 2] & 0xF] * s;
      v[i + 1] = kValue[in[i / 2] >> 4] * s;
    }
  }
}

}  // namespace dsv4
