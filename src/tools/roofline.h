#pragma once
// The machine's limits, measured in the same run as a benchmark: streaming read bandwidth over
// a buffer much larger than the caches, and the peak FMA rate of all pool threads.
#include <cstddef>

namespace dsv4 {

// GB/s (1e9 bytes) of a multi-threaded streaming read of `bytes` bytes, best of `reps` and of
// two access patterns (one stream per thread, and many: roofline.cpp).
double measure_read_bandwidth(size_t bytes, int reps);
// The float sum of p[0..n) (n a multiple of 64, p 64-byte aligned) read the way the probe
// reads it on this CPU, as one stream or as many; for tests: both cover every float once.
float probe_read_sum(const float* p, size_t n, bool streams);
// GFLOP/s (an FMA counts 2) of independent FMA chains on every pool thread, best of `reps`.
double measure_peak_gflops(int reps);

}  // namespace dsv4
