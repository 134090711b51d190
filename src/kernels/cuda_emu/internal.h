#pragma once
// What the emulator's scheduler (scheduler.cpp) and runtime (runtime.cpp) share. Not for users.
#include <memory>
#include <mutex>
#include <string>
#include <variant>
#include <vector>

#include "kernels/cuda_emu/cuda_emu.h"

// An emulated stream. Work runs at once unless the stream captures (graph.cpp): then it is
// recorded in `nodes`.
namespace dsv4::emu {
struct KernelNode {
  LaunchConfig cfg;
  void (*run)(const void*) = nullptr;
  std::shared_ptr<const void> call;  // the arguments, by value
  std::vector<const void*> pointers;
};
struct CopyNode {
  void* dst;
  const void* src;
  size_t n;
  cudaMemcpyKind kind;
};
struct SetNode {
  void* ptr;
  int value;
  size_t n;
};
using Node = std::variant<KernelNode, CopyNode, SetNode>;
}  // namespace dsv4::emu

struct CUstream_st {
  unsigned int flags = 0;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::vector<dsv4::emu::Node> nodes;
};

namespace dsv4::emu {

// Every runtime call and every launch holds this: the emulated device runs one thing at a time.
std::mutex& device_mutex();

// Under device_mutex():
cudaError_t sticky_error();                             // cudaSuccess unless a kernel failed
cudaError_t record(cudaError_t err);                    // remembers a non-success as the last error
void fail_sticky(cudaError_t err, const std::string& message);  // a kernel failed: sticky + message on stderr
bool points_into_device_memory(const void* p);          // inside an allocation or one past its end
bool valid_stream(cudaStream_t s);
int max_dynamic_smem(const void* kernel);               // cudaFuncAttributeMaxDynamicSharedMemorySize, 0 if unset
Stats& mutable_stats();
bool device_range(const void* p, size_t n);             // [p, p + n) inside one allocation
bool copy_ok(void* dst, const void* src, size_t dst_n, size_t src_n, cudaMemcpyKind kind);

// Scheduler: runs a launch whose configuration and pointers have been checked (false: it failed,
// the sticky error is set). check_pointers fails the launch (sticky) on a host pointer.
bool check_pointers(const LaunchConfig& cfg, const void* const* pointers, int n_pointers);
void execute(const LaunchConfig& cfg, void (*run)(const void*), const void* call);

// Capture (graph.cpp), under device_mutex():
// The stream records work instead of running it (its capture may be invalidated: then work on it
// fails with cudaErrorStreamCaptureInvalidated, returned by capture_node).
bool capturing(cudaStream_t s);
cudaError_t capture_node(cudaStream_t s, Node node);
// What capture forbids: allocation (unless the capture is Relaxed) and synchronisation
// (device, stream, synchronous copies and memsets) while any stream captures; work on the legacy
// stream while a blocking stream captures. Each invalidates the captures it breaks and returns
// CUDA's error (cudaSuccess when allowed).
enum class Unsafe { Alloc, Sync };
cudaError_t forbidden_during_capture(Unsafe what);
cudaError_t legacy_stream_work(cudaStream_t s);
// Whether [p, p + n) lies in pinned host memory (cudaMallocHost): captured copies need it.
bool pinned_range(const void* p, size_t n);

// The emulated device's limits (cudaGetDeviceProperties reports the same numbers).
constexpr size_t kSharedDefault = 48 * 1024, kSharedOptin = 227 * 1024;
constexpr unsigned kMaxThreads = 1024, kMaxBlockX = 1024, kMaxBlockY = 1024, kMaxBlockZ = 64;
constexpr unsigned kMaxGridX = 0x7FFFFFFFu, kMaxGridYZ = 65535;

// "src/cuda/x.cu" from a full __FILE__ path (messages stay short).
const char* short_path(const char* file);

}  // namespace dsv4::emu
