#pragma once
// --device cpu|cuda of score, generate, chat and bench.
#include "args.h"

namespace dsv4::cli {

// --device (default cpu); any other value than cpu / cuda is a usage error (exit 2). For cuda,
// throws dsv4::Error (exit 1) at once, before anything is loaded, when this build has no CUDA
// or no device is usable, with the reason.
Device device_option(const Args& a);

// The engine options of generate / chat / serve: --model, --device, --threads, --load,
// --memory-budget, --tokenizer (default: the model directory; it must hold tokenizer.json).
EngineOptions engine_options(const Args& a, int64_t context);

}  // namespace dsv4::cli
