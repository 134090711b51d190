#pragma once
// `dsv4 inspect`: a checkpoint's layout and formats, config summary, layer kinds, KV-cache
// bytes per layer kind and bytes per dtype (headers only: nothing is read into memory).
#include <string>

namespace dsv4 {

std::string inspect_model(const std::string& dir);

}  // namespace dsv4
