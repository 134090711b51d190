#include "core/sysmem.h"

#include <cstdlib>
#include <fstream>
#include <string>

namespace dsv4 {

uint64_t available_memory_bytes() {
  if (const char* e = std::getenv("DSV4_AVAILABLE_MEMORY")) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(e, &end, 10);
    if (end != e && *end == '\0') return v;
  }
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  uint64_t kb = 0;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

}  // namespace dsv4
