// Compact KV codecs on the device (kv/codec.h): the same bytes as KvCodec / Fp4Codec.
#include "kernels/cuda/common.cuh"

namespace dsv4::gpu {
namespace {

// One block (4 warps) per row. Warps encode the 64-value blocks of the non-RoPE part; the RoPE
// floats are copied as bytes (the vector layout does not align them). With `pos`, row t goes to
// slot pos[t] % ring and rows t < T - ring are skipped (the ring keeps the last `ring`).
__global__ void kv_encode_kernel(const float* __restrict__ v, int64_t T, int64_t ldv, int nope, int rope, uint8_t* out,
                                 int64_t stride, const int32_t* __restrict__ pos, int64_t ring, SeqRef out_ref) {
  out = seq_buffer(out_ref, out);
  const int64_t t = blockIdx.x;
  if (pos && t < T - ring) return;
  const int64_t slot = pos ? pos[t] % ring : t;
  const float* vr = v + t * ldv;
  uint8_t* o = out + slot * stride;
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int b = warp; b < nope / 64; b += nw) warp_kv_encode64(vr + 64 * b, o + 64 * b, o + nope + b);
  for (int i = threadIdx.x; i < rope; i += blockDim.x) store_unaligned_f32(o + nope + nope / 64 + 4 * i, vr[nope + i]);
}

__global__ void kv_decode_kernel(const uint8_t* __restrict__ in, int64_t rows, int64_t stride, int nope, int dim,
                                 float* v, int64_t ldv) {
  const int64_t total = rows * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / dim;
    const int c = static_cast<int>(i % dim);
    v[r * ldv + c] = kv_elem(in + r * stride, nope, c);
  }
}

__global__ void fp4_encode_kernel(const float* __restrict__ v, int64_t ldv, int dim, uint8_t* out, int64_t stride) {
  const int64_t t = blockIdx.x;
  const float* vr = v + t * ldv;
  uint8_t* o = out + t * stride;
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int b = warp; b < dim / 32; b += nw) warp_fp4_encode32(vr + 32 * b, o + 16 * b, o + dim / 2 + b);
}

__global__ void fp4_decode_kernel(const uint8_t* __restrict__ in, int64_t rows, int64_t stride, int dim, float* v,
                                  int64_t ldv) {
  const int64_t total = rows * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / dim;
    const int c = static_cast<int>(i % dim);
    v[r * ldv + c] = fp4_elem(in + r * stride, dim, c);
  }
}

void check_kv(const char* op, int64_t dim, int64_t rope, int64_t stride) {
  if (rope < 0 || rope > dim || (dim - rope) % 64 != 0)
    bad_arg(op, "dim - rope must be a non-negative multiple of 64 (dim " + std::to_string(dim) + ", rope " +
                    std::to_string(rope) + ")");
  if (stride < static_cast<int64_t>(kv_codec_bytes(dim, rope))) bad_arg(op, "stride smaller than the vector bytes");
}

void check_fp4(const char* op, int64_t dim, int64_t stride) {
  if (dim <= 0 || dim % 32 != 0) bad_arg(op, "dim must be a positive multiple of 32");
  if (stride < static_cast<int64_t>(fp4_codec_bytes(dim))) bad_arg(op, "stride smaller than the vector bytes");
}

}  // namespace

size_t kv_codec_bytes(int64_t dim, int64_t rope) {
  const int64_t nope = dim - rope;
  return static_cast<size_t>(nope + nope / 64 + 4 * rope);
}

size_t fp4_codec_bytes(int64_t dim) { return static_cast<size_t>(dim / 2 + dim / 32); }

void kv_encode(const float* v, int64_t rows, int64_t ldv, int64_t dim, int64_t rope, uint8_t* out, int64_t stride,
               Stream stream) {
  check_kv("kv_encode", dim, rope, stride);
  if (rows <= 0) return;
  DSV4_LAUNCH(static_cast<unsigned>(rows), 128, 0, stream, kv_encode_kernel)(v, rows, ldv, static_cast<int>(dim - rope),
                                                                    static_cast<int>(rope), out, stride, nullptr, 0, SeqRef{});
  DSV4_CUDA_LAUNCHED("kv_encode_kernel");
}

void kv_encode_ring(const float* kv, int64_t T, int64_t ldv, int64_t dim, int64_t rope, const int32_t* pos,
                    int64_t slots, uint8_t* ring, int64_t stride, Stream stream, SeqRef ring_ref) {
  check_kv("kv_encode_ring", dim, rope, stride);
  if (slots <= 0) bad_arg("kv_encode_ring", "slots must be positive");
  if (T <= 0) return;
  DSV4_LAUNCH(static_cast<unsigned>(T), 128, 0, stream, kv_encode_kernel)(kv, T, ldv, static_cast<int>(dim - rope),
                                                                 static_cast<int>(rope), ring, stride, pos, slots, ring_ref);
  DSV4_CUDA_LAUNCHED("kv_encode_kernel(ring)");
}

void kv_decode(const uint8_t* in, int64_t rows, int64_t stride, int64_t dim, int64_t rope, float* v, int64_t ldv,
               Stream stream) {
  check_kv("kv_decode", dim, rope, stride);
  if (rows <= 0) return;
  DSV4_LAUNCH(grid_for(rows * dim, 256), 256, 0, stream, kv_decode_kernel)(in, rows, stride, static_cast<int>(dim - rope),
                                                                  static_cast<int>(dim), v, ldv);
  DSV4_CUDA_LAUNCHED("kv_decode_kernel");
}

void fp4_encode(const float* v, int64_t rows, int64_t ldv, int64_t dim, uint8_t* out, int64_t stride, Stream stream) {
  check_fp4("fp4_encode", dim, stride);
  if (rows <= 0) return;
  DSV4_LAUNCH(static_cast<unsigned>(rows), 128, 0, stream, fp4_encode_kernel)(v, ldv, static_cast<int>(dim), out, stride);
  DSV4_CUDA_LAUNCHED("fp4_encode_kernel");
}

void fp4_decode(const uint8_t* in, int64_t rows, int64_t stride, int64_t dim, float* v, int64_t ldv, Stream stream) {
  check_fp4("fp4_decode", dim, stride);
  if (rows <= 0) return;
  DSV4_LAUNCH(grid_for(rows * dim, 256), 256, 0, stream, fp4_decode_kernel)(in, rows, stride, static_cast<int>(dim), v, ldv);
  DSV4_CUDA_LAUNCHED("fp4_decode_kernel");
}

}  // namespace dsv4::gpu
