#pragma once
// One exception type for every user-facing failure: bad files, bad config, bad arguments.
// The CLI prints what() on one line and exits non-zero.
#include <stdexcept>
#include <string>

namespace dsv4 {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace dsv4
