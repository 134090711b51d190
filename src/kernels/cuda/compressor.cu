// KV compressor (model/compressor.cpp) for the main entries and the indexer keys.
//
// The rows a block's pooling reads (the block being filled and, for ratio 4, the previous block)
// live in a ring indexed by position (slot q % ring_rows, ring_rows at least ratio, or 2 * ratio
// for the overlapping ratio 4; the backend adds kRewind rows for rewinds, as kv/state.h's
// CompressorState), so no buffer is ever swapped or counted on the host: every decision follows
// from the positions in device memory.
#include "kernels/cuda/common.cuh"

namespace dsv4::gpu {
namespace {

// One block per chunk row t; only rows that close a block (pos % ratio == ratio - 1) work.
// Shared: the entry [dout] floats.
__global__ void compress_pool_kernel(Compressor c) {
  DSV4_EXTERN_SHARED(float, ent);
  c.ring_a = seq_buffer(c.ring_a_ref, c.ring_a);
  c.ring_s = seq_buffer(c.ring_s_ref, c.ring_s);
  c.entries = seq_buffer(c.entries_ref, c.entries);
  const int64_t t = blockIdx.x;
  const int64_t p = c.pos[t], p0 = c.pos[0], ratio = c.ratio, dout = c.dout;
  if (p % ratio != ratio - 1) return;  // uniform over the block
  const int64_t b = p / ratio;
  const bool overlap = ratio == 4;
  const int64_t width = overlap ? 2 * dout : dout, ring_rows = c.ring_rows;
  const int64_t off = overlap ? dout : 0;

  // Row q's (value, score) at column col: this chunk's projections (+ ape on the score) or the
  // ring, which already holds scores with ape added (as CompressorState::cur_s).
  auto value = [&](int64_t q, int64_t col) -> float {
    return q >= p0 ? c.a[(q - p0) * width + col] : c.ring_a[(q % ring_rows) * width + col];
  };
  auto score = [&](int64_t q, int64_t col) -> float {
    return q >= p0 ? c.s[(q - p0) * width + col] + c.ape[(q % ratio) * width + col]
                   : c.ring_s[(q % ring_rows) * width + col];
  };

  const bool has_prev = overlap && b > 0;
  for (int64_t ch = threadIdx.x; ch < dout; ch += blockDim.x) {
    // The CPU's list order: the previous block's rows (channels [0, dout)), then this block's
    // (channels [off, off + dout)). Max first, then the sums in list order.
    float mx = -INFINITY;
    if (has_prev)
      for (int64_t r = 0; r < ratio; ++r) mx = fmaxf(mx, score((b - 1) * ratio + r, ch));
    for (int64_t r = 0; r < ratio; ++r) mx = fmaxf(mx, score(b * ratio + r, off + ch));
    float den = 0.0f, num = 0.0f;
    if (has_prev)
      for (int64_t r = 0; r < ratio; ++r) {
        const float e = expf(score((b - 1) * ratio + r, ch) - mx);
        den += e;
        num = mul_add(e, value((b - 1) * ratio + r, ch), num);
      }
    for (int64_t r = 0; r < ratio; ++r) {
      const float e = expf(score(b * ratio + r, off + ch) - mx);
      den += e;
      num = mul_add(e, value(b * ratio + r, off + ch), num);
    }
    ent[ch] = num / den;
  }
  // RMSNorm with the compressor norm (sum of squares in double, as inv_rms).
  const float rs = block_inv_rms(ent, dout, c.eps);  // synchronises: ent[] complete
  for (int64_t i = threadIdx.x; i < dout; i += blockDim.x) ent[i] = c.norm[i] * (ent[i] * rs);
  __syncthreads();
  // RoPE at the block's first position.
  const int64_t half = c.rope / 2;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    float co, si;
    rope_cs(b * ratio, c.freq[i], co, si);
    float* pr = ent + (dout - c.rope) + 2 * i;
    float x0 = pr[0], x1 = pr[1];
    rope_pair(x0, x1, co, si);
    pr[0] = x0;
    pr[1] = x1;
  }
  __syncthreads();
  const bool store = b < c.capacity;
  uint8_t* out = c.entries + b * c.entry_stride;
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (c.indexer) {
    // Hadamard (the CPU's stage order), then fp4sim per 32 and the Fp4Codec bytes.
    block_hadamard(ent, dout);
    for (int64_t blk = warp; blk < dout / 32; blk += nw) {
      warp_fp4sim(ent + 32 * blk, 32);
      __syncwarp();
      if (store) warp_fp4_encode32(ent + 32 * blk, out + 16 * blk, out + dout / 2 + blk);
    }
  } else {
    // fp8sim per 64 on the non-RoPE part, then the KvCodec bytes (RoPE dims as raw floats).
    const int64_t nope = dout - c.rope;
    for (int64_t blk = warp; blk < nope / 64; blk += nw) {
      warp_fp8sim(ent + 64 * blk, 64);
      __syncwarp();
      if (store) warp_kv_encode64(ent + 64 * blk, out + 64 * blk, out + nope + blk);
    }
    if (store)
      for (int64_t i = threadIdx.x; i < c.rope; i += blockDim.x)
        store_unaligned_f32(out + nope + nope / 64 + 4 * i, ent[nope + i]);
  }
}

// Keeps the chunk's last ring_rows rows (a, and s + ape) for later chunks.
__global__ void compress_ring_kernel(Compressor c) {
  c.ring_a = seq_buffer(c.ring_a_ref, c.ring_a);
  c.ring_s = seq_buffer(c.ring_s_ref, c.ring_s);
  const int64_t ratio = c.ratio, dout = c.dout;
  const bool overlap = ratio == 4;
  const int64_t width = overlap ? 2 * dout : dout, ring_rows = c.ring_rows;
  const int64_t t0 = c.T > ring_rows ? c.T - ring_rows : 0;
  const int64_t total = (c.T - t0) * width;
  const int64_t p0 = c.pos[0];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = t0 + i / width, col = i % width, q = p0 + t;
    const int64_t slot = q % ring_rows;
    c.ring_a[slot * width + col] = c.a[t * width + col];
    c.ring_s[slot * width + col] = c.s[t * width + col] + c.ape[(q % ratio) * width + col];
  }
}

}  // namespace

int64_t compressor_ring_rows(int64_t ratio) { return ratio == 4 ? 2 * ratio : ratio; }

void compress(const Compressor& in, Stream stream) {
  const char* op = "compress";
  Compressor c = in;
  if (c.ring_rows == 0) c.ring_rows = compressor_ring_rows(c.ratio);
  if (c.ratio > 0 && c.ring_rows < compressor_ring_rows(c.ratio)) bad_arg(op, "ring_rows smaller than the pooling needs");
  if (c.ratio <= 0 || c.dout <= 0) bad_arg(op, "ratio and dout must be positive");
  if (c.rope < 0 || c.rope % 2 != 0 || c.rope > c.dout) bad_arg(op, "bad rope dims");
  if (c.indexer) {
    if (c.dout % 32 != 0 || (c.dout & (c.dout - 1)) != 0) bad_arg(op, "indexer dout must be a power of two >= 32");
    if (c.entry_stride < static_cast<int64_t>(fp4_codec_bytes(c.dout))) bad_arg(op, "entry_stride too small");
  } else {
    if ((c.dout - c.rope) % 64 != 0) bad_arg(op, "dout - rope must be a multiple of 64");
    if (c.entry_stride < static_cast<int64_t>(kv_codec_bytes(c.dout, c.rope))) bad_arg(op, "entry_stride too small");
  }
  if (c.dout > 8192) bad_arg(op, "dout too large");
  if (!c.a || !c.s || !c.pos || !c.ape || !c.norm || (c.rope > 0 && !c.freq) || (!c.ring_a && !c.ring_a_ref.set()) ||
      (!c.ring_s && !c.ring_s_ref.set()) || (!c.entries && !c.entries_ref.set()))
    bad_arg(op, "missing pointer");
  if (c.T <= 0) return;
  DSV4_LAUNCH(static_cast<unsigned>(c.T), 256, static_cast<size_t>(c.dout) * sizeof(float), stream, compress_pool_kernel)(c);
  DSV4_CUDA_LAUNCHED("compress_pool_kernel");
  const int64_t width = (c.ratio == 4 ? 2 : 1) * c.dout;
  DSV4_LAUNCH(grid_for((c.T < c.ring_rows ? c.T : c.ring_rows) * width, 256), 256, 0, stream, compress_ring_kernel)(c);
  DSV4_CUDA_LAUNCHED("compress_ring_kernel");
}

}  // namespace dsv4::gpu
