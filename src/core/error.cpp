#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace dsv4 {

void check_failed(const char* file, int line, const char* expr, const std::string& detail) {
  std::fprintf(stderr, "dsv4: internal check failed at %s:%d: %s%s%s\n", file, line, expr, detail.empty() ? "" : ": ",
               detail.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace dsv4
