#pragma once
// What the operating system says about memory, read in one place.
#include <cstdint>

namespace dsv4 {

// MemAvailable from /proc/meminfo in bytes (0 if unknown). The environment variable
// DSV4_AVAILABLE_MEMORY (bytes) overrides it: tests use it to play a machine with less memory
// (memory-budget refusals, the checkpoint-larger-than-RAM notice) without needing one.
uint64_t available_memory_bytes();

}  // namespace dsv4
