// dsv4 CUDA emulator: stream capture, graphs and pinned host memory.
//
// Between cudaStreamBeginCapture and cudaStreamEndCapture, kernels, copies and memsets enqueued on
// the capturing stream are recorded as nodes (a kernel with its arguments by value, a copy or
// memset with its pointers and size) instead of running; cudaGraphInstantiate freezes the list
// and cudaGraphLaunch replays it in order, reading whatever the pointed-to memory holds at replay
// time, as a GPU does. The emulator runs one thing at a time, so a graph is a sequence, not a DAG.
//
// What capture forbids is refused with CUDA's codes and invalidates the capture, so a decode step
// that would only work eagerly fails here first: cudaMalloc / cudaFree (unless the capture is
// Relaxed), any synchronisation (device, stream, synchronous cudaMemcpy / cudaMemset) ->
// cudaErrorStreamCaptureUnsupported; a copy between the device and pageable (not cudaMallocHost)
// host memory -> cudaErrorStreamCaptureUnsupported (a graph may replay it after the host buffer
// changed or died); legacy-stream work while a blocking stream captures ->
// cudaErrorStreamCaptureImplicit. cudaStreamEndCapture of an invalidated capture returns
// cudaErrorStreamCaptureInvalidated and no graph. The emulator is stricter than CUDA in one
// place: CUDA permits synchronising a stream other than the capturing one in some modes; here
// every synchronisation during a capture is refused (the project never needs one).
#include <cstdlib>
#include <map>
#include <set>

#include "kernels/cuda_emu/internal.h"

struct CUgraph_st {
  std::vector<dsv4::emu::Node> nodes;
};
struct CUgraphExec_st {
  std::vector<dsv4::emu::Node> nodes;
};

namespace dsv4::emu {
namespace {

std::set<CUstream_st*> g_capturing;  // streams with an active or invalidated capture
std::set<CUgraph_st*> g_graphs;
std::set<CUgraphExec_st*> g_execs;
std::map<uintptr_t, size_t> g_pinned;  // cudaMallocHost: start -> bytes

void invalidate(CUstream_st* s) {
  s->capture = cudaStreamCaptureStatusInvalidated;
  s->nodes.clear();
}

bool is_legacy(cudaStream_t s) { return s == nullptr || reinterpret_cast<uintptr_t>(s) == 1; }

// Host side of a copy during capture: must be pinned.
bool host_side_pinned(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToDevice: return pinned_range(src, n);
    case cudaMemcpyDeviceToHost: return pinned_range(dst, n);
    case cudaMemcpyHostToHost: return pinned_range(src, n) && pinned_range(dst, n);
    case cudaMemcpyDeviceToDevice: return true;
    case cudaMemcpyDefault:
      return (device_range(src, n) || pinned_range(src, n)) && (device_range(dst, n) || pinned_range(dst, n));
  }
  return false;
}

// One node, now. False: it failed (sticky error set, or a range error recorded).
bool run_node(const Node& node) {
  if (const auto* k = std::get_if<KernelNode>(&node)) {
    // A buffer freed since the capture would fault on the device.
    if (!check_pointers(k->cfg, k->pointers.data(), static_cast<int>(k->pointers.size()))) return false;
    execute(k->cfg, k->run, k->call.get());
    return sticky_error() == cudaSuccess;
  }
  if (const auto* c = std::get_if<CopyNode>(&node)) {
    if (!copy_ok(c->dst, c->src, c->n, c->n, c->kind)) {
      fail_sticky(cudaErrorIllegalAddress, "graph replay: a captured copy's range is no longer device memory");
      return false;
    }
    std::memmove(c->dst, c->src, c->n);
    return true;
  }
  const auto& m = std::get<SetNode>(node);
  if (!device_range(m.ptr, m.n)) {
    fail_sticky(cudaErrorIllegalAddress, "graph replay: a captured memset's range is no longer device memory");
    return false;
  }
  std::memset(m.ptr, m.value, m.n);
  return true;
}

}  // namespace

bool capturing(cudaStream_t s) { return !is_legacy(s) && g_capturing.count(s) != 0; }

cudaError_t capture_node(cudaStream_t s, Node node) {
  if (s->capture == cudaStreamCaptureStatusInvalidated) return record(cudaErrorStreamCaptureInvalidated);
  if (const auto* c = std::get_if<CopyNode>(&node); c && !host_side_pinned(c->dst, c->src, c->n, c->kind)) {
    invalidate(s);
    return record(cudaErrorStreamCaptureUnsupported);
  }
  s->nodes.push_back(std::move(node));
  return cudaSuccess;
}

cudaError_t forbidden_during_capture(Unsafe what) {
  bool broke = false;
  for (CUstream_st* s : g_capturing) {
    if (s->capture != cudaStreamCaptureStatusActive) continue;
    if (what == Unsafe::Alloc && s->mode == cudaStreamCaptureModeRelaxed) continue;
    invalidate(s);
    broke = true;
  }
  return broke ? record(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

cudaError_t legacy_stream_work(cudaStream_t s) {
  if (!is_legacy(s)) return cudaSuccess;
  bool broke = false;
  for (CUstream_st* c : g_capturing) {
    if (c->capture != cudaStreamCaptureStatusActive || (c->flags & cudaStreamNonBlocking)) continue;
    invalidate(c);
    broke = true;
  }
  return broke ? record(cudaErrorStreamCaptureImplicit) : cudaSuccess;
}

bool pinned_range(const void* p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = g_pinned.upper_bound(a);
  if (it == g_pinned.begin()) return false;
  --it;
  return a - it->first <= it->second && n <= it->second - (a - it->first);
}

}  // namespace dsv4::emu

using namespace dsv4::emu;

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (!ptr) return record(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (const cudaError_t e = sticky_error()) return record(e);
  if (const cudaError_t e = forbidden_during_capture(Unsafe::Alloc)) return e;
  if (bytes == 0) return cudaSuccess;
  void* p = nullptr;
  if (posix_memalign(&p, 256, bytes) != 0 || !p) return record(cudaErrorMemoryAllocation);
  g_pinned[reinterpret_cast<uintptr_t>(p)] = bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = forbidden_during_capture(Unsafe::Alloc)) return e;
  if (!ptr) return cudaSuccess;
  if (!g_pinned.erase(reinterpret_cast<uintptr_t>(ptr))) return record(cudaErrorInvalidValue);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = sticky_error()) return record(e);
  if (is_legacy(s)) return record(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot capture
  if (!valid_stream(s) || mode > cudaStreamCaptureModeRelaxed) return record(cudaErrorInvalidValue);
  if (g_capturing.count(s)) return record(cudaErrorIllegalState);
  s->capture = cudaStreamCaptureStatusActive;
  s->mode = mode;
  s->nodes.clear();
  g_capturing.insert(s);
  ++mutable_stats().graph_captures;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (!graph) return record(cudaErrorInvalidValue);
  *graph = nullptr;
  if (is_legacy(s) || !valid_stream(s) || !g_capturing.count(s)) return record(cudaErrorIllegalState);
  g_capturing.erase(s);
  const bool ok = s->capture == cudaStreamCaptureStatusActive;
  s->capture = cudaStreamCaptureStatusNone;
  if (!ok) {
    s->nodes.clear();
    return record(cudaErrorStreamCaptureInvalidated);
  }
  *graph = new CUgraph_st{std::move(s->nodes)};
  s->nodes.clear();
  g_graphs.insert(*graph);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (!status) return record(cudaErrorInvalidValue);
  if (!valid_stream(s)) return record(cudaErrorInvalidResourceHandle);
  *status = capturing(s) ? s->capture : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (!exec) return record(cudaErrorInvalidValue);
  *exec = nullptr;
  if (const cudaError_t e = sticky_error()) return record(e);
  if (!g_graphs.count(graph)) return record(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->nodes};  // copies: the graph may be destroyed first
  g_execs.insert(*exec);
  ++mutable_stats().graph_instantiations;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = sticky_error()) return record(e);
  if (!g_execs.count(exec)) return record(cudaErrorInvalidValue);
  if (!valid_stream(s)) return record(cudaErrorInvalidResourceHandle);
  if (capturing(s)) {  // child graphs: not needed by the project, refused rather than half-done
    invalidate(s);
    return record(cudaErrorStreamCaptureUnsupported);
  }
  if (const cudaError_t e = legacy_stream_work(s)) return e;
  ++mutable_stats().graph_launches;
  for (const Node& n : exec->nodes)
    if (!run_node(n)) return record(sticky_error() ? sticky_error() : cudaErrorInvalidValue);
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (!g_graphs.erase(graph)) return record(cudaErrorInvalidValue);
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (!g_execs.erase(exec)) return record(cudaErrorInvalidValue);
  delete exec;
  return cudaSuccess;
}
