#pragma once
// `dsv4 inspect`: a checkpoint's layout and formats, config summary, layer kinds, KV-cache
// bytes per layer kind and bytes per dtype (headers only: nothing is read into memory).
#include <string>

namespace dsv4 {

// world > 1: also how `--parallel ep|tp|ep+tp` over `world` ranks splits the model
// (docs/parallel.md): each rank's resident weight bytes and the bytes it sends per decoded token.
std::string inspect_model(const std::string& dir, int world = 1, bool ep = true, bool tp = false);

}  // namespace dsv4
