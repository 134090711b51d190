// ggml side of scripts/ggml-compare.sh (issue 17 item 2): times a batch-1 GEMV (mul_mat with a
// one-column float32 activation) through ggml's public CPU backend API, on a set of ROWS x COLS
// weight matrices of one ggml type, about --gib GiB in all so that the caches do not help (the
// same sizing as qmatmul_bench's GEMV). Each pass computes one graph holding one mul_mat per
// matrix, the same activation for all, as a decode step would.
//
// Weights are placed as llama.cpp places them: in the first of the CPU device's extra buffer
// types (CPU_REPACK, AMX, ...) that supports the mul_mat, else in the plain CPU buffer. With
// CPU_REPACK the bytes are repacked at load (e.g. mxfp4 rows interleaved in 8s on AVX2 CPUs).
// --no-extra forces the plain CPU buffer. Threads: a persistent ggml threadpool of --threads.
//
// Not part of the project's build: scripts/ggml-compare.sh compiles it against a ggml source
// tree built with ggml's default CMake options. Weight bytes are random but valid (moderate
// scales, no NaN / inf); GB/s are of ggml_nbytes of the weights.
//
// Usage: ggml_gemv --type mxfp4|nvfp4|q8_0|bf16 --shape ROWSxCOLS [--gib G] [--reps N] [--threads N]
//                  [--no-extra]
// Prints one line: "ggml_gemv type=... shape=RxC mats=N MiB=... buft=NAME best=GB/s median=GB/s worst=GB/s"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#ifndef DSV4_GGML_NVFP4  // scripts/ggml-compare.sh sets it from the ggml tree's ggml.h
#define DSV4_GGML_NVFP4 1
#endif

uint64_t xorshift(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

// Random bytes made into valid, moderate values of the type (per the block layouts in
// ggml-common.h: block_mxfp4 = {uint8 e (E8M0); 16 bytes of nibbles}, block_q8_0 = {fp16 d; 32 int8},
// block_nvfp4 = {4 UE4M3 scales, one per 16 values; 32 bytes of nibbles}).
void fill(ggml_type t, uint8_t* p, size_t n, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = xorshift(s);
    std::memcpy(p + i, &v, std::min<size_t>(8, n - i));
  }
  if (t == GGML_TYPE_MXFP4) {
    for (size_t b = 0, i = 0; i + 17 <= n; i += 17, ++b) p[i] = static_cast<uint8_t>(120 + (b * 7) % 10);
#if DSV4_GGML_NVFP4
  } else if (t == GGML_TYPE_NVFP4) {
    // Scales 0x30-0x3F: E4M3 0.125 .. 0.234, as qmatmul_bench's NVFP4 (never NaN, never zero).
    for (size_t b = 0, i = 0; i + 36 <= n; i += 36, ++b)
      for (int k = 0; k < 4; ++k) p[i + k] = static_cast<uint8_t>(0x30 + (b * 4 + k) % 16);
#endif
  } else if (t == GGML_TYPE_Q8_0) {
    ggml_fp16_t d[8];
    for (int k = 0; k < 8; ++k) d[k] = ggml_fp32_to_fp16(0.002f * static_cast<float>(k + 1));
    for (size_t b = 0, i = 0; i + 34 <= n; i += 34, ++b) std::memcpy(p + i, &d[b % 8], 2);
  } else if (t == GGML_TYPE_BF16) {
    for (size_t i = 0; i + 2 <= n; i += 2) {
      uint16_t h;
      std::memcpy(&h, p + i, 2);
      h = static_cast<uint16_t>((h & 0x807Fu) | ((120u + ((h >> 7) & 7u)) << 7));
      std::memcpy(p + i, &h, 2);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string type_arg;
  long long rows = 0, cols = 0;
  double gib = 1.0;
  int reps = 5, threads = 2;
  bool use_extra = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--type" && i + 1 < argc) {
      type_arg = argv[++i];
    } else if (a == "--shape" && i + 1 < argc) {
      if (std::sscanf(argv[++i], "%lldx%lld", &rows, &cols) != 2) rows = cols = 0;
    } else if (a == "--gib" && i + 1 < argc) {
      gib = std::atof(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--no-extra") {
      use_extra = false;
    } else {
      rows = 0;
      break;
    }
  }
  ggml_type type = GGML_TYPE_COUNT;
  if (type_arg == "mxfp4") type = GGML_TYPE_MXFP4;
  if (type_arg == "q8_0") type = GGML_TYPE_Q8_0;
#if DSV4_GGML_NVFP4
  if (type_arg == "nvfp4") type = GGML_TYPE_NVFP4;
#endif
  if (type_arg == "bf16") type = GGML_TYPE_BF16;
  if (type == GGML_TYPE_COUNT || rows <= 0 || cols <= 0 || cols % 32 != 0 || reps < 1 || threads < 1) {
    std::fprintf(stderr, "usage: %s --type mxfp4|nvfp4|q8_0|bf16 --shape ROWSxCOLS (COLS a multiple of 32) [--gib G] "
                 "[--reps N] [--threads N] [--no-extra]\n", argv[0]);
    return 2;
  }

  // ggml logs each repacked tensor at debug level; keep warnings and errors only.
  ggml_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
      },
      nullptr);
  ggml_backend_t backend = ggml_backend_cpu_init();
  if (backend == nullptr) {
    std::fprintf(stderr, "ggml_backend_cpu_init failed\n");
    return 1;
  }
  ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
  ggml_threadpool* tp = ggml_threadpool_new(&tpp);
  ggml_backend_cpu_set_n_threads(backend, threads);
  ggml_backend_cpu_set_threadpool(backend, tp);
  ggml_backend_dev_t dev = ggml_backend_get_device(backend);

  const size_t per = ggml_row_size(type, cols) * static_cast<size_t>(rows);
  const int count = std::max(1, static_cast<int>(gib * (1u << 30) / static_cast<double>(per)));

  // Weights: a context of `count` tensors, allocated later in the chosen buffer type.
  ggml_init_params wp = {ggml_tensor_overhead() * static_cast<size_t>(count + 1), nullptr, true};
  ggml_context* wctx = ggml_init(wp);
  std::vector<ggml_tensor*> ws;
  for (int k = 0; k < count; ++k) ws.push_back(ggml_new_tensor_2d(wctx, type, cols, rows));

  // Graph: x (cols x 1, f32) and one mul_mat per weight.
  const size_t gsize = std::max<size_t>(GGML_DEFAULT_GRAPH_SIZE, static_cast<size_t>(2 * count + 8));
  ggml_init_params gp = {ggml_tensor_overhead() * static_cast<size_t>(2 * count + 8) + ggml_graph_overhead_custom(gsize, false),
                         nullptr, true};
  ggml_context* gctx = ggml_init(gp);
  ggml_tensor* x = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, cols, 1);
  std::vector<ggml_tensor*> ys;
  for (ggml_tensor* w : ws) ys.push_back(ggml_mul_mat(gctx, w, x));

  // Buffer type as llama.cpp picks it for a weight used by mul_mat.
  ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
  if (use_extra) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get_extra = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
    if (get_extra != nullptr) {
      for (ggml_backend_buffer_type_t* e = get_extra(dev); e != nullptr && *e != nullptr; ++e) {
        ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(*e, 0);
        ggml_backend_buffer_t saved = ws[0]->buffer;
        ws[0]->buffer = probe;
        const bool ok = probe != nullptr && ggml_backend_dev_supports_op(dev, ys[0]);
        ws[0]->buffer = saved;
        if (probe != nullptr) ggml_backend_buffer_free(probe);
        if (ok) {
          buft = *e;
          break;
        }
      }
    }
  }
  ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
  if (wbuf == nullptr) {
    std::fprintf(stderr, "could not allocate %.0f MiB of weights in %s\n", static_cast<double>(per) * count / (1 << 20),
                 ggml_backend_buft_name(buft));
    return 1;
  }
  ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
  {
    std::vector<uint8_t> staging(per);
    for (int k = 0; k < count; ++k) {
      fill(type, staging.data(), per, static_cast<uint64_t>(k) + 1);
      ggml_backend_tensor_set(ws[k], staging.data(), 0, per);  // repacks in CPU_REPACK
    }
  }
  ggml_backend_buffer_t gbuf = ggml_backend_alloc_ctx_tensors(gctx, backend);
  if (gbuf == nullptr) {
    std::fprintf(stderr, "could not allocate the activations\n");
    return 1;
  }
  {
    // Activation-like values, uniform in [-1, 1) (as qmatmul_bench's).
    std::vector<float> xv(static_cast<size_t>(cols));
    uint64_t st = 0x9E3779B97F4A7C15ull;
    for (float& v : xv) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>(static_cast<double>(st >> 11) * 0x1p-52 - 1.0);
    }
    ggml_backend_tensor_set(x, xv.data(), 0, xv.size() * sizeof(float));
  }
  ggml_cgraph* gf = ggml_new_graph_custom(gctx, gsize, false);
  for (ggml_tensor* y : ys) ggml_build_forward_expand(gf, y);

  auto pass = [&] {
    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
      std::fprintf(stderr, "ggml_backend_graph_compute failed\n");
      std::exit(1);
    }
  };
  pass();  // warm-up: plans the graph, allocates the work buffer
  {
    // Sanity: the outputs are finite.
    std::vector<float> yv(static_cast<size_t>(rows));
    ggml_backend_tensor_get(ys.back(), yv.data(), 0, yv.size() * sizeof(float));
    for (float v : yv)
      if (!std::isfinite(v)) {
        std::fprintf(stderr, "non-finite output\n");
        return 1;
      }
  }
  const double gb = static_cast<double>(per) * count / 1e9;
  std::vector<double> r;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_s();
    pass();
    r.push_back(gb / (now_s() - t0));
  }
  std::sort(r.begin(), r.end());
  std::printf("ggml_gemv type=%s shape=%lldx%lld mats=%d MiB=%.0f buft=%s threads=%d best=%.2f median=%.2f worst=%.2f\n",
              ggml_type_name(type), rows, cols, count, static_cast<double>(per) * count / (1 << 20),
              ggml_backend_buft_name(buft), threads, r.back(), r[r.size() / 2], r.front());

  ggml_backend_buffer_free(gbuf);
  ggml_backend_buffer_free(wbuf);
  ggml_free(gctx);
  ggml_free(wctx);
  ggml_backend_free(backend);
  ggml_threadpool_free(tp);
  return 0;
}
