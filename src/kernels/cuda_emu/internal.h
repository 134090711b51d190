#pragma once
// What the emulator's scheduler (scheduler.cpp) and runtime (runtime.cpp) share. Not for users.
#include <mutex>
#include <string>

#include "kernels/cuda_emu/cuda_emu.h"

namespace dsv4::emu {

// Every runtime call and every launch holds this: the emulated device runs one thing at a time.
std::mutex& device_mutex();

// Under device_mutex():
cudaError_t sticky_error();                             // cudaSuccess unless a kernel failed
cudaError_t record(cudaError_t err);                    // remembers a non-success as the last error
void fail_sticky(cudaError_t err, const std::string& message);  // a kernel failed: sticky + message on stderr
bool points_into_device_memory(const void* p);          // inside an allocation or one past its end
bool valid_stream(cudaStream_t s);
int max_dynamic_smem(const void* kernel);               // cudaFuncAttributeMaxDynamicSharedMemorySize, 0 if unset
Stats& mutable_stats();

// The emulated device's limits (cudaGetDeviceProperties reports the same numbers).
constexpr size_t kSharedDefault = 48 * 1024, kSharedOptin = 227 * 1024;
constexpr unsigned kMaxThreads = 1024, kMaxBlockX = 1024, kMaxBlockY = 1024, kMaxBlockZ = 64;
constexpr unsigned kMaxGridX = 0x7FFFFFFFu, kMaxGridYZ = 65535;

// "src/cuda/x.cu" from a full __FILE__ path (messages stay short).
const char* short_path(const char* file);

}  // namespace dsv4::emu
