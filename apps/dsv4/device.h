#pragma once
// --device cpu|cuda of score, generate, chat and bench.
#include <cstdint>

#include "args.h"
#include "model/forward.h"

namespace dsv4::cli {

enum class Device { Cpu, Cuda };

// --device (default cpu); any other value than cpu / cuda is a usage error (exit 2). For cuda,
// throws dsv4::Error (exit 1) at once, before anything is loaded, when this build has no CUDA
// or no device is usable, with the reason (gpu::device_summary()).
Device device_option(const Args& a);

// The model on `d`. `context`: the positions one sequence may hold, for which the CUDA backend
// sizes its caches (the CPU grows them as needed and ignores it).
Model make_model(ModelWeights w, Device d, int64_t context);

// The context a cuda sequence is sized for when the command does not say: the model's limit,
// capped so the caches of a large model fit next to its weights.
int64_t default_cuda_context(const ModelConfig& c);

}  // namespace dsv4::cli
