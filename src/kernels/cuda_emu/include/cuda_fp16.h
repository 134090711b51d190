#pragma once
// The CUDA emulator's __half (see cuda_runtime.h in this directory).
#include "kernels/cuda_emu/cuda_emu.h"
