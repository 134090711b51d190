// Stream-ordered copies, pinned host memory and CUDA graphs (cuda_ops.h "graphs"): what a decode
// step captured once and replayed needs. Host code only.
#include <utility>

#include "kernels/cuda/common.cuh"

namespace dsv4::gpu {

PinnedBuffer::PinnedBuffer(size_t bytes) {
  if (bytes == 0) return;
  DSV4_CUDA_CHECK(cudaMallocHost(&ptr_, bytes));
  bytes_ = bytes;
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_) cudaFreeHost(ptr_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFreeHost(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void copy_async(void* dst, const void* src, size_t n, Stream stream) {
  if (n) DSV4_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));
}

void zero_async(void* dst, size_t n, Stream stream) {
  if (n) DSV4_CUDA_CHECK(cudaMemsetAsync(dst, 0, n, stream));
}

void begin_capture(Stream stream) { DSV4_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal)); }

Graph end_capture(Stream stream) {
  cudaGraph_t g = nullptr;
  DSV4_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);  // the executable graph is independent of it
  if (err != cudaSuccess) throw_cuda_error(err, "cudaGraphInstantiate", __FILE__, __LINE__);
  return Graph(exec);
}

void abort_capture(Stream stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess || st == cudaStreamCaptureStatusNone) return;
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(stream, &g);
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();  // the capture's error was reported where it happened
}

Graph::~Graph() {
  if (exec_) cudaGraphExecDestroy(exec_);
}

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    if (exec_) cudaGraphExecDestroy(exec_);
    exec_ = std::exchange(o.exec_, nullptr);
  }
  return *this;
}

void Graph::launch(Stream stream) const { DSV4_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

}  // namespace dsv4::gpu
