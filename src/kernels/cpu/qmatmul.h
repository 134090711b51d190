#pragma once
// Fused dequantise + matmul over stored weights (QWeight), with runtime ISA dispatch.
//
// qmatmul has exactly the semantics of ops.h's matmul:
//   y[t*ldy + (r - r0)] = sum_c W[r, c] * x[t*ldx + c]   for r in [r0, r1), t < T,
// rows split over the persistent pool. Weights are decoded in registers from their stored bytes
// (F32, BF16, F16, FP8Block, MXFP4, NVFP4); each weight byte is read from memory once per call.
// T <= qmatmul_fused_max_tokens(format) runs a fused decode+dot kernel (rows x token tiles, software
// prefetch); larger T decodes 64-row panels, transposed so rows run along vector lanes, into an
// L2-resident buffer and runs a broadcast GEMM microkernel per lane-chain over token tiles.
//
// Batch invariance: for a fixed ISA, each output y(r, t) is bit-identical whatever T, the
// token's position in the batch, [r0, r1), ldx/ldy, the thread count and the path (fused or
// GEMM): every path accumulates it in one canonical order (qmatmul_kernels.inc spells it out:
// W lane-chains over the columns in a fixed decoded order, each an fma chain of decoded-and-
// scaled weights times x, added by one fixed reduction tree).
// The scalar ISA has its own order (dequant_row, then four interleaved sums per token), also
// independent of the batch. Different ISAs agree only to rounding.
//
// Decoded weights are bit-identical to dequant_row's (tests check this with one-hot inputs).
// Results agree with dequant_row-then-dot to float rounding. Not reproduced: E4M3 NaN weight
// codes (0x7F/0xFF decode as +-480), E8M0 NaN scales, FP8Block scales >= 2^120 and MXFP4 scales
// >= 2^127 (beyond any real checkpoint).
#include <cstdint>

#include "core/weight.h"

namespace dsv4 {

enum class Isa { Scalar, AVX2, AVX512 };

const char* isa_name(Isa isa);
// Whether this CPU can run `isa` (Scalar always can). AVX2 needs avx2+fma+f16c; AVX512 needs
// avx512f/bw/vl/dq as well.
bool isa_supported(Isa isa);
// The fastest supported ISA.
Isa best_isa();
// The ISA qmatmul uses: the override if set, else DSV4_ISA=scalar|avx2|avx512 (read once; an
// unsupported or unknown value falls back to best_isa() with a note on stderr), else best_isa().
Isa active_isa();
// Forces an ISA for later calls (tests, benchmarks); throws Error if the CPU lacks it.
void set_isa_override(Isa isa);
void clear_isa_override();

// How the AVX-512 and AVX2 kernels decode FP8 (E4M3) weights; the results are bit-identical either way
// (the same decoded order and the same exact products), only the speed differs:
//   Bits: integer operations build each weight as the float e4m3 * 2^-120 (3 per 16 weights);
//         E4M3 subnormals (exponent field 0) become float subnormals.
//   F16:  bit moves to F16 (e4m3 * 2^-8), widened by vcvtph2ps: always a normal float, one
//         conversion more per 16 weights (AVX-512 GEMV T = 1 ~8% slower on the development
//         Xeon; on AVX2 also a byte shuffle and a lane permute, to keep the bits route's order).
//   Auto: Bits, except on Intel CPUs for calls whose weights hold many E4M3 subnormals: an Intel
//         core takes a microcode assist for every FMA with a subnormal operand (~30x the time of
//         one FMA on the development Xeon; AMD Zen does not), so such a call runs F16. "Many":
//         at least 2 in a sample of 4 KiB of the call's rows (one in 2048; quantised normal
//         weights have about one in 7000-9000, random bytes one in 16). docs/perf.md session 16.
// Default Auto; DSV4_FP8_DECODE=auto|bits|f16 (read once) or the override forces one. The scalar
// kernels have one route.
enum class Fp8Decode { Auto, Bits, F16 };
const char* fp8_decode_name(Fp8Decode d);
Fp8Decode active_fp8_decode();
void set_fp8_decode_override(Fp8Decode d);
void clear_fp8_decode_override();
// The route (Bits or F16) an AVX-512 or AVX2 qmatmul of rows [r0, r1) of FP8 weight w takes now.
Fp8Decode fp8_decode_for(const QWeight& w, int64_t r0, int64_t r1);

// Largest T handled by the fused kernel for weights of format f, the crossover in qmatmul_bench's
// T sweep: with AVX-512 24, except on AMD Zen 4 (80 for FP8Block and BF16, 40 for MXFP4, 48 for
// NVFP4); with AVX2 24 for FP8Block, 16 for MXFP4 and NVFP4, 8 for the rest. Larger T goes to
// the panel GEMM path. The setter overrides it for every format, so tests can exercise both paths
// at every T and benchmarks can find the crossover: 0 sends every T to the GEMM path, a negative
// value restores the defaults.
void set_qmatmul_fused_max_tokens(int t);
int qmatmul_fused_max_tokens(WFormat f);

void qmatmul(const QWeight& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y,
             int64_t ldy);

// Several independent qmatmuls (no call reads another's output), with the same results as
// calling qmatmul on each in turn. The calls that take the fused path (T up to the crossover)
// run as one job of the pool: their x is packed first (once for calls with the same x), then
// their rows are handed out together, so the threads meet once for all of them and balance over
// the whole job; the others run one by one. For the many small matrices of a step's routed
// experts, where each call's own synchronisation and its last range's imbalance add up.
// (Matmul: core/weight.h; r1, ldx, ldy < 0 mean as there.)
void qmatmul_many(const Matmul* calls, int64_t n);

// qmatmul keeps per-thread scratch between calls; the calling thread's holds the packed
// activations (T * cols floats, so as large as x after a big prefill). This frees the calling
// thread's scratch; the next call reallocates.
void qmatmul_release_scratch();

}  // namespace dsv4
