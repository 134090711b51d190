// gpu::qmatmul (src/cuda/qmatmul.cu) against the CPU: every stored format, both kernels (decode
// and tiled), odd shapes and strides, realistic shapes; decoded weights bit-exact against
// dequant_row (one-hot activations); outputs bit-identical across batch sizes and paths.
// Skipped without a CUDA device (ctest label "gpu").
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/cpu/qmatmul.h"
#include "test_cuda_util.h"

using namespace dsv4;
using namespace dsv4::testing;

namespace {

std::vector<float> run_gpu(const gpu::WeightView& w, const Problem& p) {
  gpu::DeviceBuffer dx = dev(p.x);
  gpu::DeviceBuffer dy = dev(std::vector<float>(static_cast<size_t>(p.T * p.ldy), kSentinel));
  gpu::qmatmul(w, p.r0, p.r1, dx.as<float>(), p.ldx, p.T, dy.as<float>(), p.ldy);
  return host_f(dy, static_cast<size_t>(p.T * p.ldy));
}

// check_against_reference (test_weights.h) allows 1e-5 * sum_c |W x|. The GPU order (32
// chains of n/128 groups, then a 5-level tree) has a worst-case relative error of about
// (n/32 + 5) * 2^-24 of sum |W x|, below 1e-5 for every n here (n <= 7168 -> 1.4e-5 worst case
// only for fully correlated rounding; observed errors are ~sqrt of that).
// Decode kernel for every T, tiled kernel for every T.
constexpr int kPaths[] = {1 << 20, 0};
const char* path_name(int p) { return p == 0 ? "tiled" : "decode"; }

struct PathGuard {
  ~PathGuard() { gpu::set_qmatmul_gemv_max_tokens(-1); }
};

class CudaQmatmul : public GpuTest {};

}  // namespace

// One-hot activations: token t selects column t, so y[t][r] must be W[r][t] exactly (the other
// products are +-0 and every scale multiply is exact). Columns 150 / 162 leave a partial last
// group of 4.
TEST_F(CudaQmatmul, DecodedValuesMatchDequantRowExactly) {
  PathGuard guard;
  uint32_t seed = 200;
  for (WFormat f : kAllFormats) {
    const bool fp4 = f == WFormat::MXFP4 || f == WFormat::NVFP4;
    const OwnedWeight o = make_weight(f, 140, fp4 ? 162 : 150, seed++);
    const gpu::DeviceWeight dw = gpu::upload_weight(o.w);
    const std::vector<float> deq = dequant_all(o.w);
    const int64_t T = o.w.cols;
    std::vector<float> x(static_cast<size_t>(T * T), 0.0f);
    for (int64_t t = 0; t < T; ++t) x[t * T + t] = 1.0f;
    const Problem p{0, o.w.rows, T, T, o.w.rows, x};
    for (int path : kPaths) {
      gpu::set_qmatmul_gemv_max_tokens(path);
      const std::vector<float> y = run_gpu(dw.view(), p);
      int bad = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < o.w.rows; ++r) {
          const float want = deq[r * o.w.cols + t], got = y[t * o.w.rows + r];
          if (!same_bits(got, want) && !(got == 0.0f && want == 0.0f) && bad++ < 5)
            ADD_FAILURE() << wformat_name(f) << " " << path_name(path) << " W[" << r << "," << t << "] got " << got
                          << " want " << want;
        }
      EXPECT_EQ(bad, 0) << wformat_name(f) << " " << path_name(path);
    }
  }
}

TEST_F(CudaQmatmul, SmallShapesEveryFormatBothPaths) {
  PathGuard guard;
  uint32_t seed = 1;
  for (WFormat f : kAllFormats) {
    const bool fp4 = f == WFormat::MXFP4 || f == WFormat::NVFP4;
    const std::vector<std::pair<int64_t, int64_t>> shapes =
        fp4 ? std::vector<std::pair<int64_t, int64_t>>{{130, 288}, {37, 96}, {9, 100}, {20, 2}}
            : std::vector<std::pair<int64_t, int64_t>>{{130, 260}, {37, 96}, {9, 5}, {20, 1}};
    for (auto [rows, cols] : shapes) {
      const OwnedWeight o = make_weight(f, rows, cols, seed++);
      const gpu::DeviceWeight dw = gpu::upload_weight(o.w);
      const std::vector<float> deq = dequant_all(o.w);
      for (int64_t T : {1, 2, 3, 5, 8, 9, 16, 17, 37}) {
        const int64_t r0 = rows > 8 ? 5 : 1, r1 = rows > 8 ? rows - 3 : rows;
        const Problem p = make_problem(o.w, r0, r1, T, seed++);
        for (int path : kPaths) {
          gpu::set_qmatmul_gemv_max_tokens(path);
          const std::string what = std::string(wformat_name(f)) + " " + std::to_string(rows) + "x" +
                                   std::to_string(cols) + " T=" + std::to_string(T) + " " + path_name(path);
          EXPECT_EQ(check_against_reference(o.w, deq, p, run_gpu(dw.view(), p), what), 0) << what;
        }
      }
    }
  }
}

// Shapes of the real model (D = 7168 columns, expert 2048 x 4096 FP4, BF16 rows of the head),
// fewer rows to keep the double reference quick; default path selection.
TEST_F(CudaQmatmul, RealisticShapes) {
  struct Case {
    WFormat f;
    int64_t rows, cols;
  };
  const Case cases[] = {{WFormat::FP8Block, 384, 7168}, {WFormat::MXFP4, 320, 4096}, {WFormat::NVFP4, 256, 4096},
                        {WFormat::BF16, 256, 7168},     {WFormat::F32, 24, 4 * 7168}, {WFormat::FP8Block, 300, 1536}};
  uint32_t seed = 300;
  for (const Case& c : cases) {
    const OwnedWeight o = make_weight(c.f, c.rows, c.cols, seed++);
    const gpu::DeviceWeight dw = gpu::upload_weight(o.w);
    const std::vector<float> deq = dequant_all(o.w);
    for (int64_t T : {1, 4, 16, 64}) {
      const Problem p = make_problem(o.w, 0, c.rows, T, seed++);
      const std::string what = std::string("realistic ") + wformat_name(c.f) + " " + std::to_string(c.rows) + "x" +
                               std::to_string(c.cols) + " T=" + std::to_string(T);
      EXPECT_EQ(check_against_reference(o.w, deq, p, run_gpu(dw.view(), p), what), 0) << what;
    }
  }
}

// The canonical order makes every output independent of the batch: each token alone (T = 1,
// decode kernel) must give the same bits as batches of 2..100 at several offsets, row ranges,
// strides, and the tiled kernel.
TEST_F(CudaQmatmul, BitIdenticalAcrossBatchesAndPaths) {
  PathGuard guard;
  uint32_t seed = 400;
  for (WFormat f : kAllFormats) {
    const bool fp4 = f == WFormat::MXFP4 || f == WFormat::NVFP4;
    const std::pair<int64_t, int64_t> shapes[] = {{150, fp4 ? 2340 : 2339}, {300, fp4 ? 640 : 601}, {37, 100}};
    for (auto [rows, cols] : shapes) {
      const OwnedWeight o = make_weight(f, rows, cols, seed++);
      const gpu::DeviceWeight dw = gpu::upload_weight(o.w);
      constexpr int64_t NT = 100;
      const int64_t ldx = cols + 3;
      std::mt19937 g(seed++);
      std::vector<float> x(static_cast<size_t>(NT * ldx), std::numeric_limits<float>::quiet_NaN());
      for (int64_t t = 0; t < NT; ++t)
        for (int64_t c = 0; c < cols; ++c) x[t * ldx + c] = std::uniform_real_distribution<float>(-1, 1)(g);
      // Reference: each token alone, decode kernel, all rows.
      gpu::set_qmatmul_gemv_max_tokens(-1);
      std::vector<float> ref(static_cast<size_t>(NT * rows));
      for (int64_t t = 0; t < NT; ++t) {
        Problem p{0, rows, 1, ldx, rows, std::vector<float>(x.begin() + t * ldx, x.begin() + (t + 1) * ldx)};
        const std::vector<float> y = run_gpu(dw.view(), p);
        std::copy(y.begin(), y.begin() + rows, ref.begin() + t * rows);
      }
      int bad = 0;
      auto check = [&](int path, int64_t t0, int64_t T, int64_t r0, int64_t r1) {
        gpu::set_qmatmul_gemv_max_tokens(path);
        const int64_t ldx2 = cols + 11;
        Problem p{r0, r1, T, ldx2, (r1 - r0) + 2, {}};
        p.x.assign(static_cast<size_t>(T * ldx2), std::numeric_limits<float>::quiet_NaN());
        for (int64_t t = 0; t < T; ++t) std::memcpy(&p.x[t * ldx2], &x[(t0 + t) * ldx], sizeof(float) * cols);
        const std::vector<float> y = run_gpu(dw.view(), p);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t i = 0; i < r1 - r0; ++i) {
            const float got = y[t * p.ldy + i], want = ref[(t0 + t) * rows + r0 + i];
            if (!same_bits(got, want) && bad++ < 5)
              ADD_FAILURE() << wformat_name(f) << " " << rows << "x" << cols << " path=" << path << " batch [" << t0
                            << "," << t0 + T << ") rows [" << r0 << "," << r1 << "): token " << t0 + t << " row "
                            << r0 + i << " got " << got << " alone " << want;
          }
      };
      for (int path : {-1, 1 << 20, 0}) {
        for (int64_t T : {2, 3, 7, 8, 16, 17, 37, 100}) {
          check(path, 0, T, 0, rows);
          if (T < NT) check(path, NT - T, T, 0, rows);
        }
        check(path, 5, 7, 3, rows - 2);
        check(path, 20, 37, rows / 2, rows / 2 + 1);
        check(path, 11, 17, 0, rows / 3 + 1);
      }
      EXPECT_EQ(bad, 0) << wformat_name(f) << " " << rows << "x" << cols;
    }
  }
}

TEST_F(CudaQmatmul, AgreesWithCpuQmatmul) {
  // The CPU library's own result (any ISA) and the GPU's differ only by summation order:
  // 2e-5 * sum|W x| covers both errors (each <= 1e-5, see check_against_reference).
  uint32_t seed = 500;
  for (WFormat f : kAllFormats) {
    const OwnedWeight o = make_weight(f, 200, 1024, seed++);
    const gpu::DeviceWeight dw = gpu::upload_weight(o.w);
    const std::vector<float> deq = dequant_all(o.w);
    for (int64_t T : {1, 33}) {
      const Problem p = make_problem(o.w, 0, 200, T, seed++);
      std::vector<float> cpu(static_cast<size_t>(T * p.ldy), kSentinel);
      qmatmul(o.w, 0, 200, p.x.data(), p.ldx, T, cpu.data(), p.ldy);
      const std::vector<float> got = run_gpu(dw.view(), p);
      int bad = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < 200; ++r) {
          double sa = 0;
          for (int64_t c = 0; c < o.w.cols; ++c) sa += std::fabs(static_cast<double>(deq[r * o.w.cols + c]) * p.x[t * p.ldx + c]);
          const float a = got[t * p.ldy + r], b = cpu[t * p.ldy + r];
          if (!(std::fabs(a - b) <= 2e-5 * sa) && bad++ < 5)
            ADD_FAILURE() << wformat_name(f) << " T=" << T << " row " << r << " gpu " << a << " cpu " << b;
        }
      EXPECT_EQ(bad, 0) << wformat_name(f);
    }
  }
}

TEST_F(CudaQmatmul, EmptyAndDegenerate) {
  // No columns: every sum is empty (+0). No rows / no tokens: nothing written.
  OwnedWeight z = make_weight(WFormat::F32, 5, 0, 9);
  z.w.data = reinterpret_cast<const uint8_t*>("");  // non-null, never read
  const gpu::DeviceWeight dz = gpu::upload_weight(z.w);
  gpu::DeviceBuffer dx = dev(std::vector<float>(3, 1.0f));
  gpu::DeviceBuffer dy = dev(std::vector<float>(15, kSentinel));
  for (int path : kPaths) {
    PathGuard guard;
    gpu::set_qmatmul_gemv_max_tokens(path);
    gpu::qmatmul(dz.view(), 0, 5, dx.as<float>(), 1, 3, dy.as<float>(), 5);
    for (float v : host_f(dy, 15)) EXPECT_EQ(v, 0.0f);
  }
  const OwnedWeight o = make_weight(WFormat::FP8Block, 4, 8, 10);
  const gpu::DeviceWeight dw = gpu::upload_weight(o.w);
  gpu::DeviceBuffer dy2 = dev(std::vector<float>(4, kSentinel));
  gpu::qmatmul(dw.view(), 2, 2, dx.as<float>(), 8, 1, dy2.as<float>(), 4);
  gpu::qmatmul(dw.view(), 0, 4, dx.as<float>(), 8, 0, dy2.as<float>(), 4);
  for (float v : host_f(dy2, 4)) EXPECT_EQ(v, kSentinel);
}

TEST_F(CudaQmatmul, RejectsBadArguments) {
  const OwnedWeight o = make_weight(WFormat::F32, 4, 8, 7);
  const gpu::DeviceWeight dw = gpu::upload_weight(o.w);
  gpu::DeviceBuffer dx = dev(std::vector<float>(8, 1.0f));
  gpu::DeviceBuffer dy(16);
  EXPECT_THROW(gpu::qmatmul(dw.view(), 0, 5, dx.as<float>(), 8, 1, dy.as<float>(), 4), Error);
  EXPECT_THROW(gpu::qmatmul(dw.view(), 3, 2, dx.as<float>(), 8, 1, dy.as<float>(), 4), Error);
  EXPECT_THROW(gpu::qmatmul(gpu::WeightView{}, 0, 0, dx.as<float>(), 8, 1, dy.as<float>(), 4), Error);
  EXPECT_THROW(gpu::f32_view(dx.as<float>() + 1, 1, 4, 4), Error);  // not 16-byte aligned
  EXPECT_THROW(gpu::f32_view(dx.as<float>(), 1, 3, 3), Error);      // row stride of 12 bytes
  OwnedWeight odd = make_weight(WFormat::MXFP4, 2, 64, 8);
  odd.w.cols = 63;
  EXPECT_THROW(gpu::upload_weight(odd.w), Error);
}
