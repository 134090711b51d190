// dsv4 CUDA emulator: the runtime API (device query, memory, streams, errors) and the counters.
//
// One emulated device with H100-like limits. Device memory is host memory allocated at exactly
// the requested size (so AddressSanitizer sees every overrun) and filled with 0xFF bytes (NaN
// as floats) so reads of never-written device memory stand out. Every call checks device ranges
// against the allocation table. Work runs at launch, so streams are handles that only need to
// exist. Errors follow CUDA: a failing call returns its code and records it as the last error
// (cudaGetLastError returns and clears it); a failed kernel leaves a sticky error that every
// later call returns, until cudaDeviceReset (or dsv4::emu::clear_sticky_error).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>

#include "kernels/cuda_emu/internal.h"

namespace dsv4::emu {
namespace {

constexpr size_t kDeviceMemory = size_t{80} << 30;  // what cudaMalloc may hand out in total

cudaError_t g_last = cudaSuccess, g_sticky = cudaSuccess;
std::string g_failure;
std::map<uintptr_t, size_t> g_allocs;  // start -> bytes
size_t g_allocated = 0;
std::set<CUstream_st*> g_streams;
std::unordered_map<const void*, int> g_max_smem;
Stats g_stats;

// CUDA_VISIBLE_DEVICES="" (or -1) hides the device, as with the real runtime.
bool hidden() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v && (*v == '\0' || std::strcmp(v, "-1") == 0);
}

// The allocation holding [p, p + n), or end().
std::map<uintptr_t, size_t>::const_iterator find_alloc(const void* p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = g_allocs.upper_bound(a);
  if (it == g_allocs.begin()) return g_allocs.end();
  --it;
  if (a - it->first > it->second || n > it->second - (a - it->first)) return g_allocs.end();
  return it;
}

// Start of every call that needs the device: the hidden device, then a pending sticky error.
cudaError_t enter() {
  if (hidden()) return record(cudaErrorNoDevice);
  if (g_sticky) return record(g_sticky);
  return cudaSuccess;
}

}  // namespace

bool device_range(const void* p, size_t n) { return find_alloc(p, n) != g_allocs.end(); }

// Both ends of a copy: the device side(s) must lie inside one allocation.
bool copy_ok(void* dst, const void* src, size_t dst_n, size_t src_n, cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost: return true;
    case cudaMemcpyHostToDevice: return device_range(dst, dst_n);
    case cudaMemcpyDeviceToHost: return device_range(src, src_n);
    case cudaMemcpyDeviceToDevice: return device_range(dst, dst_n) && device_range(src, src_n);
    case cudaMemcpyDefault: return true;
  }
  return false;
}

namespace {

struct AtExit {
  ~AtExit() {
    const char* e = std::getenv("DSV4_EMU_STATS");
    if (e && *e && std::strcmp(e, "0") != 0) std::fprintf(stderr, "%s\n", format_stats(g_stats).c_str());
  }
} g_at_exit;

}  // namespace

// ================================================================ shared with the scheduler

std::mutex& device_mutex() {
  static std::mutex m;
  return m;
}

cudaError_t sticky_error() { return g_sticky; }

cudaError_t record(cudaError_t err) {
  if (err != cudaSuccess) g_last = err;
  return err;
}

void fail_sticky(cudaError_t err, const std::string& message) {
  g_sticky = err;
  g_last = err;
  g_failure = message;
  std::fprintf(stderr, "cuda-emu: %s\n", message.c_str());
}

bool points_into_device_memory(const void* p) { return device_range(p, 0); }

bool valid_stream(cudaStream_t s) {
  return s == nullptr || reinterpret_cast<uintptr_t>(s) <= 2 || g_streams.count(s) != 0;  // 1, 2: legacy, per-thread
}

int max_dynamic_smem(const void* kernel) {
  const auto it = g_max_smem.find(kernel);
  return it == g_max_smem.end() ? 0 : it->second;
}

Stats& mutable_stats() { return g_stats; }

const char* short_path(const char* file) {
  if (!file) return "?";
  const char* s = std::strstr(file, "src/");
  if (!s) s = std::strstr(file, "tests/");
  return s ? s : file;
}

cudaError_t func_set_attribute(const void* fn, cudaFuncAttribute attr, int value) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = enter()) return e;
  if (!fn) return record(cudaErrorInvalidDeviceFunction);
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
      if (value < 0 || static_cast<size_t>(value) > kSharedOptin) return record(cudaErrorInvalidValue);
      g_max_smem[fn] = value;
      return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
      return value >= -1 && value <= 100 ? cudaSuccess : record(cudaErrorInvalidValue);
  }
  return record(cudaErrorInvalidValue);
}

// ================================================================ control.h

Stats stats() {
  std::lock_guard<std::mutex> lock(device_mutex());
  return g_stats;
}

void reset_stats() {
  std::lock_guard<std::mutex> lock(device_mutex());
  g_stats = Stats{};
}

std::string format_stats(const Stats& s) {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "cuda-emu: %llu launches, %llu blocks, %.2f M threads, %.1f M switches, %llu block barriers, "
                "%.2f M warp collectives, %llu graph launches, %llu captures, %llu instantiations",
                static_cast<unsigned long long>(s.launches), static_cast<unsigned long long>(s.blocks),
                static_cast<double>(s.threads) / 1e6, static_cast<double>(s.switches) / 1e6,
                static_cast<unsigned long long>(s.syncthreads), static_cast<double>(s.warp_collectives) / 1e6,
                static_cast<unsigned long long>(s.graph_launches), static_cast<unsigned long long>(s.graph_captures),
                static_cast<unsigned long long>(s.graph_instantiations));
  return buf;
}

std::string last_failure() {
  std::lock_guard<std::mutex> lock(device_mutex());
  return g_failure;
}

void clear_sticky_error() {
  std::lock_guard<std::mutex> lock(device_mutex());
  g_sticky = cudaSuccess;
  g_last = cudaSuccess;
}

}  // namespace dsv4::emu

// ================================================================ the CUDA runtime API

using namespace dsv4::emu;

cudaError_t cudaGetDeviceCount(int* count) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (!count) return record(cudaErrorInvalidValue);
  *count = 0;
  if (hidden()) return record(cudaErrorNoDevice);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = enter()) return e;
  if (!device) return record(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = enter()) return e;
  return device == 0 ? cudaSuccess : record(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (hidden()) return record(cudaErrorNoDevice);
  if (!prop) return record(cudaErrorInvalidValue);
  if (device != 0) return record(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "dsv4 CUDA emulator (H100 limits)");
  prop->totalGlobalMem = kDeviceMemory;
  prop->sharedMemPerBlock = kSharedDefault;
  prop->sharedMemPerBlockOptin = kSharedOptin;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = static_cast<int>(kMaxThreads);
  prop->maxThreadsDim[0] = static_cast<int>(kMaxBlockX);
  prop->maxThreadsDim[1] = static_cast<int>(kMaxBlockY);
  prop->maxThreadsDim[2] = static_cast<int>(kMaxBlockZ);
  prop->maxGridSize[0] = static_cast<int>(kMaxGridX);
  prop->maxGridSize[1] = static_cast<int>(kMaxGridYZ);
  prop->maxGridSize[2] = static_cast<int>(kMaxGridYZ);
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = enter()) return e;
  return forbidden_during_capture(Unsafe::Sync);
}

cudaError_t cudaDeviceReset() {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (hidden()) return record(cudaErrorNoDevice);
  g_sticky = cudaSuccess;
  g_last = cudaSuccess;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  std::lock_guard<std::mutex> lock(device_mutex());
  const cudaError_t e = g_sticky ? g_sticky : g_last;
  g_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  std::lock_guard<std::mutex> lock(device_mutex());
  return g_sticky ? g_sticky : g_last;
}

const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidPitchValue: return "cudaErrorInvalidPitchValue";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (!ptr) return record(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (const cudaError_t e = enter()) return e;
  if (const cudaError_t e = forbidden_during_capture(Unsafe::Alloc)) return e;
  if (bytes == 0) return cudaSuccess;
  if (bytes > kDeviceMemory - g_allocated) return record(cudaErrorMemoryAllocation);
  void* p = nullptr;
  if (posix_memalign(&p, 256, bytes) != 0 || !p) return record(cudaErrorMemoryAllocation);  // cudaMalloc aligns to 256
  std::memset(p, 0xFF, bytes);
  g_allocs[reinterpret_cast<uintptr_t>(p)] = bytes;
  g_allocated += bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = enter()) return e;
  if (const cudaError_t e = forbidden_during_capture(Unsafe::Alloc)) return e;
  if (!ptr) return cudaSuccess;
  const auto it = g_allocs.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g_allocs.end()) return record(cudaErrorInvalidValue);
  g_allocated -= it->second;
  g_allocs.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

// The copy of cudaMemcpy / cudaMemcpyAsync on stream s (synchronous: a synchronisation too).
static cudaError_t copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s, bool sync) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = enter()) return e;
  if (!valid_stream(s)) return record(cudaErrorInvalidResourceHandle);
  if (sync)
    if (const cudaError_t e = forbidden_during_capture(Unsafe::Sync)) return e;
  if (n == 0) return cudaSuccess;
  if (!dst || !src || !copy_ok(dst, src, n, n, kind)) return record(cudaErrorInvalidValue);
  if (capturing(s)) return capture_node(s, CopyNode{dst, src, n, kind});
  if (const cudaError_t e = legacy_stream_work(s)) return e;
  std::memmove(dst, src, n);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  return copy(dst, src, n, kind, nullptr, true);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  return copy(dst, src, n, kind, s, false);
}

cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind kind) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = enter()) return e;
  if (const cudaError_t e = forbidden_during_capture(Unsafe::Sync)) return e;
  if (width == 0 || height == 0) return cudaSuccess;
  if (width > dpitch || width > spitch) return record(cudaErrorInvalidPitchValue);
  const size_t dn = dpitch * (height - 1) + width, sn = spitch * (height - 1) + width;
  if (!dst || !src || !copy_ok(dst, src, dn, sn, kind)) return record(cudaErrorInvalidValue);
  for (size_t r = 0; r < height; ++r)
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  return cudaSuccess;
}

static cudaError_t set(void* ptr, int value, size_t n, cudaStream_t s, bool sync) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = enter()) return e;
  if (!valid_stream(s)) return record(cudaErrorInvalidResourceHandle);
  if (sync)
    if (const cudaError_t e = forbidden_during_capture(Unsafe::Sync)) return e;
  if (n == 0) return cudaSuccess;
  if (!device_range(ptr, n)) return record(cudaErrorInvalidValue);
  if (capturing(s)) return capture_node(s, SetNode{ptr, value, n});
  if (const cudaError_t e = legacy_stream_work(s)) return e;
  std::memset(ptr, value, n);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* ptr, int value, size_t n) { return set(ptr, value, n, nullptr, true); }

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t n, cudaStream_t s) { return set(ptr, value, n, s, false); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = enter()) return e;
  if (!s || flags > cudaStreamNonBlocking) return record(cudaErrorInvalidValue);
  *s = new CUstream_st;
  (*s)->flags = flags;
  g_streams.insert(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = enter()) return e;
  if (!g_streams.count(s)) return record(cudaErrorInvalidResourceHandle);
  if (capturing(s)) return record(cudaErrorIllegalState);  // end the capture first
  g_streams.erase(s);
  delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = enter()) return e;
  if (!valid_stream(s)) return record(cudaErrorInvalidResourceHandle);
  return forbidden_during_capture(Unsafe::Sync);
}
