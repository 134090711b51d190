// Compact cache storage is lossless for the values the model stores.
#include <gtest/gtest.h>

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
