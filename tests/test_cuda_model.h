#pragma once
// The model on the CUDA backend (and its CPU reference), as the GPU model tests load it
// (tests/test_cuda_{bucket,forward,graph,sample,sequence}.cpp). Most run on the tiny-native
// golden checkpoint.
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "model/forward.h"
#include "test_util.h"

namespace dsv4::testing {

// The tiny-native golden case's checkpoint directory.
inline std::string tiny_model_dir() { return golden_dir("tiny-native") + "/model"; }

// A checkpoint on the CUDA backend with these options (context, max_chunk, graphs).
inline Model cuda_model(const CudaOptions& o, const std::string& dir = tiny_model_dir()) {
  return Model(load_model(dir), [&](const ModelWeights& w) { return make_cuda_backend(w, o); });
}

// The same checkpoint on the CPU backend.
inline Model cpu_model(const std::string& dir = tiny_model_dir()) { return Model(load_model(dir), make_cpu_backend); }

}  // namespace dsv4::testing
