// The forward pass's temporary-buffer arena (core/arena.h).
#include <gtest/gtest.h>

#include <cstdint>

#include "core/arena.h"

using namespace dsv4;

TEST(Arena, ScopesGiveBackInStackOrderAndReuseMemory) {
  Arena a;
  float* first = nullptr;
  {
    Arena::Scope s(a);
    Floats x = a.take(1000);
    first = x.data();
    for (float v : x) EXPECT_EQ(v, 0.0f);
    for (float& v : x) v = 7.0f;
    {
      Arena::Scope inner(a);
      Floats y = a.take(300);
      EXPECT_GE(y.data(), x.data() + 1000);  // after x, not over it
      for (float& v : y) v = -1.0f;
    }
    for (float v : x) EXPECT_EQ(v, 7.0f);   // the inner scope left x alone
    Floats z = a.take(10);                   // the inner scope's memory again
    EXPECT_EQ(reinterpret_cast<uintptr_t>(z.data()) % 64, 0u);
  }
  const int64_t reserved = a.reserved_bytes();
  Arena::Scope s(a);
  Floats again = a.take(1000);
  EXPECT_EQ(again.data(), first);             // same pages on the next step
  for (float v : again) EXPECT_EQ(v, 0.0f);   // zero-filled by default
  EXPECT_EQ(a.reserved_bytes(), reserved);    // nothing new taken from the system
}

TEST(Arena, LargeRequestsGetTheirOwnBlockAndEarlierViewsStayValid) {
  Arena a;
  Arena::Scope s(a);
  Floats small = a.take(16);
  small[0] = 3.0f;
  const int64_t big_n = int64_t{6} << 20;  // larger than the first block
  Floats big = a.take(big_n, /*zero=*/false);
  big[big_n - 1] = 5.0f;
  EXPECT_EQ(small[0], 3.0f);
  EXPECT_EQ(big.size(), big_n);
  EXPECT_GE(a.reserved_bytes(), big_n * 4 + 16 * 4);
  {
    Arena::Scope inner(a);
    Floats after = a.take(100);
    EXPECT_TRUE(after.data() >= big.data() + big_n || after.data() + 100 <= big.data());
  }
}
