#pragma once
// The CUDA backend (model/backend.h) on the kernels of src/cuda: eager, one stream (the legacy
// default), the same steps as the CPU backend. Only built with the dsv4cuda library
// (DSV4_HAVE_CUDA); callers check gpu::device_available() first.
//
// Memory is fixed at creation: the weights are uploaded once in their stored form; each
// sequence's caches (window ring, compressed entries, compressor rings, indexer keys) are sized
// for `context` positions; one activation workspace per model is sized for `max_chunk` tokens
// (Model::forward feeds longer chunks in pieces). A step never allocates device memory.
//
// Host synchronisation inside a step (issue 6 removes it): the MoE dispatch copies the routed
// expert ids and weights to the host to build the per-expert token lists, and the logits are
// copied back at the end. Positions and token ids are device arrays the kernels read.
#include <cstdint>
#include <memory>

#include "model/backend.h"

namespace dsv4 {

struct CudaOptions {
  int64_t context = 4096;   // positions a sequence may hold
  int64_t max_chunk = 512;  // tokens per step (capped at context)
  bool graphs = true;       // decode steps as CUDA graphs (backends/cuda/step_graphs.h); false: eager
};

std::unique_ptr<Backend> make_cuda_backend(const ModelWeights& w, const CudaOptions& o);

}  // namespace dsv4
