// Elementwise GPU ops (src/cuda/elementwise.cu, sampling.cu, kv.cu) against the CPU functions
// they mirror: rmsnorm, RoPE, clamped SwiGLU, embedding gather, fp8sim/fp4sim, Hadamard, argmax,
// the compact KV codecs. Skipped without a CUDA device (ctest label "gpu").
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/formats.h"
#include "kv/codec.h"
#include "backends/cpu/moe.h"
#include "backends/cpu/ops.h"
#include "test_cuda_util.h"

using namespace dsv4;
using namespace dsv4::testing;

namespace {

class CudaOps : public GpuTest {};

// Values spread over many binades (and zeros), so the simulations meet every scale, subnormal
// results, saturation and rounding ties.
std::vector<float> wide_values(std::mt19937& g, size_t n) {
  std::vector<float> v(n);
  std::uniform_int_distribution<int> e(-30, 12), kind(0, 19);
  std::uniform_real_distribution<float> m(1.0f, 2.0f);
  for (size_t i = 0; i < n; ++i) {
    const int k = kind(g);
    if (k == 0) v[i] = 0.0f;
    else if (k == 1) v[i] = std::ldexp(1.5f, e(g));  // a tie for 1-bit mantissas
    else v[i] = std::ldexp(m(g), e(g)) * (g() & 1 ? -1.0f : 1.0f);
  }
  // One block scaled into the subnormal range, one all-zero block.
  for (size_t i = 0; i < std::min<size_t>(64, n); ++i) v[i] *= 0x1p-120f;
  for (size_t i = 64; i < std::min<size_t>(128, n); ++i) v[i] = 0.0f;
  return v;
}

int count_bits_differ(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a[i], b[i]) && bad++ < 5) ADD_FAILURE() << what << ": [" << i << "] gpu " << a[i] << " cpu " << b[i];
  return bad;
}

}  // namespace

// The sum of squares runs in double on both sides, in different orders: the float inverse RMS
// can differ by 1 ulp, so outputs agree to 2 ulp (5e-7 relative).
TEST_F(CudaOps, RmsNormMatchesCpu) {
  std::mt19937 g(1);
  for (int64_t n : {7, 512, 7168}) {
    const int64_t rows = 5, ld = n + 3;
    std::vector<float> x(static_cast<size_t>(rows * ld), 0.0f);
    for (auto& v : x) v = std::uniform_real_distribution<float>(-3, 3)(g);
    const std::vector<float> w = randv(g, static_cast<size_t>(n), 0.5f, 1.5f);
    for (bool weighted : {true, false}) {
      std::vector<float> want(static_cast<size_t>(rows * n));
      for (int64_t r = 0; r < rows; ++r) rmsnorm(x.data() + r * ld, weighted ? w.data() : nullptr, n, 1e-6, want.data() + r * n);
      gpu::DeviceBuffer dx = dev(x), dw = dev(w), dy = dev_nan(static_cast<size_t>(rows * n));
      gpu::rmsnorm(dx.as<float>(), ld, weighted ? dw.as<float>() : nullptr, rows, n, 1e-6, dy.as<float>(), n);
      EXPECT_EQ(count_bad(host_f(dy, want.size()), want, 0, 5e-7, "rmsnorm n=" + std::to_string(n)), 0);
      // In place.
      gpu::rmsnorm(dx.as<float>(), ld, weighted ? dw.as<float>() : nullptr, rows, n, 1e-6, dx.as<float>(), ld);
      const std::vector<float> inplace = host_f(dx, x.size());
      std::vector<float> got(want.size());
      for (int64_t r = 0; r < rows; ++r) std::copy_n(inplace.begin() + r * ld, n, got.begin() + r * n);
      EXPECT_EQ(count_bad(got, want, 0, 5e-7, "rmsnorm in place"), 0);
    }
  }
}

// cos/sin come from double sincos on both sides (CUDA's and glibc's are within 1-2 ulp in
// double) rounded to float, so they match except in astronomically rare double-rounding cases;
// the pair arithmetic is the same unfused float sequence. 1e-6 absolute covers one float ulp of
// cos/sin on values of magnitude <= 1; in practice the results are bit-identical (counted).
TEST_F(CudaOps, RopeMatchesCpuForwardAndInverse) {
  std::mt19937 g(2);
  const RopeTable t = make_rope(64, 160000.0, true, 16.0, 65536, 32.0, 1.0);
  const std::vector<int32_t> pos = {0, 1, 7, 1000, 65535, 1000003};
  const int64_t T = static_cast<int64_t>(pos.size()), H = 3, n = 192, ld = 200;
  std::vector<float> v(static_cast<size_t>(T * H * ld));
  for (auto& x : v) x = std::uniform_real_distribution<float>(-1, 1)(g);
  gpu::DeviceBuffer dfreq = dev(t.freq), dpos = dev(pos);
  for (bool inverse : {false, true}) {
    std::vector<float> want = v;
    for (int64_t i = 0; i < T * H; ++i) t.apply(want.data() + i * ld, n, pos[i / H], inverse);
    gpu::DeviceBuffer dv = dev(v);
    gpu::rope(dv.as<float>(), T * H, n, ld, dfreq.as<float>(), 64, dpos.as<int32_t>(), H, inverse);
    const std::vector<float> got = host_f(dv, v.size());
    EXPECT_EQ(count_bad(got, want, 1e-6, 0, inverse ? "inverse rope" : "rope"), 0);
    int differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += !same_bits(got[i], want[i]);
    std::printf("rope%s: %d of %zu values not bit-identical to the CPU\n", inverse ? " (inverse)" : "", differ, got.size());
  }
}

// expf (CUDA, <= 2 ulp) vs glibc expf (< 1 ulp) inside silu: a few ulp; 2e-6 relative.
TEST_F(CudaOps, SwigluClampedMatchesCpu) {
  std::mt19937 g(3);
  const int64_t rows = 4, n = 300;
  for (float lim : {10.0f, 0.0f}) {
    const std::vector<float> gv = randv(g, static_cast<size_t>(rows * n), -15, 15);
    const std::vector<float> uv = randv(g, static_cast<size_t>(rows * n), -15, 15);
    const std::vector<float> w = {0.5f, 1.0f, 2.5f, 0.125f};
    std::vector<float> want = gv;
    for (int64_t r = 0; r < rows; ++r) swiglu_clamped(want.data() + r * n, uv.data() + r * n, n, lim, w[r]);
    gpu::DeviceBuffer dg = dev(gv), du = dev(uv), dw = dev(w);
    gpu::swiglu_clamped(dg.as<float>(), n, du.as<float>(), n, rows, n, lim, dw.as<float>());
    EXPECT_EQ(count_bad(host_f(dg, want.size()), want, 1e-30, 2e-6, "swiglu lim=" + std::to_string(lim)), 0);
  }
}

// The gathered rows are dequant_row's values bit for bit; a bad id gives a NaN row.
TEST_F(CudaOps, EmbedGathersDequantisedRows) {
  uint32_t seed = 4;
  for (WFormat f : kAllFormats) {
    const OwnedWeight o = make_weight(f, 50, 96, seed++);
    const gpu::DeviceWeight d = gpu::upload_weight(o.w);
    const std::vector<int32_t> tok = {3, 0, 49, 3, 50};
    gpu::DeviceBuffer dt = dev(tok);
    const int64_t copies = 4, cols = 96, T = static_cast<int64_t>(tok.size());
    gpu::DeviceBuffer out = dev_nan(static_cast<size_t>(T * copies * cols));
    gpu::embed(d.view(), dt.as<int32_t>(), T, copies, out.as<float>());
    const std::vector<float> got = host_f(out, static_cast<size_t>(T * copies * cols));
    std::vector<float> row(static_cast<size_t>(cols));
    int bad = 0;
    for (int64_t t = 0; t < T; ++t) {
      const bool ok = tok[t] < 50;
      if (ok) dequant_row(o.w, tok[t], row.data());
      for (int64_t i = 0; i < copies; ++i)
        for (int64_t c = 0; c < cols; ++c) {
          const float v = got[(t * copies + i) * cols + c];
          if (ok ? !same_bits(v, row[c]) : !std::isnan(v)) ++bad;
        }
    }
    EXPECT_EQ(bad, 0) << wformat_name(f);
  }
}

// Ports of the CPU encoders: bit-identical results.
TEST_F(CudaOps, Fp8AndFp4SimulationBitExact) {
  std::mt19937 g(5);
  for (int64_t block : {32, 64, 128}) {
    const int64_t rows = 7, n = 8 * block, ld = n + 5;
    std::vector<float> x(static_cast<size_t>(rows * ld));
    const std::vector<float> w = wide_values(g, x.size());
    std::copy(w.begin(), w.end(), x.begin());
    for (bool fp8 : {true, false}) {
      std::vector<float> want = x;
      for (int64_t r = 0; r < rows; ++r) {
        if (fp8) fp8sim(want.data() + r * ld, static_cast<size_t>(n), static_cast<size_t>(block));
        else fp4sim(want.data() + r * ld, static_cast<size_t>(n), static_cast<size_t>(block));
      }
      gpu::DeviceBuffer dx = dev(x);
      if (fp8) gpu::fp8sim_rows(dx.as<float>(), rows, n, ld, block);
      else gpu::fp4sim_rows(dx.as<float>(), rows, n, ld, block);
      EXPECT_EQ(count_bits_differ(host_f(dx, x.size()), want, fp8 ? "fp8sim" : "fp4sim"), 0) << "block " << block;
    }
  }
}

TEST_F(CudaOps, HadamardBitExact) {
  std::mt19937 g(6);
  for (int64_t n : {1, 2, 128, 1024}) {
    const int64_t rows = 3, ld = n + 1;
    const std::vector<float> x = randv(g, static_cast<size_t>(rows * ld));
    std::vector<float> want = x;
    for (int64_t r = 0; r < rows; ++r) hadamard(want.data() + r * ld, n);
    gpu::DeviceBuffer dx = dev(x);
    gpu::hadamard_rows(dx.as<float>(), rows, n, ld);
    EXPECT_EQ(count_bits_differ(host_f(dx, x.size()), want, "hadamard n=" + std::to_string(n)), 0);
  }
}

TEST_F(CudaOps, ArgmaxFirstOfTies) {
  std::mt19937 g(7);
  const int64_t V = 129280, rows = 5;
  std::vector<float> x = randv(g, static_cast<size_t>(rows * V), -20, 20);
  x[0 * V + 77777] = 50.0f;                            // plain maximum
  x[1 * V + 100] = 60.0f, x[1 * V + 90000] = 60.0f;    // tie: the first wins
  x[2 * V + 5] = std::numeric_limits<float>::quiet_NaN();  // NaN ignored
  x[2 * V + 129279] = 70.0f;
  std::fill(x.begin() + 3 * V, x.begin() + 4 * V, -std::numeric_limits<float>::infinity());  // all -inf: index 0
  x[4 * V + 0] = 80.0f;
  std::vector<int32_t> want(rows);
  for (int64_t r = 0; r < rows; ++r) {
    int32_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (x[r * V + i] > x[r * V + best] || std::isnan(x[r * V + best])) best = static_cast<int32_t>(i);
    want[r] = best;
  }
  EXPECT_EQ(want[1], 100);
  EXPECT_EQ(want[2], 129279);
  gpu::DeviceBuffer dx = dev(x), out(rows * sizeof(int32_t));
  gpu::argmax_rows(dx.as<float>(), rows, V, V, out.as<int32_t>());
  EXPECT_EQ(host_i(out, rows), want);
}

// KvCodec / Fp4Codec bytes: the device encoder is a port, so the bytes are identical for any
// input (fp8sim'd or not); decoding is exact.
TEST_F(CudaOps, KvCodecBytesIdentical) {
  std::mt19937 g(8);
  const int64_t dim = 512, rope = 64, rows = 9;
  const KvCodec codec{dim, rope};
  const int64_t nb = static_cast<int64_t>(codec.bytes()), stride = nb + 9;
  ASSERT_EQ(gpu::kv_codec_bytes(dim, rope), codec.bytes());
  for (bool simmed : {true, false}) {
    std::vector<float> v = wide_values(g, static_cast<size_t>(rows * dim));
    if (simmed)
      for (int64_t r = 0; r < rows; ++r) fp8sim(v.data() + r * dim, static_cast<size_t>(dim - rope), 64);
    std::vector<uint8_t> want(static_cast<size_t>(rows * stride), 0xAB);
    for (int64_t r = 0; r < rows; ++r) codec.encode(v.data() + r * dim, want.data() + r * stride);
    gpu::DeviceBuffer dv = dev(v), db = dev(std::vector<uint8_t>(want.size(), 0xAB));
    gpu::kv_encode(dv.as<float>(), rows, dim, dim, rope, db.as<uint8_t>(), stride);
    EXPECT_EQ(host_u8(db, want.size()), want) << (simmed ? "fp8sim'd" : "raw");
    std::vector<float> dec(static_cast<size_t>(rows * dim));
    for (int64_t r = 0; r < rows; ++r) codec.decode(want.data() + r * stride, dec.data() + r * dim);
    gpu::DeviceBuffer dd = dev_nan(dec.size());
    gpu::kv_decode(db.as<uint8_t>(), rows, stride, dim, rope, dd.as<float>(), dim);
    EXPECT_EQ(count_bits_differ(host_f(dd, dec.size()), dec, "kv_decode"), 0);
  }
  // Fp4Codec.
  const int64_t di = 128;
  const Fp4Codec f4{di};
  const int64_t fb = static_cast<int64_t>(f4.bytes()), fstride = fb + 3;
  ASSERT_EQ(gpu::fp4_codec_bytes(di), f4.bytes());
  std::vector<float> k = wide_values(g, static_cast<size_t>(rows * di));
  for (int64_t r = 0; r < rows; ++r) fp4sim(k.data() + r * di, static_cast<size_t>(di), 32);
  std::vector<uint8_t> want(static_cast<size_t>(rows * fstride), 0xCD);
  for (int64_t r = 0; r < rows; ++r) f4.encode(k.data() + r * di, want.data() + r * fstride);
  gpu::DeviceBuffer dk = dev(k), db = dev(std::vector<uint8_t>(want.size(), 0xCD));
  gpu::fp4_encode(dk.as<float>(), rows, di, di, db.as<uint8_t>(), fstride);
  EXPECT_EQ(host_u8(db, want.size()), want);
  gpu::DeviceBuffer dd = dev_nan(k.size());
  gpu::fp4_decode(db.as<uint8_t>(), rows, fstride, di, dd.as<float>(), di);
  EXPECT_EQ(count_bits_differ(host_f(dd, k.size()), k, "fp4_decode"), 0);  // lossless after fp4sim
}

// The ring keeps the last `window` rows of the chunk at slot pos % window.
TEST_F(CudaOps, KvRingKeepsLastWindowRows) {
  std::mt19937 g(9);
  const int64_t dim = 128, rope = 64, W = 4, T = 6;
  const KvCodec codec{dim, rope};
  const int64_t nb = static_cast<int64_t>(codec.bytes());
  std::vector<float> kv = randv(g, static_cast<size_t>(T * dim));
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(10 + t);
  std::vector<uint8_t> want(static_cast<size_t>(W * nb), 0x11);
  for (int64_t t = T - W; t < T; ++t) codec.encode(kv.data() + t * dim, want.data() + (pos[t] % W) * nb);
  gpu::DeviceBuffer dkv = dev(kv), dpos = dev(pos), ring = dev(std::vector<uint8_t>(want.size(), 0x11));
  gpu::kv_encode_ring(dkv.as<float>(), T, dim, dim, rope, dpos.as<int32_t>(), W, ring.as<uint8_t>(), nb);
  EXPECT_EQ(host_u8(ring, want.size()), want);
}
