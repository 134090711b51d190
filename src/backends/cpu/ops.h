#pragma once
// CPU reference primitives of the DeepSeek-V4 forward, in float32. Each one has a test
// against plain math (tests/test_ops.cpp). Matrices are row-major.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/weight.h"
#include "io/config.h"
#include "kernels/cpu/qmatmul.h"
#include "model/rope.h"

namespace dsv4 {

// y[t*ldy + (r - r0)] = dot(W[r, :], x[t*ldx : t*ldx + cols]) for r in [r0, r1), t < T.
// Each weight row is dequantised once and reused for all T tokens; rows run in parallel.
void matmul(const QWeight& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y, int64_t ldy);
// Whole weight, dense output [T, rows].
void matmul(const QWeight& w, const float* x, int64_t T, float* y);
// Several independent matmuls, each as matmul would compute it, as one job where they can be
// (qmatmul_many).
void matmul_many(const Matmul* calls, int64_t n);

// A float32 matrix [rows, cols] in memory, viewed as a weight (mHC mixers, cached keys).
QWeight f32_weight(const float* data, int64_t rows, int64_t cols);

float dot(const float* a, const float* b, int64_t n);

// Totals over every matmul call so far (for benchmarks): weight bytes read in their stored form
// and multiply-add FLOPs (2 per weight per token, plus attention's products: count_matmul_flops).
struct MatmulCounters {
  uint64_t weight_bytes = 0, flops = 0;
};
MatmulCounters matmul_counters();
// Time inside matmul per weight format and shape (`dsv4 bench --profile`). Off by default; when
// on, every call reads the clock twice. One row per (format, rows x cols, small or large T).
struct MatmulProfileRow {
  std::string what;  // e.g. "FP8Block 32768x1024 T=1"
  int64_t calls = 0;
  double seconds = 0;
  uint64_t weight_bytes = 0, flops = 0;
};
void set_matmul_profiling(bool on);
// The rows since the last call, most time first; starts a new period.
std::vector<MatmulProfileRow> take_matmul_profile();

// The same profile for the stages outside matmul that grow with the context (the indexer's
// scan, attention over cached entries, the compressors), timed while matmul profiling is on.
struct StageProfileRow {
  std::string what;  // e.g. "attend CSA"
  int64_t calls = 0;
  double seconds = 0;
};
std::vector<StageProfileRow> take_stage_profile();  // most time first; starts a new period
class StageTimer {
 public:
  StageTimer(const char* what, const char* detail = nullptr);  // "what detail"
  ~StageTimer();
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

 private:
  const char *what_, *detail_;
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

// Adds the FLOPs of a matrix product that does not go through matmul (attention's products over
// cached keys: they are real multiply-adds of the forward, but read no weights).
void count_matmul_flops(uint64_t flops);

// 1 / sqrt(mean(x^2) + eps), the sum of squares in double.
float inv_rms(const float* x, int64_t n, double eps);

// y = w * x / sqrt(mean(x^2) + eps); w may be null (unweighted). In place allowed.
void rmsnorm(const float* x, const float* w, int64_t n, double eps, float* y);

// Sylvester-ordered Walsh-Hadamard transform times n^-1/2 (n a power of two), in place.
void hadamard(float* x, int64_t n);

float silu(float x);
float softplus(float x);
float sigmoid(float x);

// Indices of the k largest values in descending order: core/rank_key.h's order (ties to the
// lower index, -0 = +0, NaN last).
std::vector<int32_t> topk(const float* v, int64_t n, int64_t k);

}  // namespace dsv4
