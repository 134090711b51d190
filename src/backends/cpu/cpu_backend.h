#pragma once
// The CPU reference backend (model/backend.h) on the CPU ops (backends/cpu/ops.h) and kernels
// (kernels/cpu): activations in the calling thread's arena, caches in SequenceState::layers.
#include <memory>

#include "model/backend.h"

namespace dsv4 {

// `w` must outlive the backend.
std::unique_ptr<Backend> make_cpu_backend(const ModelWeights& w);

}  // namespace dsv4
