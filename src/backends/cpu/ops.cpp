#include "backends/cpu/ops.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <string>

#include "core/rank_key.h"
#include "core/threads.h"
#include "kernels/cpu/qmatmul.h"

namespace dsv4 {

float dot(const float* a, const float* b, int64_t n) {
  // 16 partial sums: vectorisable and less rounding drift than one serial chain.
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

namespace {
std::atomic<uint64_t> g_weight_bytes{0}, g_flops{0};
}

MatmulCounters matmul_counters() { return {g_weight_bytes.load(), g_flops.load()}; }

void count_matmul_flops(uint64_t flops) { g_flops += flops; }

namespace {
std::atomic<bool> g_profiling{false};
std::mutex g_profile_mu;
std::map<std::string, MatmulProfileRow> g_profile;
}  // namespace

void set_matmul_profiling(bool on) { g_profiling = on; }

std::vector<MatmulProfileRow> take_matmul_profile() {
  std::lock_guard<std::mutex> lock(g_profile_mu);
  std::vector<MatmulProfileRow> rows;
  for (auto& [k, v] : g_profile) rows.push_back(v);
  g_profile.clear();
  std::sort(rows.begin(), rows.end(), [](const MatmulProfileRow& a, const MatmulProfileRow& b) { return a.seconds > b.seconds; });
  return rows;
}

namespace {
std::map<std::string, StageProfileRow> g_stages;  // guarded by g_profile_mu
}  // namespace

std::vector<StageProfileRow> take_stage_profile() {
  std::lock_guard<std::mutex> lock(g_profile_mu);
  std::vector<StageProfileRow> rows;
  for (auto& [k, v] : g_stages) rows.push_back(v);
  g_stages.clear();
  std::sort(rows.begin(), rows.end(), [](const StageProfileRow& a, const StageProfileRow& b) { return a.seconds > b.seconds; });
  return rows;
}

StageTimer::StageTimer(const char* what, const char* detail) : what_(what), detail_(detail), on_(g_profiling) {
  if (on_) t0_ = std::chrono::steady_clock::now();
}

StageTimer::~StageTimer() {
  if (!on_) return;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const std::string key = detail_ ? std::string(what_) + " " + detail_ : std::string(what_);
  std::lock_guard<std::mutex> lock(g_profile_mu);
  StageProfileRow& row = g_stages[key];
  row.what = key;
  ++row.calls;
  row.seconds += dt;
}

namespace {

uint64_t call_bytes(const QWeight& w, int64_t r0, int64_t r1) {
  return static_cast<uint64_t>(static_cast<double>(w.stored_bytes()) * static_cast<double>(r1 - r0) / static_cast<double>(w.rows));
}

void profile_call(const QWeight& w, int64_t r0, int64_t r1, int64_t T, uint64_t bytes, uint64_t flops, double dt) {
  // Small T (the fused GEMV path) and large T (the GEMM path) apart: the same matrix runs at
  // very different rates on the two.
  const int fused = qmatmul_fused_max_tokens(w.fmt);
  const std::string what = std::string(wformat_name(w.fmt)) + " " + std::to_string(r1 - r0) + "x" + std::to_string(w.cols) +
                           (T <= fused ? " T<=" : " T>") + std::to_string(fused);
  std::lock_guard<std::mutex> lock(g_profile_mu);
  MatmulProfileRow& row = g_profile[what];
  row.what = what;
  ++row.calls;
  row.seconds += dt;
  row.weight_bytes += bytes;
  row.flops += flops;
}

}  // namespace

void matmul(const QWeight& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y, int64_t ldy) {
  const uint64_t bytes = call_bytes(w, r0, r1);
  const auto flops = static_cast<uint64_t>(2 * (r1 - r0) * w.cols * T);
  g_weight_bytes += bytes;
  g_flops += flops;
  if (!g_profiling) return qmatmul(w, r0, r1, x, ldx, T, y, ldy);  // fused dequantise + dot (cpu/qmatmul.h)
  const auto t0 = std::chrono::steady_clock::now();
  qmatmul(w, r0, r1, x, ldx, T, y, ldy);
  profile_call(w, r0, r1, T, bytes, flops, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

void matmul_many(const Matmul* calls, int64_t n) {
  auto rows_end = [](const Matmul& c) { return c.r1 < 0 ? c.w->rows : c.r1; };
  auto flops_of = [&](const Matmul& c) { return static_cast<uint64_t>(2 * (rows_end(c) - c.r0) * c.w->cols * c.T); };
  uint64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    total += call_bytes(*calls[i].w, calls[i].r0, rows_end(calls[i]));
    g_flops += flops_of(calls[i]);
  }
  g_weight_bytes += total;
  if (!g_profiling) return qmatmul_many(calls, n);
  const auto t0 = std::chrono::steady_clock::now();
  qmatmul_many(calls, n);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // One job for all: each call is charged its share of the weight bytes.
  for (int64_t i = 0; i < n; ++i) {
    const Matmul& c = calls[i];
    const uint64_t bytes = call_bytes(*c.w, c.r0, rows_end(c));
    profile_call(*c.w, c.r0, rows_end(c), c.T, bytes, flops_of(c),
                 total > 0 ? dt * static_cast<double>(bytes) / static_cast<double>(total) : 0.0);
  }
}

QWeight f32_weight(const float* data, int64_t rows, int64_t cols) {
  QWeight w;
  w.fmt = WFormat::F32;
  w.rows = rows;
  w.cols = cols;
  w.data = reinterpret_cast<const uint8_t*>(data);
  return w;
}

void matmul(const QWeight& w, const float* x, int64_t T, float* y) { matmul(w, 0, w.rows, x, w.cols, T, y, w.rows); }

float inv_rms(const float* x, int64_t n, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
}

void rmsnorm(const float* x, const float* w, int64_t n, double eps, float* y) {
  const float rs = inv_rms(x, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (w ? w[i] : 1.0f) * (x[i] * rs);
}


void hadamard(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

std::vector<int32_t> topk(const float* v, int64_t n, int64_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min(k, n);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    const uint32_t ka = rank_key(v[a]), kb = rank_key(v[b]);
    return ka < kb || (ka == kb && a < b);
  });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

}  // namespace dsv4
