// Device basics: error reporting, device detection, buffers, streams, weight upload.
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/cuda/common.cuh"

namespace dsv4::gpu {

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  // Reset the runtime's last-error slot, so a later launch check does not report this error
  // again (sticky faults cannot be reset and keep being reported, as they should).
  cudaGetLastError();
  // Strip the path up to src/ so messages stay short and stable.
  const char* f = std::strstr(file, "src/");
  throw Error(std::string("CUDA error in ") + what + " (" + (f ? f : file) + ":" + std::to_string(line) +
              "): " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

void bad_arg(const char* op, const std::string& message) { throw Error(std::string("cuda ") + op + ": " + message); }

// ================================================================ device

namespace {

struct DeviceProbe {
  bool ok = false;
  std::string summary;
};

const DeviceProbe& probe() {
  static const DeviceProbe p = [] {
    DeviceProbe d;
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      cudaGetLastError();  // reset the last-error slot
      d.summary = std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorName(err) + ": " +
                  cudaGetErrorString(err) + ")";
      return d;
    }
    if (n <= 0) {
      d.summary = "no CUDA device (cudaGetDeviceCount returned 0)";
      return d;
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
      cudaGetLastError();
      d.summary = "CUDA device 0 did not report its properties";
      return d;
    }
    char buf[512];
    std::snprintf(buf, sizeof buf, "%s, sm_%d%d, %d SMs, %.1f GiB", prop.name, prop.major, prop.minor,
                  prop.multiProcessorCount, static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
    d.summary = buf;
    d.ok = true;
    return d;
  }();
  return p;
}

}  // namespace

bool device_available() { return probe().ok; }
std::string device_summary() { return probe().summary; }

void synchronize(Stream stream) { DSV4_CUDA_CHECK(cudaStreamSynchronize(stream)); }

Stream create_stream() {
  cudaStream_t s = nullptr;
  DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void destroy_stream(Stream stream) {
  if (stream) DSV4_CUDA_CHECK(cudaStreamDestroy(stream));
}

// ================================================================ DeviceBuffer

DeviceBuffer::DeviceBuffer(size_t bytes) {
  if (bytes == 0) return;
  DSV4_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);  // no throw from a destructor; a failure here has nothing to undo
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

namespace {
void check_range(const char* op, size_t offset, size_t n, size_t bytes) {
  if (offset > bytes || n > bytes - offset) {
    bad_arg(op, "range [" + std::to_string(offset) + ", " + std::to_string(offset + n) + ") outside a buffer of " +
                    std::to_string(bytes) + " bytes");
  }
}
}  // namespace

void DeviceBuffer::upload(const void* src, size_t n, size_t offset) {
  check_range("DeviceBuffer::upload", offset, n, bytes_);
  if (n) {
    DSV4_CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(ptr_) + offset, src, n, cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy may return before the DMA lands; work on non-blocking
    // streams must not race with it.
    DSV4_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
}

void DeviceBuffer::download(void* dst, size_t n, size_t offset) const {
  check_range("DeviceBuffer::download", offset, n, bytes_);
  if (n) DSV4_CUDA_CHECK(cudaMemcpy(dst, static_cast<const uint8_t*>(ptr_) + offset, n, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::fill_zero() { fill_bytes(0); }

void DeviceBuffer::fill_bytes(int value) {
  if (bytes_) {
    DSV4_CUDA_CHECK(cudaMemset(ptr_, value, bytes_));
    DSV4_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

// ================================================================ weights

namespace {

// Stored payload bytes of one row.
int64_t row_bytes(WFormat fmt, int64_t cols) {
  switch (fmt) {
    case WFormat::F32: return cols * 4;
    case WFormat::BF16:
    case WFormat::F16: return cols * 2;
    case WFormat::FP8Block: return cols;
    case WFormat::MXFP4:
    case WFormat::NVFP4: return cols / 2;
  }
  return 0;
}

int64_t scale_rows(WFormat fmt, int64_t rows) {
  switch (fmt) {
    case WFormat::FP8Block: return ceil_div(rows, 128);
    case WFormat::MXFP4:
    case WFormat::NVFP4: return rows;
    default: return 0;
  }
}

int64_t expected_scale_cols(WFormat fmt, int64_t cols) {
  switch (fmt) {
    case WFormat::FP8Block: return ceil_div(cols, 128);
    case WFormat::MXFP4: return ceil_div(cols, 32);
    case WFormat::NVFP4: return ceil_div(cols, 16);
    default: return 0;
  }
}

}  // namespace

WeightView DeviceWeight::view() const {
  WeightView v;
  v.fmt = fmt;
  v.rows = rows;
  v.cols = cols;
  v.pitch = pitch;
  v.data = data.as<const uint8_t>();
  v.scale = scale.as<const uint8_t>();
  v.scale_cols = scale_cols;
  v.scale2 = scale2;
  return v;
}

DeviceWeight upload_weight(const QWeight& w) {
  const char* op = "upload_weight";
  if (w.empty()) bad_arg(op, "weight '" + w.name + "' has no data");
  if (w.rows < 0 || w.cols < 0) bad_arg(op, "weight '" + w.name + "' has a negative shape");
  if ((w.fmt == WFormat::MXFP4 || w.fmt == WFormat::NVFP4) && w.cols % 2 != 0)
    bad_arg(op, "FP4 weight '" + w.name + "' has odd cols " + std::to_string(w.cols));
  const int64_t srows = scale_rows(w.fmt, w.rows);
  if (srows > 0) {
    if (!w.scale) bad_arg(op, "weight '" + w.name + "' has no scale tensor");
    if (w.scale_cols != expected_scale_cols(w.fmt, w.cols))
      bad_arg(op, "weight '" + w.name + "' has scale_cols " + std::to_string(w.scale_cols) + ", expected " +
                      std::to_string(expected_scale_cols(w.fmt, w.cols)));
  }
  DeviceWeight d;
  d.fmt = w.fmt;
  d.rows = w.rows;
  d.cols = w.cols;
  d.scale_cols = srows > 0 ? w.scale_cols : 0;
  d.scale2 = w.scale2;
  d.name = w.name;
  const int64_t rb = row_bytes(w.fmt, w.cols);
  d.pitch = ceil_div(rb, 16) * 16;
  if (w.rows > 0 && d.pitch > 0) {
    d.data = DeviceBuffer(static_cast<size_t>(d.pitch * w.rows));
    if (d.pitch != rb) d.data.fill_zero();  // the row pad is never used, but keep it defined
    DSV4_CUDA_CHECK(cudaMemcpy2D(d.data.get(), static_cast<size_t>(d.pitch), w.data, static_cast<size_t>(rb),
                                 static_cast<size_t>(rb), static_cast<size_t>(w.rows), cudaMemcpyHostToDevice));
    DSV4_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // see DeviceBuffer::upload
  } else {
    d.data = DeviceBuffer(16);  // a valid pointer for empty shapes
  }
  if (srows > 0 && d.scale_cols > 0) {
    const size_t sb = static_cast<size_t>(srows * d.scale_cols);
    d.scale = DeviceBuffer(sb);
    d.scale.upload(w.scale, sb);
  }
  return d;
}

WeightView f32_view(const float* dev, int64_t rows, int64_t cols, int64_t ld) {
  if (ld < cols) bad_arg("f32_view", "ld " + std::to_string(ld) + " < cols " + std::to_string(cols));
  if ((ld * 4) % 16 != 0 || reinterpret_cast<uintptr_t>(dev) % 16 != 0)
    bad_arg("f32_view", "rows must start on 16-byte boundaries (ld " + std::to_string(ld) + ")");
  WeightView v;
  v.fmt = WFormat::F32;
  v.rows = rows;
  v.cols = cols;
  v.pitch = ld * 4;
  v.data = reinterpret_cast<const uint8_t*>(dev);
  return v;
}

DeviceHcMix upload_hc_mix(const std::vector<float>& fn, const std::vector<float>& base, const std::vector<float>& scale,
                          int64_t rows, int64_t width) {
  if (static_cast<int64_t>(fn.size()) != rows * width || static_cast<int64_t>(base.size()) != rows || scale.empty())
    bad_arg("upload_hc_mix", "fn/base/scale sizes do not match rows " + std::to_string(rows) + " x width " +
                                 std::to_string(width));
  DeviceHcMix m;
  m.rows = rows;
  m.width = width;
  m.fn = to_device(fn);
  m.base = to_device(base);
  m.scale = to_device(scale);
  return m;
}

}  // namespace dsv4::gpu
