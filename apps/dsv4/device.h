#pragma once
// --device cpu|cuda of score, generate, chat and bench.
#include "args.h"

namespace dsv4::cli {

// --device (default cpu); any other value than cpu / cuda is a usage error (exit 2). For cuda,
// throws dsv4::Error (exit 1) at once, before anything is loaded, when this build has no CUDA
// or no device is usable, with the reason.
Device device_option(const Args& a);

}  // namespace dsv4::cli
