#include "device.h"

#include <algorithm>
#include <string>

#ifdef DSV4_HAVE_CUDA
#include "cuda/cuda_ops.h"
#include "model/cuda_backend.h"
#endif

namespace dsv4::cli {

Device device_option(const Args& a) {
  const std::string v = a.str("device", "cpu");
  if (v == "cpu") return Device::Cpu;
  if (v != "cuda") throw Usage("--device must be cpu or cuda, got '" + v + "'");
#ifdef DSV4_HAVE_CUDA
  if (!gpu::device_available()) throw Error("--device cuda: " + gpu::device_summary());  // says why none is usable
  return Device::Cuda;
#else
  throw Error("--device cuda: this dsv4 was built without CUDA support (CMake found no nvcc, or -DDSV4_CUDA=OFF)");
#endif
}

Model make_model(ModelWeights w, Device d, int64_t context) {
  if (d == Device::Cpu) return Model(std::move(w));
#ifdef DSV4_HAVE_CUDA
  CudaOptions o;
  o.context = std::max<int64_t>(context, 1);
  return Model(std::move(w), [&](const ModelWeights& mw) { return make_cuda_backend(mw, o); });
#else
  throw Error("--device cuda: this dsv4 was built without CUDA support");
#endif
}

int64_t default_cuda_context(const ModelConfig& c) {
  constexpr int64_t kCap = 8192;
  return c.max_positions > 0 ? std::min(c.max_positions, kCap) : kCap;
}

}  // namespace dsv4::cli
