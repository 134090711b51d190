// The machine-limit probes of dsv4 bench and qmatmul_bench (src/tools/roofline.cpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

#include "tools/roofline.h"

namespace dsv4 {
namespace {

// The read probe's two access patterns (one stream, and many interleaved streams with a
// sequential remainder) must each read every float exactly once: small integers sum exactly in
// float, so both sums equal the true total, for lengths that do and do not split evenly.
TEST(Roofline, ReadProbeCoversEveryFloatOnce) {
  for (size_t n : {size_t{64}, size_t{1024}, size_t{16 * 64 * 3}, size_t{16 * 64 * 5 + 64 * 7}, size_t{1} << 16}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::unique_ptr<float, decltype(&std::free)> buf(static_cast<float*>(std::aligned_alloc(64, n * sizeof(float))),
                                                     &std::free);
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
      buf.get()[i] = static_cast<float>((i * 7 + i / 64) % 4);
      total += buf.get()[i];
    }
    EXPECT_EQ(static_cast<double>(probe_read_sum(buf.get(), n, false)), total);
    EXPECT_EQ(static_cast<double>(probe_read_sum(buf.get(), n, true)), total);
  }
}

TEST(Roofline, ReadBandwidthIsPositive) { EXPECT_GT(measure_read_bandwidth(size_t{1} << 24, 1), 0.0); }

}  // namespace
}  // namespace dsv4
