#pragma once
// The CUDA emulator stands in for the CUDA runtime header when the kernels are compiled as host
// C++ (this directory comes first on the include path of dsv4cuda_emu only).
#include "kernels/cuda_emu/cuda_emu.h"
