#pragma once
// dsv4 CUDA emulator: the plain C++ control surface (no CUDA names), for tests and tools that
// link dsv4cuda_emu. The emulator itself: cuda_emu.h; design and limits: docs/cuda.md "Emulator".
#include <cstdint>
#include <cstdio>
#include <string>

namespace dsv4::emu {

// Counters since program start (or the last reset_stats()). A "switch" is one fiber context
// switch (CUDA thread <-> CUDA thread, or to/from the launching host thread).
struct Stats {
  uint64_t launches = 0;          // kernel launches that ran (failed configurations not counted)
  uint64_t blocks = 0;            // thread blocks run
  uint64_t threads = 0;           // CUDA threads (fibers) started
  uint64_t switches = 0;          // fiber context switches
  uint64_t syncthreads = 0;       // __syncthreads barriers released (once per block barrier)
  uint64_t warp_collectives = 0;  // warp collectives released (shuffles, __syncwarp, votes; once per warp)
  uint64_t graph_launches = 0;    // cudaGraphLaunch calls that ran (their kernels count in `launches`)
  uint64_t graph_captures = 0;    // cudaStreamBeginCapture calls that started a capture
  uint64_t graph_instantiations = 0;  // cudaGraphInstantiate calls that made an executable graph
};

Stats stats();
void reset_stats();
// "cuda-emu: 15023 launches, 61234 blocks, 22.0 M threads, 801.2 M switches, ..." (one line).
std::string format_stats(const Stats& s);

// Threads of a block (and the blocks of a grid) run in reverse order. Initial value: environment
// DSV4_EMU_REVERSE=1. Outputs that change with the order reveal missing barriers / races.
void set_reverse(bool on);
bool reverse();

// The message of the last failed launch (barrier or collective reached by part of its group,
// deadlock, bad pointer argument), "" if none failed.
std::string last_failure();

// Clears the sticky error a failed launch leaves (as cudaDeviceReset does on a GPU), so a test
// can go on after checking it. Allocations are kept.
void clear_sticky_error();

}  // namespace dsv4::emu
