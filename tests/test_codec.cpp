// Compact cache storage is lossless for the values the model stores.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/formats.h"
#include "kv/codec.h"
#include "kv/state.h"

using namespace dsv4;

TEST(KvCodec, LosslessOnFp8SimulatedVectors) {
  std::mt19937 rng(1);
  for (float spread : {1e-6f, 1e-3f, 1.0f, 50.0f, 3e4f}) {
    std::normal_distribution<float> nd(0.0f, spread);
    KvCodec c{512, 64};
    ASSERT_EQ(c.bytes(), 448u + 7u + 256u);
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<float> v(512), back(512);
      for (float& x : v) x = nd(rng);
      if (rep % 7 == 0) std::fill(v.begin(), v.begin() + 64, 0.0f);  // an all-zero block
      fp8sim(v.data(), 448, 64);
      std::vector<uint8_t> bytes(c.bytes());
      c.encode(v.data(), bytes.data());
      c.decode(bytes.data(), back.data());
      for (int i = 0; i < 512; ++i) ASSERT_EQ(back[i], v[i]) << "spread " << spread << " i " << i;
    }
  }
}

TEST(Fp4Codec, LosslessOnFp4SimulatedVectors) {
  std::mt19937 rng(2);
  Fp4Codec c{128};
  ASSERT_EQ(c.bytes(), 64u + 4u);
  for (float spread : {1e-5f, 0.1f, 1.0f, 1e3f}) {
    std::normal_distribution<float> nd(0.0f, spread);
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<float> v(128), back(128);
      for (float& x : v) x = nd(rng);
      fp4sim(v.data(), 128, 32);
      std::vector<uint8_t> bytes(c.bytes());
      c.encode(v.data(), bytes.data());
      c.decode(bytes.data(), back.data());
      for (int i = 0; i < 128; ++i) ASSERT_EQ(back[i], v[i]) << i;
    }
  }
}

// Every code at every scale byte decodes to e2m1 * 2^(b-127) as formats.h defines them (the
// decoder uses a table of the codes' values: same floats, -0 included).
TEST(Fp4Codec, DecodeIsCodeTimesScale) {
  Fp4Codec c{32};
  std::vector<uint8_t> bytes(c.bytes());
  std::vector<float> back(32);
  for (int b = 0; b < 255; ++b) {
    for (int i = 0; i < 16; ++i) bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(i | ((15 - i) << 4));
    bytes[16] = static_cast<uint8_t>(b);
    c.decode(bytes.data(), back.data());
    for (int i = 0; i < 32; ++i) {
      const uint8_t code = static_cast<uint8_t>(i % 2 == 0 ? i / 2 : 15 - i / 2);
      const float want = e2m1_to_f32(code) * e8m0_to_f32(static_cast<uint8_t>(b));
      ASSERT_EQ(std::signbit(back[i]), std::signbit(want)) << "scale " << b << " i " << i;
      ASSERT_EQ(back[i], want) << "scale " << b << " i " << i;
    }
  }
}

TEST(CacheCost, BytesPerTokenPerLayerKind) {
  ModelConfig c;
  c.head_dim = 512;
  c.rope_dim = 64;
  c.window = 128;
  c.index_dim = 128;
  const double kv = 448 + 7 + 256;
  EXPECT_DOUBLE_EQ(layer_cache_cost(c, 0).bytes_per_token, 0.0);
  // The window ring holds window + kRewind positions (a rewind must not lose window rows).
  EXPECT_EQ(layer_cache_cost(c, 0).fixed_bytes, static_cast<size_t>((128 + kRewind) * kv));
  EXPECT_DOUBLE_EQ(layer_cache_cost(c, 128).bytes_per_token, kv / 128);
  EXPECT_DOUBLE_EQ(layer_cache_cost(c, 4).bytes_per_token, kv / 4 + 68.0 / 4);
}
