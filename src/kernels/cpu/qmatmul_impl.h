#pragma once
// Internals shared by the qmatmul driver (qmatmul.cpp) and its per-ISA kernels
// (qmatmul_avx2.cpp, qmatmul_avx512.cpp). Not part of the public API.
#include <cstddef>
#include <cstdint>

#include "core/weight.h"

namespace dsv4::qmm {

// One ISA's whole qmatmul: packs x, then splits rows over the pool. Arguments are validated.
using RunFn = void (*)(const QWeight& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T,
                       float* y, int64_t ldy, int fused_max_t);

void run_avx2(const QWeight& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y,
              int64_t ldy, int fused_max_t);
void run_avx512(const QWeight& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y,
                int64_t ldy, int fused_max_t);

// Whether an AVX-512 qmatmul of rows [r0, r1) of FP8 weight w decodes through F16
// (fp8_decode_for in qmatmul.h).
bool fp8_via_f16(const QWeight& w, int64_t r0, int64_t r1);

// Whether the AVX-512 fused tiles take the shapes measured on AMD Zen 5 (family 0x1A and later;
// qmatmul_avx512.cpp, FusedShapes).
bool zen5_shapes();

// Of the packed tokens a fused tile multiplies: every nonzero x is a multiple of 2^lsb, every
// |x| is below 2^emax, every token's sum of |x| is below 2^sum_exp (1000: not finite). Decides
// whether deferred scales are exact (qmatmul_kernels.inc, deferral_exact) and whether scaling x
// is (FP8, fp8_fast_ok in qmatmul_kernels.inc).
struct XStats {
  int lsb = 1000;
  int emax = -1000;
  int sum_exp = -1000;
};

// Per-thread, 64-byte aligned scratch that grows on demand and lives until the thread exits.
// Distinct slots may be held at once; the calling thread owns kSlotX for the packed activations
// while pool workers (and the caller, as one of them) use the others.
enum ScratchSlot { kSlotX = 0, kSlotPanel = 1, kSlotScale = 2, kSlotOut = 3, kSlotTmp = 4, kSlotXScaled = 5, kNumSlots = 6 };
float* scratch(ScratchSlot slot, size_t floats);
// Frees the calling thread's scratch.
void release_scratch();

}  // namespace dsv4::qmm
