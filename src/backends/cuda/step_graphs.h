#pragma once
// The CUDA backend's decode-step graphs (docs/cuda.md "Decode step as one graph"). A step whose
// rows are one decode token per sequence (T = the batch, T <= kMaxRows) runs as one CUDA graph:
// the first such step of a batch is captured (every op of Model::step enqueued on the backend's
// stream between begin() and logits() is recorded instead of run) and launched; later steps of
// the same batch upload their per-step values (token ids, positions, sampling rows) and launch
// the graph again, and the backend's ops return at once. The kernels read everything that
// changes per step from device memory (positions, and what the kernels derive from them: window
// slots, visible entries, closing blocks; top-k counts; the MoE routing; the sampling rows), so
// a replay computes exactly what an eager step would.
//
// A graph serves any sequences: the per-sequence kernels (compressor, indexer, attention, window
// ring) find each row's caches through the step's sequence table (gpu::SeqRef: the per-step
// upload carries, with the token ids and positions, the address of each row's sequence
// descriptor), never through addresses baked in at capture. So a graph is keyed by the step's
// shape only: T, the stack (main layers or the MTP block: other ops), whether the step reads its
// final states (StepPlan::reads_hidden: the graph ends there) and its tail (logits, greedy ids,
// sampled ids or none: StepPlan::tail; a sampled step's per-row parameters and drawn numbers ride
// in the per-step upload, so they are not part of the key). Model pads a decode batch to the
// next bucket (Backend::decode_bucket: 1, 2, 4, 8, 16) with rows of a scratch sequence, so a
// server whose batch changes every step (continuous batching) replays one graph per bucket
// instead of capturing a new one per batch.
// Forks, truncates and new sequences need nothing here. At most kMaxGraphs are kept (least
// recently used dropped).
#include <algorithm>
#include <cstdint>
#include <list>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_ops.h"

namespace dsv4 {

class StepGraphs {
 public:
  static constexpr int64_t kMaxRows = 16;  // the decode qmatmul's largest T (routed experts on the device)
  static constexpr size_t kMaxGraphs = 16;  // 5 buckets x a few tails / stacks
  enum class Mode { Eager, Capture, Replay };

  // The graph of this step shape (CudaBackend::begin's key), if captured.
  const gpu::Graph* find(const std::vector<uint64_t>& key) {
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->key != key) continue;
      cache_.splice(cache_.begin(), cache_, it);  // most recently used first
      return &cache_.front().graph;
    }
    return nullptr;
  }
  void add(std::vector<uint64_t> key, gpu::Graph g, int64_t ops) {
    cache_.push_front({std::move(key), std::move(g), ops});
    if (cache_.size() > kMaxGraphs) cache_.pop_back();
  }
  // Ops the captured step of the front (just found or added) graph enqueued: a replayed step must
  // call the same number of ops (else Model's op sequence depends on something per step).
  int64_t front_ops() const { return cache_.empty() ? -1 : cache_.front().ops; }
  const gpu::Graph& front() const {
    DSV4_CHECK(!cache_.empty());
    return cache_.front().graph;
  }
  size_t size() const { return cache_.size(); }

 private:
  struct Entry {
    std::vector<uint64_t> key;
    gpu::Graph graph;
    int64_t ops = 0;
  };
  std::list<Entry> cache_;
};

}  // namespace dsv4
