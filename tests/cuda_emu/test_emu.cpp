// The CUDA emulator's own tests (src/kernels/cuda_emu; docs/cuda.md "Emulator"): barrier and
// warp-collective rules, launch failures as CUDA reports them, launch limits, the reverse order,
// the counters, the floating-point state kept per fiber, and the mutation check (a block
// reduction without its barrier gives wrong sums). Built only against the emulator (label gpu-emu).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda_emu/control.h"

using namespace dsv4;

namespace {

// ================================================================ kernels

// Warp w sums its lanes' values w + 1 times: the warps' collectives run different trip counts,
// which needs per-warp (not block-wide) collective barriers.
__global__ void per_warp_loop_kernel(const float* x, float* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float v = x[blockIdx.x * blockDim.x + threadIdx.x], s = 0.0f;
  for (int r = 0; r <= warp; ++r) s += gpu::warp_sum(v);
  if (lane == 0) out[blockIdx.x * (blockDim.x / 32) + warp] = s;
}

// Threads below `split` wait at one __syncthreads, the others at another.
__global__ void divergent_barrier_kernel(int split, float* out) {
  if (static_cast<int>(threadIdx.x) < split) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

// Threads below `split` wait at __syncthreads while the others shuffle: with split inside a warp,
// neither can complete (whole warps that shuffle and exit would let the barrier go).
__global__ void barrier_vs_shuffle_kernel(int split, float* out) {
  float v = 1.0f;
  if (static_cast<int>(threadIdx.x) < split) __syncthreads();
  else v = gpu::warp_sum(v);
  out[threadIdx.x] = v;
}

// Lanes from `split` on exit; the rest shuffle with the full mask.
__global__ void shuffle_after_exit_kernel(int split, float* out) {
  if ((threadIdx.x & 31) >= static_cast<unsigned>(split)) return;
  out[threadIdx.x] = gpu::warp_sum(1.0f);
}

// Early exit before a barrier is fine: the barrier waits for the threads that have not exited.
__global__ void exit_then_barrier_kernel(float* out) {
  __shared__ float s[256];
  if (threadIdx.x >= 200) return;
  s[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = s[199 - threadIdx.x];
}

__global__ void dynamic_smem_kernel(float* out, int n) {
  DSV4_EXTERN_SHARED(float, buf);
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = static_cast<float>(i);
  __syncthreads();
  if (threadIdx.x == 0) out[0] = buf[n - 1];
}

// Reads a neighbour's shared slot without a barrier: the result depends on the thread order.
__global__ void racy_kernel(float* out, bool with_barrier) {
  __shared__ float s[64];
  s[threadIdx.x] = static_cast<float>(threadIdx.x);
  if (with_barrier) __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}

__global__ void barriers_kernel(int rounds) {
  for (int r = 0; r < rounds; ++r) __syncthreads();
}

// Thread 0 switches to round-toward-zero and keeps it across a barrier; the others compute in
// the launch's (nearest) mode. out[t] = 1/3 computed after the barrier.
__global__ void rounding_kernel(const float* three, float* out) {
  if (threadIdx.x == 0) std::fesetround(FE_TOWARDZERO);
  __syncthreads();
  const volatile float one = 1.0f;
  out[threadIdx.x] = one / three[0];
  __syncthreads();
  if (threadIdx.x == 0) std::fesetround(FE_TONEAREST);
}

// The project's block reduction (src/cuda/common.cuh block_sum), one sum per block.
__global__ void block_sum_kernel(const float* x, float* out) {
  const float s = gpu::block_sum(x[blockIdx.x * blockDim.x + threadIdx.x]);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// Mutant: block_sum with the __syncthreads between writing part[] and reading it deleted.
__device__ float block_sum_without_barrier(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = gpu::warp_sum(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  // (deleted) __syncthreads();
  float s = lane < nw ? part[lane] : 0.0f;
  return gpu::warp_sum(s);
}

__global__ void mutant_block_sum_kernel(const float* x, float* out) {
  const float s = block_sum_without_barrier(x[blockIdx.x * blockDim.x + threadIdx.x]);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// Every reduction both ways: the shuffle butterfly a GPU runs and gpu::warp_butterfly (one
// emulator collective). Per thread, kButterflyWords words: the two results of each reduction.
constexpr int kButterflyWords = 12;
__global__ void butterfly_kernel(const float* x, const int32_t* idx, uint32_t* out) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const float v = x[t];
  const double d = static_cast<double>(v) * (t % 3 == 0 ? -1.5 : 0.75);
  const gpu::ArgBest c{v, idx[t]};
  const float s[2] = {gpu::warp_butterfly_shfl(v, gpu::SumOp{}), gpu::warp_sum(v)};
  const float m[2] = {gpu::warp_butterfly_shfl(v, gpu::MaxOp{}), gpu::warp_max(v)};
  const double ds[2] = {gpu::warp_butterfly_shfl(d, gpu::SumOp{}), gpu::warp_sum(d)};
  const gpu::ArgBest a[2] = {gpu::warp_butterfly_shfl(c, gpu::ArgmaxOp{}), gpu::warp_butterfly(c, gpu::ArgmaxOp{})};
  uint32_t* o = out + static_cast<size_t>(t) * kButterflyWords;
  std::memcpy(o, s, 8);
  std::memcpy(o + 2, m, 8);
  std::memcpy(o + 4, ds, 16);
  for (int k = 0; k < 2; ++k) {
    std::memcpy(o + 8 + 2 * k, &a[k].v, 4);
    std::memcpy(o + 9 + 2 * k, &a[k].i, 4);
  }
}

// Lanes below `split` sum, the others take the maximum: the same collective with two combines.
__global__ void mixed_combine_kernel(int split, float* out) {
  const float v = static_cast<float>(threadIdx.x);
  out[threadIdx.x] = static_cast<int>(threadIdx.x & 31) < split ? gpu::warp_sum(v) : gpu::warp_max(v);
}

// ================================================================ helpers

class Emu : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(gpu::device_available()) << gpu::device_summary();
    emu::set_reverse(false);
  }
  void TearDown() override {
    emu::set_reverse(false);
    emu::clear_sticky_error();
  }
};

gpu::DeviceBuffer device_floats(const std::vector<float>& v) { return gpu::to_device(v); }

std::vector<float> host_floats(const gpu::DeviceBuffer& b, size_t n) { return gpu::to_host<float>(b, n); }

// A failed kernel: the error is sticky (every later call returns it) until cleared.
void expect_sticky(cudaError_t want, const std::string& message_part) {
  EXPECT_EQ(cudaGetLastError(), want);
  EXPECT_EQ(cudaGetLastError(), want) << "sticky";
  EXPECT_EQ(cudaDeviceSynchronize(), want);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), want);
  EXPECT_NE(emu::last_failure().find(message_part), std::string::npos) << emu::last_failure();
  EXPECT_THROW(gpu::synchronize(), Error);
  emu::clear_sticky_error();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Sums of 8 blocks of 256 values, per block: the kernel's and the exact (double) ones.
struct SumCase {
  std::vector<float> x;
  std::vector<double> want;
};

SumCase sum_case() {
  std::mt19937 g(7);
  std::uniform_real_distribution<float> d(0.5f, 1.5f);  // all positive: every part matters
  SumCase c;
  c.x.resize(8 * 256);
  for (float& v : c.x) v = d(g);
  for (int b = 0; b < 8; ++b) c.want.push_back(std::accumulate(c.x.begin() + b * 256, c.x.begin() + (b + 1) * 256, 0.0));
  return c;
}

template <class Kernel>
int wrong_sums(Kernel kernel, const SumCase& c) {
  gpu::DeviceBuffer x = device_floats(c.x), out(8 * sizeof(float));
  DSV4_LAUNCH(8, 256, 0, nullptr, kernel)(x.as<const float>(), out.as<float>());
  gpu::synchronize();
  const std::vector<float> got = host_floats(out, 8);
  int bad = 0;
  for (int b = 0; b < 8; ++b) bad += !(std::fabs(got[b] - c.want[b]) <= 1e-4 * c.want[b]);
  return bad;
}

}  // namespace

// ================================================================ tests

TEST_F(Emu, ReportsTheEmulatedDevice) {
  EXPECT_NE(gpu::device_summary().find("emulator"), std::string::npos) << gpu::device_summary();
  EXPECT_NE(gpu::device_summary().find("sm_90"), std::string::npos) << gpu::device_summary();
}

TEST_F(Emu, WarpsRunCollectivesIndependently) {
  std::vector<float> x(2 * 256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7);
  gpu::DeviceBuffer dx = device_floats(x), out(16 * sizeof(float));
  for (bool rev : {false, true}) {
    emu::set_reverse(rev);
    DSV4_LAUNCH(2, 256, 0, nullptr, per_warp_loop_kernel)(dx.as<const float>(), out.as<float>());
    ASSERT_EQ(cudaGetLastError(), cudaSuccess) << emu::last_failure();
    const std::vector<float> got = host_floats(out, 16);
    for (int b = 0; b < 2; ++b)
      for (int w = 0; w < 8; ++w) {
        float s = 0.0f;
        for (int l = 0; l < 32; ++l) s += x[b * 256 + w * 32 + l];
        EXPECT_EQ(got[b * 8 + w], s * static_cast<float>(w + 1)) << "block " << b << " warp " << w;
      }
  }
}

TEST_F(Emu, ThreadsThatExitDoNotBlockABarrier) {
  gpu::DeviceBuffer out(256 * sizeof(float));
  DSV4_LAUNCH(1, 256, 0, nullptr, exit_then_barrier_kernel)(out.as<float>());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess) << emu::last_failure();
  const std::vector<float> got = host_floats(out, 200);
  for (int t = 0; t < 200; ++t) EXPECT_EQ(got[t], static_cast<float>(199 - t));
}

TEST_F(Emu, DivergentSyncthreadsFailsTheLaunch) {
  gpu::DeviceBuffer out(256 * sizeof(float));
  DSV4_LAUNCH(1, 256, 0, nullptr, divergent_barrier_kernel)(100, out.as<float>());
  expect_sticky(cudaErrorLaunchFailure, "divergent __syncthreads");
}

TEST_F(Emu, BarrierAgainstShuffleIsADeadlock) {
  gpu::DeviceBuffer out(256 * sizeof(float));
  DSV4_LAUNCH(1, 256, 0, nullptr, barrier_vs_shuffle_kernel)(16, out.as<float>());
  expect_sticky(cudaErrorLaunchFailure, "deadlock");
  EXPECT_NE(emu::last_failure().find("wait at __syncthreads"), std::string::npos) << emu::last_failure();
}

TEST_F(Emu, ShuffleWithExitedLanesIsADeadlock) {
  gpu::DeviceBuffer out(64 * sizeof(float));
  DSV4_LAUNCH(1, 64, 0, nullptr, shuffle_after_exit_kernel)(16, out.as<float>());
  expect_sticky(cudaErrorLaunchFailure, "have exited");
  // All lanes present: fine.
  DSV4_LAUNCH(1, 64, 0, nullptr, shuffle_after_exit_kernel)(32, out.as<float>());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << emu::last_failure();
  EXPECT_EQ(host_floats(out, 64), std::vector<float>(64, 32.0f));
}

TEST_F(Emu, HostPointerArgumentFailsTheLaunch) {
  std::vector<float> host(256);
  DSV4_LAUNCH(1, 256, 0, nullptr, exit_then_barrier_kernel)(host.data());
  expect_sticky(cudaErrorIllegalAddress, "not in device memory");
}

TEST_F(Emu, LaunchLimitsAsCuda) {
  gpu::DeviceBuffer out(256 * sizeof(float));
  auto check = [&](dim3 grid, dim3 block, size_t smem, cudaError_t want) {
    DSV4_LAUNCH(grid, block, smem, nullptr, dynamic_smem_kernel)(out.as<float>(), 4);
    EXPECT_EQ(cudaGetLastError(), want) << grid.x << "x" << grid.y << "x" << grid.z << " / " << block.x << "x" << block.y
                                        << "x" << block.z << " smem " << smem;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a configuration error is not sticky";
  };
  check(1, 1024, 16, cudaSuccess);
  check(1, 1025, 16, cudaErrorInvalidConfiguration);
  check(1, dim3(32, 32, 2), 16, cudaErrorInvalidConfiguration);  // 2048 threads
  check(1, dim3(1, 1, 65), 16, cudaErrorInvalidConfiguration);
  check(dim3(1, 65536), 32, 16, cudaErrorInvalidConfiguration);
  check(0, 32, 16, cudaErrorInvalidConfiguration);
  check(1, 32, 48 * 1024, cudaSuccess);
  check(1, 32, 48 * 1024 + 4, cudaErrorInvalidValue);  // above 48 KiB needs the attribute
  ASSERT_EQ(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024),
            cudaSuccess);
  check(1, 32, 100 * 1024, cudaSuccess);
  check(1, 32, 100 * 1024 + 4, cudaErrorInvalidValue);
  EXPECT_EQ(cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  // The dynamic buffer holds what the launch asked for.
  DSV4_LAUNCH(1, 128, 1000 * sizeof(float), nullptr, dynamic_smem_kernel)(out.as<float>(), 1000);
  EXPECT_EQ(host_floats(out, 1)[0], 999.0f);
}

TEST_F(Emu, ReverseOrderExposesAMissingBarrier) {
  gpu::DeviceBuffer out(64 * sizeof(float));
  std::vector<float> got[2][2];
  for (int barrier = 0; barrier < 2; ++barrier)
    for (int rev = 0; rev < 2; ++rev) {
      emu::set_reverse(rev);
      DSV4_LAUNCH(1, 64, 0, nullptr, racy_kernel)(out.as<float>(), barrier == 1);
      got[barrier][rev] = host_floats(out, 64);
    }
  EXPECT_EQ(got[1][0], got[1][1]);  // with the barrier: the same either way
  EXPECT_NE(got[0][0], got[0][1]);  // without: the order shows through
}

TEST_F(Emu, CountersCountLaunchesThreadsAndBarriers) {
  emu::reset_stats();
  DSV4_LAUNCH(dim3(3, 2), 96, 0, nullptr, barriers_kernel)(5);
  const emu::Stats s = emu::stats();
  EXPECT_EQ(s.launches, 1u);
  EXPECT_EQ(s.blocks, 6u);
  EXPECT_EQ(s.threads, 6u * 96u);
  EXPECT_EQ(s.syncthreads, 6u * 5u);
  // Per block: the host hands over once; in each barrier round every thread but the last to
  // arrive (which releases the others and runs on) hands over once; each exit hands over once
  // (the last one back to the host).
  EXPECT_EQ(s.switches, 6u * (1u + 5u * 95u + 96u));
  EXPECT_NE(emu::format_stats(s).find("6 blocks"), std::string::npos) << emu::format_stats(s);
}

TEST_F(Emu, EachThreadKeepsItsRoundingMode) {
  const float three = 3.0f;
  gpu::DeviceBuffer d3 = device_floats({three}), out(64 * sizeof(float));
  DSV4_LAUNCH(1, 64, 0, nullptr, rounding_kernel)(d3.as<const float>(), out.as<float>());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> got = host_floats(out, 64);
  const float nearest = 1.0f / three;  // rounds up: 0x3EAAAAAB
  EXPECT_EQ(got[1], nearest);
  EXPECT_EQ(got[63], nearest);
  EXPECT_EQ(got[0], std::nextafter(nearest, 0.0f));  // toward zero: 0x3EAAAAAA
  EXPECT_EQ(std::fegetround(), FE_TONEAREST);        // the host's mode is untouched
}

// Mutation check: the project's block reduction passes in both orders; with the barrier between
// writing the per-warp partials and reading them deleted, the sums come out wrong.
TEST_F(Emu, MutationDeletedBarrierInBlockSumIsCaught) {
  const SumCase c = sum_case();
  for (bool rev : {false, true}) {
    emu::set_reverse(rev);
    EXPECT_EQ(wrong_sums(block_sum_kernel, c), 0) << (rev ? "reverse" : "forward");
    EXPECT_GT(wrong_sums(mutant_block_sum_kernel, c), 0) << (rev ? "reverse" : "forward");
  }
}

// gpu::warp_butterfly, one collective under the emulator, gives every lane the bits its five
// shuffles give, for every reduction the kernels use, including NaN / infinity / signed-zero /
// subnormal inputs and argmax ties; and both equal a host model of the butterfly's order (lane l,
// round o: combine(own, lane l ^ o)). The inputs are order-sensitive: the rounds in the other
// order (o = 1 .. 16) give different sums, so an emulator that reordered them would fail here.
TEST_F(Emu, ButterflyEqualsShuffles) {
  constexpr int kBlocks = 4, kThreads = 128, n = kBlocks * kThreads;
  std::mt19937 g(11);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-20, 20);
  std::vector<float> x(n);
  std::vector<int32_t> idx(n);
  for (int t = 0; t < n; ++t) {
    x[t] = std::ldexp(mant(g), expo(g));
    idx[t] = t % 32;
  }
  const float inf = INFINITY, nan = std::nanf("");
  x[32 + 5] = nan;                                    // warp 1: one NaN
  x[64 + 3] = inf, x[64 + 9] = -inf;                  // warp 2: inf - inf
  for (int l = 0; l < 32; ++l) x[96 + l] = (l % 2) ? 0.0f : -0.0f;  // warp 3: signed zeros
  for (int l = 0; l < 32; ++l) x[128 + l] = 2.5f;     // warp 4: argmax ties everywhere
  for (int l = 0; l < 32; ++l) x[160 + l] = 0x1p-140f * static_cast<float>(l + 1);  // warp 5: subnormals
  for (int l = 0; l < 32; l += 3) idx[192 + l] = -1;  // warp 6: some lanes have no candidate
  gpu::DeviceBuffer dx = device_floats(x), di = gpu::to_device(idx), out(static_cast<size_t>(n) * kButterflyWords * 4);
  // The host model of each warp's float sums, per lane: in the butterfly's order and in the other.
  std::vector<float> model(n), other(n);
  for (int base = 0; base < n; base += 32) {
    float v[32], r[32];
    for (int l = 0; l < 32; ++l) v[l] = r[l] = x[base + l];
    for (int k = 0; k < 5; ++k) {
      float nv[32], nr[32];
      for (int l = 0; l < 32; ++l) {
        nv[l] = v[l] + v[l ^ (16 >> k)];
        nr[l] = r[l] + r[l ^ (1 << k)];
      }
      std::memcpy(v, nv, sizeof v);
      std::memcpy(r, nr, sizeof r);
    }
    std::copy(v, v + 32, model.begin() + base);
    std::copy(r, r + 32, other.begin() + base);
  }
  std::vector<uint32_t> got;
  for (bool rev : {false, true}) {
    emu::set_reverse(rev);
    DSV4_LAUNCH(kBlocks, kThreads, 0, nullptr, butterfly_kernel)(dx.as<const float>(), di.as<const int32_t>(),
                                                                  out.as<uint32_t>());
    ASSERT_EQ(cudaGetLastError(), cudaSuccess) << emu::last_failure();
    got = gpu::to_host<uint32_t>(out, static_cast<size_t>(n) * kButterflyWords);
    int order_sensitive = 0;
    for (int t = 0; t < n; ++t) {
      const uint32_t* o = &got[static_cast<size_t>(t) * kButterflyWords];
      EXPECT_EQ(o[0], o[1]) << "sum, thread " << t;
      EXPECT_EQ(o[2], o[3]) << "max, thread " << t;
      EXPECT_EQ(o[4], o[6]) << "double sum, thread " << t;
      EXPECT_EQ(o[5], o[7]) << "double sum, thread " << t;
      EXPECT_EQ(o[8], o[10]) << "argmax value, thread " << t;
      EXPECT_EQ(o[9], o[11]) << "argmax index, thread " << t;
      EXPECT_EQ(std::bit_cast<uint32_t>(model[t]), o[1]) << "host model, thread " << t;
      order_sensitive += std::bit_cast<uint32_t>(other[t]) != o[1];
    }
    EXPECT_GT(order_sensitive, n / 4);
  }
  // Argmax ties (warp 4) go to the lowest index, lanes without a candidate (warp 6) never win.
  EXPECT_EQ(got[static_cast<size_t>(128 + 17) * kButterflyWords + 11], 0u);
  for (int l = 0; l < 32; ++l) EXPECT_NE(static_cast<int32_t>(got[static_cast<size_t>(192 + l) * kButterflyWords + 11]) % 3, 0);
}

// The butterfly is one collective per warp: 32 switches where five shuffles took 160.
TEST_F(Emu, ButterflyIsOneCollective) {
  gpu::DeviceBuffer out(64 * sizeof(float));
  emu::reset_stats();
  DSV4_LAUNCH(1, 64, 0, nullptr, shuffle_after_exit_kernel)(32, out.as<float>());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess) << emu::last_failure();
  EXPECT_EQ(emu::stats().warp_collectives, 2u);
  EXPECT_EQ(host_floats(out, 64), std::vector<float>(64, 32.0f));
}

TEST_F(Emu, ButterflyWithDifferentCombinesFails) {
  gpu::DeviceBuffer out(32 * sizeof(float));
  DSV4_LAUNCH(1, 32, 0, nullptr, mixed_combine_kernel)(16, out.as<float>());
  expect_sticky(cudaErrorLaunchFailure, "another value type or combine");
}
