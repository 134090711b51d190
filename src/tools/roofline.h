#pragma once
// The machine's limits, measured in the same run as a benchmark: streaming read bandwidth over
// a buffer much larger than the caches, and the peak FMA rate of all pool threads.
#include <cstddef>

namespace dsv4 {

// GB/s (1e9 bytes) of a multi-threaded streaming read of `bytes` bytes, best of `reps`.
double measure_read_bandwidth(size_t bytes, int reps);
// GFLOP/s (an FMA counts 2) of independent FMA chains on every pool thread, best of `reps`.
double measure_peak_gflops(int reps);

}  // namespace dsv4
