#pragma once
// Scalar numeric formats used by DeepSeek-V4 checkpoints and by the model's own
// activation simulations. Every conversion here is bit-exact; encoders round to nearest even.
#include <cstddef>
#include <cstdint>

namespace dsv4 {

// BF16 / F16. Encoders round to nearest even; NaN stays NaN (quiet), infinities stay infinite.
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // overflow -> inf, subnormals handled

// FP8 E4M3FN: 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities; 0x7F/0xFF are NaN;
// max finite 448. The encoder rounds to nearest even and saturates finite values beyond 448
// to +-448; NaN -> 0x7F.
float e4m3_to_f32(uint8_t b);
// e4m3_to_f32 of every byte, for decoding many values by lookup (e4m3_to_f32 takes an ldexp).
const float* e4m3_table();
uint8_t f32_to_e4m3(float f);

// E8M0: value 2^(b-127); 0xFF is NaN.
float e8m0_to_f32(uint8_t b);

// FP4 E2M1 code (low 4 bits): bit 3 sign, magnitude index c&7 -> {0,.5,1,1.5,2,3,4,6}.
float e2m1_to_f32(uint8_t code);
// Nearest even on the E2M1 grid, saturating at +-6. Returns a 4-bit code.
uint8_t f32_to_e2m1(float f);

// Activation simulations from MODEL.md (in place, n must be a multiple of block).
// fp8sim: per block amax = max(|x|, 1e-4), scale = 2^ceil(log2(amax/448)),
//         x = e4m3(clamp(x/scale, -448, 448)) * scale.
// fp4sim: per block amax = max(|x|, 6*2^-126), scale = 2^ceil(log2(amax/6)),
//         x = e2m1(clamp(x/scale, -6, 6)) * scale.
void fp8sim(float* x, size_t n, size_t block);
void fp4sim(float* x, size_t n, size_t block);

// 2^ceil(log2(y)) for finite y > 0, computed exactly (no rounding of the logarithm).
float pow2_ceil(float y);

}  // namespace dsv4
