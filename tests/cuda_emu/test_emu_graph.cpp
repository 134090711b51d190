// The CUDA emulator's stream capture and graphs (src/kernels/cuda_emu/graph.cpp): captured work
// does not run, replays run it in order with the captured arguments, and what capture forbids
// (allocation, synchronisation, pageable copies, legacy-stream work) fails with CUDA's codes and
// invalidates the capture. Built only against the emulator (label gpu-emu).
#include <gtest/gtest.h>

#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda_emu/control.h"

using namespace dsv4;

namespace {

// y[i] = x[i] * k + *add (k by value: a replay keeps the captured k; *add is read at replay).
__global__ void axpb_kernel(const float* x, float k, const float* add, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * k + *add;
}

class EmuGraph : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(gpu::device_available()) << gpu::device_summary();
    ASSERT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s_, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(s_, &g);
      if (g) cudaGraphDestroy(g);
    }
    cudaStreamDestroy(s_);
    cudaGetLastError();
    emu::clear_sticky_error();
  }
  // Ends the capture expecting it invalidated: no graph.
  void expect_invalidated() {
    cudaGraph_t g = reinterpret_cast<cudaGraph_t>(1);
    EXPECT_EQ(cudaStreamEndCapture(s_, &g), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(g, nullptr);
    cudaGetLastError();
  }
  cudaStream_t s_ = nullptr;
};

constexpr int kN = 100;

TEST_F(EmuGraph, CaptureRecordsAndReplaysInOrder) {
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, kN * sizeof(float)), cudaSuccess);
  for (int i = 0; i < kN; ++i) pinned[i] = static_cast<float>(i);
  gpu::DeviceBuffer x(kN * sizeof(float)), y(kN * sizeof(float)), add(sizeof(float));
  y.fill_zero();
  add.fill_zero();
  const float one = 1.0f;
  add.upload(&one, sizeof one);

  const uint64_t launches = emu::stats().launches, graphs = emu::stats().graph_launches;
  const uint64_t captures = emu::stats().graph_captures, instantiations = emu::stats().graph_instantiations;
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(emu::stats().graph_captures, captures + 1);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(s_, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusActive);
  // Upload from pinned memory (read at replay), then y = 2x + add, then y[0] = 0 bytes.
  ASSERT_EQ(cudaMemcpyAsync(x.get(), pinned, kN * sizeof(float), cudaMemcpyHostToDevice, s_), cudaSuccess);
  float k = 2.0f;
  DSV4_LAUNCH(1, 128, 0, s_, axpb_kernel)(x.as<float>(), k, add.as<float>(), y.as<float>(), kN);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(y.get(), 0, sizeof(float), s_), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s_, &graph), cudaSuccess);
  ASSERT_NE(graph, nullptr);
  // Nothing ran during the capture.
  EXPECT_EQ(emu::stats().launches, launches);
  EXPECT_EQ(gpu::to_host<float>(y, kN), std::vector<float>(kN, 0.0f));

  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);  // the executable graph keeps its nodes
  k = 5.0f;                                         // captured by value: the replay keeps 2
  for (int rep = 0; rep < 2; ++rep) {
    for (int i = 0; i < kN; ++i) pinned[i] = static_cast<float>(i + rep);  // read at each replay
    ASSERT_EQ(cudaGraphLaunch(exec, s_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
    const std::vector<float> got = gpu::to_host<float>(y, kN);
    EXPECT_EQ(got[0], 0.0f);  // the memset ran after the kernel
    for (int i = 1; i < kN; ++i) ASSERT_EQ(got[i], 2.0f * static_cast<float>(i + rep) + 1.0f) << i;
  }
  EXPECT_EQ(emu::stats().launches, launches + 2);
  EXPECT_EQ(emu::stats().graph_launches, graphs + 2);
  EXPECT_EQ(emu::stats().graph_captures, captures + 1);  // replays neither capture nor instantiate
  EXPECT_EQ(emu::stats().graph_instantiations, instantiations + 1);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

// The planted allocation: cudaMalloc inside a captured region fails and breaks the capture.
TEST_F(EmuGraph, MallocDuringCaptureInvalidates) {
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  void* p = reinterpret_cast<void*>(1);
  EXPECT_EQ(cudaMalloc(&p, 256), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(p, nullptr);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(s_, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusInvalidated);
  // Later work on the stream reports the broken capture.
  gpu::DeviceBuffer y(sizeof(float));
  cudaGetLastError();
  EXPECT_EQ(cudaMemsetAsync(y.get(), 0, sizeof(float), s_), cudaErrorStreamCaptureInvalidated);
  expect_invalidated();
  // After the capture the stream and cudaMalloc work again.
  EXPECT_EQ(cudaMalloc(&p, 256), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

// A Relaxed capture permits allocation (but still no synchronisation).
TEST_F(EmuGraph, RelaxedCapturePermitsMalloc) {
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeRelaxed), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 256), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
  expect_invalidated();
}

TEST_F(EmuGraph, SynchronisationDuringCaptureInvalidates) {
  gpu::DeviceBuffer d(16);
  float h[4] = {};
  using Sync = cudaError_t (*)(cudaStream_t, gpu::DeviceBuffer&, float*);
  const Sync syncs[] = {
      [](cudaStream_t s, gpu::DeviceBuffer&, float*) { return cudaStreamSynchronize(s); },
      [](cudaStream_t, gpu::DeviceBuffer&, float*) { return cudaDeviceSynchronize(); },
      [](cudaStream_t, gpu::DeviceBuffer& b, float* p) { return cudaMemcpy(p, b.get(), 16, cudaMemcpyDeviceToHost); },
      [](cudaStream_t, gpu::DeviceBuffer& b, float*) { return cudaMemset(b.get(), 0, 16); },
  };
  for (size_t i = 0; i < std::size(syncs); ++i) {
    ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
    EXPECT_EQ(syncs[i](s_, d, h), cudaErrorStreamCaptureUnsupported) << "synchronising call " << i;
    expect_invalidated();
  }
}

// A copy to or from pageable host memory cannot be captured (the graph would replay it after the
// buffer changed or died); pinned memory can.
TEST_F(EmuGraph, PageableCopyDuringCaptureInvalidates) {
  gpu::DeviceBuffer d(16);
  std::vector<float> pageable(4);
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(d.get(), pageable.data(), 16, cudaMemcpyHostToDevice, s_), cudaErrorStreamCaptureUnsupported);
  expect_invalidated();
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(pageable.data(), d.get(), 16, cudaMemcpyDeviceToHost, s_), cudaErrorStreamCaptureUnsupported);
  expect_invalidated();
}

TEST_F(EmuGraph, LegacyStreamRules) {
  // The legacy stream cannot capture.
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
  cudaGetLastError();
  // Legacy-stream work while a blocking stream captures would join the capture implicitly.
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  gpu::DeviceBuffer x(sizeof(float)), y(sizeof(float)), add(sizeof(float));
  ASSERT_EQ(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal), cudaSuccess);
  DSV4_LAUNCH(1, 32, 0, nullptr, axpb_kernel)(x.as<float>(), 1.0f, add.as<float>(), y.as<float>(), 1);
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureImplicit);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(blocking, &g), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(g, nullptr);
  EXPECT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
}

// A graph whose buffer was freed after capture fails at replay (as the device would fault).
TEST_F(EmuGraph, ReplayAfterFreeFails) {
  auto x = std::make_unique<gpu::DeviceBuffer>(kN * sizeof(float));
  gpu::DeviceBuffer y(kN * sizeof(float)), add(sizeof(float));
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  DSV4_LAUNCH(1, 128, 0, s_, axpb_kernel)(x->as<float>(), 1.0f, add.as<float>(), y.as<float>(), kN);
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s_, &g), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, g), cudaSuccess);
  x.reset();
  EXPECT_EQ(cudaGraphLaunch(exec, s_), cudaErrorIllegalAddress);
  EXPECT_NE(emu::last_failure().find("not in device memory"), std::string::npos) << emu::last_failure();
  emu::clear_sticky_error();
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
}

}  // namespace
