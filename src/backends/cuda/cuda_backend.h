#pragma once
// The CUDA backend (model/backend.h) on the kernels of src/kernels/cuda: one created stream, the
// same steps as the CPU backend (the main layers and the MTP block), decode steps as CUDA graphs
// (step_graphs.h), fork and truncate of a sequence's device caches. Only built with the dsv4cuda
// library (DSV4_HAVE_CUDA); callers check gpu::device_available() first.
//
// Memory is fixed at creation: the weights are uploaded once in their stored form; each
// sequence's caches (window ring, compressed entries, compressor rings, indexer keys; the MTP
// block's layer too when the model has one) are sized for `context` positions, with kRewind
// positions of slack in the rings for truncate; one activation workspace per model is sized for
// `max_chunk` tokens (Model::step feeds longer chunks in pieces). A step never allocates device
// memory; fork allocates the copy's caches.
//
// Host synchronisation inside a step: only steps of more than 16 rows copy the routed expert ids
// and weights to the host to build the per-expert token lists; the logits (or greedy ids) are
// copied back at the end. Positions, token ids and (MTP) the main model's final states are
// uploaded at the start of a step; the kernels read them from device memory.
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
