#pragma once
// dsv4 CUDA emulator: what CUDA C++ code sees when it is compiled as plain host C++ (g++).
//
// The kernels of src/cuda are built a second time with include/ first on the include path, so
// their `#include <cuda_runtime.h>` / `<cuda_fp16.h>` land here. Execution model (scheduler.cpp):
// a launch runs at once, to completion, on the calling host thread; blocks run one after another;
// every CUDA thread of a block is a fiber with its own stack, and fibers switch only at
// __syncthreads and warp collectives (cooperative, so plain memory and "atomics" need no locks).
// The runtime API (runtime.cpp) keeps CUDA's error rules: launch-configuration errors are
// reported by cudaGetLastError, a failed kernel leaves a sticky error that every later call
// returns. Design, what this catches and what it cannot: docs/cuda.md, section "Emulator".
#include <math.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/cuda_emu/control.h"

// ================================================================ qualifiers

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Shared memory: blocks run one at a time, so a function-local static is exactly "one per block"
// (it keeps the previous block's bytes, which CUDA leaves undefined anyway).
#define __shared__ static

// ================================================================ vector types

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(8) uint2 {
  unsigned int x, y;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }

constexpr int warpSize = 32;

// ================================================================ runtime API (runtime.cpp)

// The codes keep CUDA's numbering; names and messages come from cudaGetErrorName/String.
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidPitchValue = 12,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,  // the call is not permitted while a stream captures
  cudaErrorStreamCaptureInvalidated = 901,  // an earlier error broke this capture
  cudaErrorStreamCaptureUnmatched = 903,    // EndCapture on a stream that does not capture
  cudaErrorStreamCaptureImplicit = 906,     // legacy-stream work would join a capturing blocking stream
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};

struct CUstream_st;  // an emulated stream: a handle only (work runs at launch, in order)
using cudaStream_t = CUstream_st*;
constexpr unsigned int cudaStreamDefault = 0, cudaStreamNonBlocking = 1;

// The fields of cudaDeviceProp the project reads (plus the limits the emulator enforces).
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;       // 48 KiB without opt-in
  size_t sharedMemPerBlockOptin;  // 227 KiB with cudaFuncAttributeMaxDynamicSharedMemorySize
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major, minor;
  int multiProcessorCount;
};

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaDeviceReset();
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t err);
const char* cudaGetErrorString(cudaError_t err);

cudaError_t cudaMalloc(void** ptr, size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind kind);
cudaError_t cudaMemset(void* ptr, int value, size_t n);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t n, cudaStream_t s = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);

// Pinned host memory: the only host memory a captured copy may use (graph.cpp).
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
template <class T>
cudaError_t cudaMallocHost(T** ptr, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFreeHost(void* ptr);

// Stream capture and graphs (graph.cpp): work enqueued on a capturing stream is recorded, not
// run; a graph replays it in order with the arguments it was captured with.
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
struct CUgraph_st;
struct CUgraphExec_st;
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraphExec_st*;
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

namespace dsv4::emu {
cudaError_t func_set_attribute(const void* fn, cudaFuncAttribute attr, int value);
}
template <class... P>
cudaError_t cudaFuncSetAttribute(void (*fn)(P...), cudaFuncAttribute attr, int value) {
  return ::dsv4::emu::func_set_attribute(reinterpret_cast<const void*>(fn), attr, value);
}

// ================================================================ device intrinsics

inline float __uint_as_float(unsigned int u) { return std::bit_cast<float>(u); }
inline unsigned int __float_as_uint(float f) { return std::bit_cast<unsigned int>(f); }
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned int>(x)); }
inline int __popc(unsigned int x) { return __builtin_popcount(x); }

// Round-to-nearest single operations; the emulated build compiles with -ffp-contract=off, so
// nothing here (or anywhere) becomes a fused multiply-add unless the code calls fmaf.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }

// Read-only cache load: a plain load.
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

// Atomics: fibers never switch inside these, so the read-modify-write is indivisible as is.
template <class T>
inline T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <class T>
inline T atomicMax(T* p, T v) {
  const T old = *p;
  if (old < v) *p = v;
  return old;
}
template <class T>
inline T atomicMin(T* p, T v) {
  const T old = *p;
  if (v < old) *p = v;
  return old;
}
template <class T>
inline T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}
template <class T>
inline T atomicCAS(T* p, T cmp, T v) {
  const T old = *p;
  if (old == cmp) *p = v;
  return old;
}

// Half precision: storage and the exact widening conversion.
struct __half {
  unsigned short bits;
};
inline __half __ushort_as_half(unsigned short b) { return __half{b}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float __half2float(__half h) {
  const unsigned int s = (h.bits & 0x8000u) << 16, e = (h.bits >> 10) & 0x1Fu, m = h.bits & 0x3FFu;
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in float
    const float v = static_cast<float>(m) * 0x1p-24f;
    return s ? -v : v;
  }
  if (e == 31) return __uint_as_float(s | 0x7F800000u | (m << 13));  // inf / NaN
  return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
}

// ================================================================ built-in variables, barriers

namespace dsv4::emu {

// The running CUDA thread's indices. Plain globals: one launch runs at a time (runtime mutex),
// and the scheduler rewrites g_thread_idx at every switch.
extern uint3 g_thread_idx, g_block_idx;
extern dim3 g_block_dim, g_grid_dim;
extern void* g_dynamic_smem;  // this block's dynamic shared memory (exactly the launch's bytes)

// __syncthreads: waits until every live (not yet exited) thread of the block is here.
void syncthreads(const char* file, int line);

// Warp collectives: the calling lane waits until every lane of `mask` has reached a collective
// of the same kind with the same mask; then all exchange at once.
enum class Collective : uint8_t { SyncWarp, ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All, Butterfly };
uint64_t warp_collective(Collective op, unsigned int mask, uint64_t value, int arg, int width, const char* file,
                         int line);

inline void syncwarp(const char* file, int line, unsigned int mask = 0xFFFFFFFFu) {
  warp_collective(Collective::SyncWarp, mask, 0, 0, 32, file, line);
}

// The xor butterfly of a full warp as one collective (gpu::warp_butterfly): once all 32 lanes are
// here, `rounds` computes every lane's five rounds v = combine(v, v of lane ^ o), o = 16, 8, 4, 2,
// 1, in the order the shuffles would give. All lanes must pass the same `rounds` (one per value
// type and combine). The arithmetic runs in the floating-point mode of the lane that arrives
// last (device code has no dynamic rounding mode; only emulator tests change it).
using ButterflyRounds = void (*)(uint64_t* lanes);  // lanes[32]: the values in, the results out
uint64_t warp_butterfly(ButterflyRounds rounds, uint64_t value, const char* file, int line);

template <class T>
inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "warp value wider than 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  return bits;
}
template <class T>
inline T from_bits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
template <class T, class F>
void butterfly_rounds(uint64_t* lanes) {
  T v[32], next[32];
  for (int l = 0; l < 32; ++l) v[l] = from_bits<T>(lanes[l]);
  for (int o = 16; o > 0; o >>= 1) {
    for (int l = 0; l < 32; ++l) next[l] = F{}(v[l], v[l ^ o]);
    std::memcpy(v, next, sizeof v);
  }
  for (int l = 0; l < 32; ++l) lanes[l] = to_bits(v[l]);
}
template <class T, class F>
inline T butterfly(T v, F, const char* file, int line) {
  return from_bits<T>(warp_butterfly(&butterfly_rounds<T, F>, to_bits(v), file, line));
}

template <class T>
inline T shfl(Collective op, const char* file, int line, unsigned int mask, T v, int arg, int width = 32) {
  return from_bits<T>(warp_collective(op, mask, to_bits(v), arg, width, file, line));
}

template <class T>
inline T* dynamic_shared() {
  return static_cast<T*>(g_dynamic_smem);
}

}  // namespace dsv4::emu

#define threadIdx (static_cast<const uint3&>(::dsv4::emu::g_thread_idx))
#define blockIdx (static_cast<const uint3&>(::dsv4::emu::g_block_idx))
#define blockDim (static_cast<const dim3&>(::dsv4::emu::g_block_dim))
#define gridDim (static_cast<const dim3&>(::dsv4::emu::g_grid_dim))

#define __syncthreads() ::dsv4::emu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ::dsv4::emu::syncwarp(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_sync(...) ::dsv4::emu::shfl(::dsv4::emu::Collective::ShflIdx, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) ::dsv4::emu::shfl(::dsv4::emu::Collective::ShflUp, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) ::dsv4::emu::shfl(::dsv4::emu::Collective::ShflDown, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) ::dsv4::emu::shfl(::dsv4::emu::Collective::ShflXor, __FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(mask, pred) \
  static_cast<unsigned int>(::dsv4::emu::warp_collective(::dsv4::emu::Collective::Ballot, mask, (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __any_sync(mask, pred) \
  static_cast<int>(::dsv4::emu::warp_collective(::dsv4::emu::Collective::Any, mask, (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __all_sync(mask, pred) \
  static_cast<int>(::dsv4::emu::warp_collective(::dsv4::emu::Collective::All, mask, (pred) != 0, 0, 32, __FILE__, __LINE__))

// `extern __shared__ T name[];` (the launch's dynamic shared memory).
#define DSV4_EXTERN_SHARED(type, name) type* const name = ::dsv4::emu::dynamic_shared<type>()

// ================================================================ launch

namespace dsv4::emu {

struct LaunchConfig {
  const char* name;    // the kernel expression as written at the launch site
  const void* kernel;  // identifies the function (cudaFuncSetAttribute)
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
};

// Runs `run(call)` once per CUDA thread of every block (scheduler.cpp), or, on a capturing
// stream, records it for graph replay (graph.cpp; `call` holds the arguments by value, so the
// record keeps it alive). `pointers[0..n)` are the kernel's pointer arguments, checked to point
// into device allocations (or be null).
void launch(const LaunchConfig& cfg, void (*run)(const void* call), std::shared_ptr<const void> call,
            const void* const* pointers, int n_pointers);

// kernel(args...) as one object: the arguments converted to the kernel's parameter types once,
// as the <<<>>> call does; every CUDA thread gets its own copies (by-value parameters).
template <class... P>
class Launcher {
 public:
  Launcher(void (*fn)(P...), const char* name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream)
      : fn_(fn), cfg_{name, reinterpret_cast<const void*>(fn), grid, block, smem, stream} {}

  template <class... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "wrong number of kernel arguments");
    auto call = std::make_shared<const Call>(Call{fn_, std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)});
    const void* ptrs[sizeof...(P) + 1] = {};
    int n = 0;
    collect(call->args, ptrs, n, std::index_sequence_for<P...>{});
    launch(cfg_, &run, std::move(call), ptrs, n);
  }

 private:
  struct Call {
    void (*fn)(P...);
    std::tuple<std::decay_t<P>...> args;
  };
  static void run(const void* c) {
    const Call& call = *static_cast<const Call*>(c);
    std::apply(call.fn, call.args);
  }
  template <class Tuple, size_t... I>
  static void collect(const Tuple& t, const void** ptrs, int& n, std::index_sequence<I...>) {
    (
        [&] {
          if constexpr (std::is_pointer_v<std::tuple_element_t<I, Tuple>>)
            ptrs[n++] = static_cast<const void*>(std::get<I>(t));
        }(),
        ...);
  }
  void (*fn_)(P...);
  LaunchConfig cfg_;
};

template <class... P>
Launcher<P...> make_launcher(void (*fn)(P...), const char* name, dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream) {
  return Launcher<P...>(fn, name, grid, block, smem, stream);
}

}  // namespace dsv4::emu

// DSV4_LAUNCH(grid, block, smem, stream, kernel)(args...) == kernel<<<grid, block, smem, stream>>>(args...)
#define DSV4_LAUNCH(grid, block, smem, stream, ...) \
  ::dsv4::emu::make_launcher(__VA_ARGS__, #__VA_ARGS__, grid, block, smem, stream)
