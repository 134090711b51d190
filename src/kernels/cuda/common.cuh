#pragma once
// Shared device code of the CUDA kernels: error checks, launch helpers, the stored-format
// decoders and encoders (bit-exact ports of core/formats.cpp), warp/block reductions.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/cuda_ops.h"

namespace dsv4::gpu {

// ================================================================ host-side checks

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

// Wraps a runtime call: a failure throws dsv4::Error naming the call, e.g.
// "CUDA error in cudaMalloc(&p, n) (src/cuda/device.cu:42): out of memory".
#define DSV4_CUDA_CHECK(call)                                                      \
  do {                                                                             \
    const cudaError_t dsv4_err_ = (call);                                          \
    if (dsv4_err_ != cudaSuccess) ::dsv4::gpu::throw_cuda_error(dsv4_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a <<<>>> launch: throws if the launch itself failed (bad configuration, no device).
// Does not synchronise.
#define DSV4_CUDA_LAUNCHED(kernel_name)                                            \
  do {                                                                             \
    const cudaError_t dsv4_err_ = cudaGetLastError();                              \
    if (dsv4_err_ != cudaSuccess) ::dsv4::gpu::throw_cuda_error(dsv4_err_, "launch of " kernel_name, __FILE__, __LINE__); \
  } while (0)

// kernel<<<grid, block, smem, stream>>>(args...) is written
//   DSV4_LAUNCH(grid, block, smem, stream, kernel)(args...)
// and `extern __shared__ T name[];` is written DSV4_EXTERN_SHARED(T, name), so the same source
// also builds as host C++ against the CUDA emulator (src/kernels/cuda_emu, which defines both).
#ifndef DSV4_LAUNCH
#define DSV4_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#endif
#ifndef DSV4_EXTERN_SHARED
#define DSV4_EXTERN_SHARED(type, name) extern __shared__ type name[]
#endif

// Throws dsv4::Error("<op>: <message>") for a bad argument.
[[noreturn]] void bad_arg(const char* op, const std::string& message);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grid size for a grid-stride loop over n items.
inline unsigned grid_for(int64_t n, int block) {
  const int64_t g = ceil_div(n, block);
  return static_cast<unsigned>(g < 1 ? 1 : g > 65535 * 16 ? 65535 * 16 : g);
}

constexpr unsigned kFullMask = 0xFFFFFFFFu;

// The buffer a SeqRef names (read from the device table at run time), or `direct` when it names
// none (cuda_ops.h SeqRef).
template <class T>
__device__ __forceinline__ T* seq_buffer(const SeqRef& r, T* direct) {
  if (!r.table) return direct;
  return static_cast<T*>(const_cast<void*>(r.table[r.row][r.field]));
}

// ================================================================ format decoders (exact)

// E4M3FN code -> float, exact for every finite code. The code's exponent and mantissa bits are
// placed into a float's (giving 2^(e-127) * 1.m for normal codes and m * 2^-129 for subnormal
// ones) and scaled by 2^120, which is exact. NaN codes 0x7F/0xFF decode as +-480 (as the CPU
// qmatmul does; dequant_row returns NaN there).
__device__ __forceinline__ float e4m3_dec(uint32_t b) {
  return __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7Fu) << 20)) * 0x1p120f;
}

// E8M0 byte -> 2^(b-127); 0 -> 2^-127 (a float subnormal), 0xFF -> NaN.
__device__ __forceinline__ float e8m0_dec(uint32_t b) {
  return b == 0u ? __uint_as_float(0x00400000u) : b == 0xFFu ? __uint_as_float(0x7FC00000u) : __uint_as_float(b << 23);
}

// E2M1 code (low 4 bits) -> {0, .5, 1, 1.5, 2, 3, 4, 6} with sign bit 3. Same trick as e4m3_dec:
// exponent/mantissa bits into a float, times 2^126 (exact).
__device__ __forceinline__ float e2m1_dec(uint32_t c) {
  return __uint_as_float(((c & 8u) << 28) | ((c & 7u) << 22)) * 0x1p126f;
}

__device__ __forceinline__ float bf16_dec(uint32_t h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ float f16_dec(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

// ================================================================ encoders (ports of formats.cpp)

__device__ __forceinline__ uint32_t rne_drop_bits(uint32_t v, int drop) {
  const uint32_t lsb = (v >> drop) & 1u;
  return (v + ((1u << (drop - 1)) - 1u) + lsb) >> drop;
}

// round(|x| * 2^k) to nearest even for a finite non-negative bit pattern (small results only).
__device__ __forceinline__ uint32_t round_scaled_to_int(uint32_t abs_bits, int k) {
  const uint32_t biased = abs_bits >> 23;
  uint32_t mant = abs_bits & 0x007FFFFFu;
  int exp2 = -149;
  if (biased != 0) {
    mant |= 0x00800000u;
    exp2 = static_cast<int>(biased) - 150;
  }
  const int e = exp2 + k;
  if (e >= 0) return mant << e;
  const int shift = -e;
  if (shift >= 25) return 0;
  const uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return (rem > half || (rem == half && (q & 1u))) ? q + 1u : q;
}

// f32_to_e4m3: nearest even, saturating to +-448, NaN -> 0x7F.
__device__ __forceinline__ uint32_t f32_to_e4m3(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7Fu;
  if (a > 0x43E00000u) return sign | 0x7Eu;  // > 448
  if (a >= 0x3C800000u) {                     // >= 2^-6: normal
    return sign | rne_drop_bits(a - (120u << 23), 20);
  }
  return sign | round_scaled_to_int(a, 9);
}

// f32_to_e2m1: nearest even on the E2M1 grid, saturating at +-6, NaN -> 0.
__device__ __forceinline__ uint32_t f32_to_e2m1(float f) {
  const uint32_t sign = (__float_as_uint(f) & 0x80000000u) ? 8u : 0u;
  const float a = fabsf(f);
  if (isnan(a)) return 0u;
  uint32_t mag;
  if (a <= 0.25f) mag = 0;
  else if (a < 0.75f) mag = 1;
  else if (a <= 1.25f) mag = 2;
  else if (a < 1.75f) mag = 3;
  else if (a <= 2.5f) mag = 4;
  else if (a < 3.5f) mag = 5;
  else if (a <= 5.0f) mag = 6;
  else mag = 7;
  return sign | mag;
}

// 2^ceil(log2(y)) for finite y > 0, exact (pow2_ceil).
__device__ __forceinline__ float pow2_ceil(float y) {
  if (!(y > 0.0f) || isinf(y)) return y;
  const uint32_t u = __float_as_uint(y);
  const uint32_t biased = u >> 23;
  const uint32_t mant = u & 0x007FFFFFu;
  if (biased == 0) {
    const uint32_t c = mant <= 1u ? 1u : (1u << (32 - __clz(mant - 1u)));  // bit_ceil
    return __uint_as_float(c);
  }
  if (mant == 0) return y;
  return __uint_as_float((biased + 1u) << 23);
}

// The E8M0 byte of the smallest power of two s with amax / s <= limit (kv/codec.cpp block_scale).
__device__ __forceinline__ uint32_t block_scale_byte(float amax, float limit) {
  if (amax == 0.0f) return 0u;
  const uint32_t e = __float_as_uint(pow2_ceil(amax / limit)) >> 23;  // 0 for subnormal results
  return e > 254u ? 254u : e;
}

// ================================================================ reductions

// The xor butterfly of a full warp: in rounds o = 16, 8, 4, 2, 1 every lane sets
// v = combine(v, v of lane ^ o), so every lane ends with the combination of all 32 values. T is
// at most 8 bytes; `F` a stateless function object. This is what a GPU runs: one shuffle per round
// (two 32-bit ones for 8-byte values).
template <class T, class F>
__device__ __forceinline__ T warp_butterfly_shfl(T v, F combine) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "warp_butterfly: a 4- or 8-byte value");
  using Bits = std::conditional_t<sizeof(T) == 8, unsigned long long, unsigned int>;
  for (int o = 16; o > 0; o >>= 1) {
    Bits bits;
    memcpy(&bits, &v, sizeof v);
    bits = __shfl_xor_sync(kFullMask, bits, o);
    T other;
    memcpy(&other, &bits, sizeof other);
    v = combine(v, other);
  }
  return v;
}

// The same butterfly as the reductions use it. Under the CUDA emulator it is one warp collective
// that computes every lane's rounds in the same order (32 fiber switches instead of 160: these
// reductions were most of an emulated decode step's switches); Emu.ButterflyEqualsShuffles
// compares the two.
template <class T, class F>
__device__ __forceinline__ T warp_butterfly(T v, F combine) {
#ifdef DSV4_CUDA_EMU
  return ::dsv4::emu::butterfly(v, combine, __FILE__, __LINE__);
#else
  return warp_butterfly_shfl(v, combine);
#endif
}

struct SumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T mine, T theirs) const { return mine + theirs; }
};
// fmaxf's rule (a NaN loses) written out: fmaxf(-0, +0) may give either zero, and the
// compiler's inline expansions and the library's disagree, so the two butterflies would too.
// Here a lane keeps its own zero.
struct MaxOp {
  __device__ __forceinline__ float operator()(float mine, float theirs) const {
    return theirs > mine || mine != mine ? theirs : mine;
  }
};

__device__ __forceinline__ float warp_sum(float v) { return warp_butterfly(v, SumOp{}); }
__device__ __forceinline__ double warp_sum(double v) { return warp_butterfly(v, SumOp{}); }
__device__ __forceinline__ float warp_max(float v) { return warp_butterfly(v, MaxOp{}); }

// Sum over the whole block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// Contains __syncthreads: call from all threads.
template <class T>
__device__ T block_sum(T v) {
  __shared__ T part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // part[] may still be read from a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  T s = lane < nw ? part[lane] : T(0);
  return warp_sum(s);
}

// 1 / sqrt(mean(v^2) + eps) over v[0, n), the sum of squares in double (as the CPU's inv_rms).
// Every thread gets the result; contains __syncthreads (block_sum): call from all threads.
__device__ __forceinline__ float block_inv_rms(const float* v, int64_t n, double eps) {
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += static_cast<double>(v[i]) * v[i];
  ss = block_sum(ss);
  return static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + eps));
}

// In-place normalised Walsh-Hadamard transform of v[0, n) (n a power of two, v in shared memory):
// stage h adds and subtracts the pairs (j, j + h) within blocks of 2h in the CPU's loop order,
// then every value is multiplied by 1/sqrt(n). Call from all threads; ends synchronised.
__device__ __forceinline__ void block_hadamard(float* v, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t p = threadIdx.x; p < n / 2; p += blockDim.x) {
      const int64_t j = (p / h) * 2 * h + (p % h);
      const float a = v[j], b = v[j + h];
      v[j] = a + b;
      v[j + h] = a - b;
    }
    __syncthreads();
  }
  const float s = static_cast<float>(1.0 / sqrt(static_cast<double>(n)));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v[i] *= s;
  __syncthreads();
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float s = lane < nw ? part[lane] : -INFINITY;
  return warp_max(s);
}

// ================================================================ small math (mirrors ops.cpp)

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// cos/sin of the float32 angle pos * f, evaluated in double and rounded (RopeTable::at).
__device__ __forceinline__ void rope_cs(int64_t pos, float f, float& c, float& s) {
  const float ang = __fmul_rn(static_cast<float>(pos), f);
  double sd, cd;
  sincos(static_cast<double>(ang), &sd, &cd);
  c = static_cast<float>(cd);
  s = static_cast<float>(sd);
}

// One rotated pair as RopeTable::At::apply (a*c - b*s, a*s + b*c, no fused multiply-add).
__device__ __forceinline__ void rope_pair(float& a, float& b, float c, float s) {
  const float x = a, y = b;
  a = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
  b = __fadd_rn(__fmul_rn(x, s), __fmul_rn(y, c));
}

// Reads 4 bytes at any alignment as a float (the F32 RoPE part of a KvCodec vector).
__device__ __forceinline__ float load_unaligned_f32(const uint8_t* p) {
  const uint32_t u = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                     (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
  return __uint_as_float(u);
}
__device__ __forceinline__ void store_unaligned_f32(uint8_t* p, float v) {
  const uint32_t u = __float_as_uint(v);
  p[0] = static_cast<uint8_t>(u);
  p[1] = static_cast<uint8_t>(u >> 8);
  p[2] = static_cast<uint8_t>(u >> 16);
  p[3] = static_cast<uint8_t>(u >> 24);
}

// Element c of a KvCodec vector: E4M3 * E8M0 per 64 for c < nope, else the stored float.
__device__ __forceinline__ float kv_elem(const uint8_t* v, int nope, int c) {
  if (c < nope) return e4m3_dec(v[c]) * e8m0_dec(v[nope + c / 64]);
  return load_unaligned_f32(v + nope + nope / 64 + 4 * (c - nope));
}

// Element c of an Fp4Codec vector of dim values.
__device__ __forceinline__ float fp4_elem(const uint8_t* v, int dim, int c) {
  const uint32_t byte = v[c / 2];
  return e2m1_dec((c & 1) ? (byte >> 4) : (byte & 0xFu)) * e8m0_dec(v[dim / 2 + c / 32]);
}

// Element (r, c) of a stored weight, decoded as dequant_row does (scalar; embedding rows, tests).
__device__ __forceinline__ float weight_elem(const WeightView& w, int64_t r, int64_t c) {
  const uint8_t* row = w.data + r * w.pitch;
  switch (w.fmt) {
    case WFormat::F32: return reinterpret_cast<const float*>(row)[c];
    case WFormat::BF16: return bf16_dec(reinterpret_cast<const uint16_t*>(row)[c]);
    case WFormat::F16: return f16_dec(reinterpret_cast<const uint16_t*>(row)[c]);
    case WFormat::FP8Block: return e4m3_dec(row[c]) * e8m0_dec(w.scale[(r / 128) * w.scale_cols + c / 128]);
    case WFormat::MXFP4: {
      const uint32_t byte = row[c / 2];
      return e2m1_dec((c & 1) ? (byte >> 4) : (byte & 0xFu)) * e8m0_dec(w.scale[r * w.scale_cols + c / 32]);
    }
    case WFormat::NVFP4: {
      const uint32_t byte = row[c / 2];
      const float v = e2m1_dec((c & 1) ? (byte >> 4) : (byte & 0xFu)) * e4m3_dec(w.scale[r * w.scale_cols + c / 16]);
      return v * w.scale2;
    }
  }
  return 0.0f;
}

// ================================================================ activation simulations, codecs
// Warp-cooperative (call with all 32 lanes; lane i handles values i, i+32, ...). Each is the
// CPU function's arithmetic step for step, so results are bit-identical for the same input.

// fp8sim of one block of `block` values.
__device__ __forceinline__ void warp_fp8sim(float* v, int block) {
  const int lane = threadIdx.x & 31;
  float amax = 0.0f;
  for (int i = lane; i < block; i += 32) amax = fmaxf(amax, fabsf(v[i]));
  amax = fmaxf(warp_max(amax), 1e-4f);
  const float scale = pow2_ceil(amax / 448.0f);
  for (int i = lane; i < block; i += 32) {
    float q = v[i] / scale;
    q = q < -448.0f ? -448.0f : (448.0f < q ? 448.0f : q);
    v[i] = e4m3_dec(f32_to_e4m3(q)) * scale;
  }
}

// fp4sim of one block of `block` values.
__device__ __forceinline__ void warp_fp4sim(float* v, int block) {
  const int lane = threadIdx.x & 31;
  float amax = 0.0f;
  for (int i = lane; i < block; i += 32) amax = fmaxf(amax, fabsf(v[i]));
  amax = fmaxf(warp_max(amax), 6.0f * 0x1p-126f);
  const float scale = pow2_ceil(amax / 6.0f);
  for (int i = lane; i < block; i += 32) {
    float q = v[i] / scale;
    q = q < -6.0f ? -6.0f : (6.0f < q ? 6.0f : q);
    v[i] = e2m1_dec(f32_to_e2m1(q)) * scale;
  }
}

// KvCodec::encode of one 64-value block of the non-RoPE part: 64 E4M3 codes + its E8M0 byte.
__device__ __forceinline__ void warp_kv_encode64(const float* v, uint8_t* codes, uint8_t* scale_byte) {
  const int lane = threadIdx.x & 31;
  const float a = v[lane], b = v[lane + 32];
  const float amax = warp_max(fmaxf(fabsf(a), fabsf(b)));
  const uint32_t sb = block_scale_byte(amax, 448.0f);
  const float inv = 1.0f / e8m0_dec(sb);
  codes[lane] = static_cast<uint8_t>(f32_to_e4m3(a * inv));
  codes[lane + 32] = static_cast<uint8_t>(f32_to_e4m3(b * inv));
  if (lane == 0) *scale_byte = static_cast<uint8_t>(sb);
}

// Fp4Codec::encode of one 32-value block: 16 bytes of packed E2M1 (low nibble first) + E8M0 byte.
__device__ __forceinline__ void warp_fp4_encode32(const float* v, uint8_t* codes, uint8_t* scale_byte) {
  const int lane = threadIdx.x & 31;
  const float a = v[lane];
  const float amax = warp_max(fabsf(a));
  const uint32_t sb = block_scale_byte(amax, 6.0f);
  const float inv = 1.0f / e8m0_dec(sb);
  const uint32_t code = f32_to_e2m1(a * inv);
  const uint32_t hi = __shfl_down_sync(kFullMask, code, 1);
  if ((lane & 1) == 0) codes[lane / 2] = static_cast<uint8_t>(code | (hi << 4));
  if (lane == 0) *scale_byte = static_cast<uint8_t>(sb);
}

// a * b + c rounded twice, never fused (mirrors CPU code that is compiled without FMA).
__device__ __forceinline__ float mul_add(float a, float b, float c) { return __fadd_rn(__fmul_rn(a, b), c); }

// ================================================================ argmax helpers

// Whether (v, i) beats the current best (bv, bi): larger value, or equal value and lower index
// (std::max_element / topk's tie rule). NaN never beats anything; any other candidate beats
// "none yet" (bi < 0).
__device__ __forceinline__ bool beats(float v, int32_t i, float bv, int32_t bi) {
  if (isnan(v) || i < 0) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

// A candidate of an argmax; the butterfly keeps the better of two.
struct ArgBest {
  float v;
  int32_t i;
};
struct ArgmaxOp {
  __device__ __forceinline__ ArgBest operator()(ArgBest mine, ArgBest theirs) const {
    return beats(theirs.v, theirs.i, mine.v, mine.i) ? theirs : mine;
  }
};

// Block-wide argmax of per-thread candidates (bv, bi); every thread gets the winner. Contains
// __syncthreads: call from all threads.
__device__ __forceinline__ void block_argmax(float& bv, int32_t& bi) {
  __shared__ float sv[32];
  __shared__ int32_t si[32];
  ArgBest b = warp_butterfly(ArgBest{bv, bi}, ArgmaxOp{});
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // sv/si may still be read from a previous call
  if (lane == 0) sv[warp] = b.v, si[warp] = b.i;
  __syncthreads();
  b = warp_butterfly(lane < nw ? ArgBest{sv[lane], si[lane]} : ArgBest{0.0f, -1}, ArgmaxOp{});
  bv = b.v;
  bi = b.i;
}

}  // namespace dsv4::gpu
