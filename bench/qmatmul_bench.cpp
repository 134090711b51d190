// qmatmul benchmark: measures the machine (streaming read bandwidth, peak FMA rate), then
// qmatmul per stored format: GEMV (T=1) over weights larger than the last-level cache, reported
// as GB/s of weight bytes and as a fraction of the measured bandwidth; GEMM (T=512) reported as
// GFLOP/s and as a fraction of the measured FMA peak; and the fused-vs-GEMM crossover in T.
//
// Usage: qmatmul_bench [--quick] [--reps N] [--gib G] [--isa scalar|avx2|avx512] [--threads N]
//                      [--only bw|gemv|sweep|gemm] [--shape ROWSxCOLS] [--format F[,F...]] [--no-probe]
//                      [--tokens T] [--fp8-subnormal-stride N] [--shuffle]
// --only bw measures the streaming read bandwidth on all threads and stops; --format limits the
// GEMV and GEMM tables to the named formats (F32, BF16, F16, FP8Block, MXFP4, NVFP4; any case);
// --no-probe skips the machine probes (the GEMV's "of bw" column then shows "-").
// --tokens T runs the GEMV table with T tokens per call (a batched decode step's matmuls: each
// weight byte still read once per call from beyond the LLC) and adds its GFLOP/s; given with
// --only gemm, the GEMM table's T (default 512; a 512-token prefill's routed experts see ~96).
// --fp8-subnormal-stride N keeps the FP8 weights' E4M3 subnormal codes at one byte in N (default
// 512: about one code in 8000, like quantised weights; 1: random bytes', one in 16), to see the
// FP8 decode routes on subnormal-rich weights (qmatmul.h, Fp8Decode).
// The GEMV table's last two columns: the fixed cost of a call (the same call for one row: x
// packing, scales, the thread split) and its share of a matrix's call.
// --shuffle calls the GEMV table's matrices in a fixed random order instead of the order they
// lie in memory (a decode step's routed experts: each call starts its streams somewhere new).
// scripts/ggml-compare.sh runs it as `--only gemv --shape RxC --format F --no-probe` and `--only bw`.
// GCC 12's intrinsic headers build _mm*_undefined_*() from self-initialised locals, which
// trips -Wuninitialized once inlined (GCC PR 105593); silence it for the header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "core/threads.h"
#include "core/weight.h"
#include "kernels/cpu/qmatmul.h"
#include "tools/roofline.h"

using namespace dsv4;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Stats {
  double best = 0, worst = 0, median = 0;
};

// Runs fn reps times; returns best/median/worst of the rate computed as amount / seconds.
template <class Fn>
Stats rate(int reps, double amount, Fn fn) {
  std::vector<double> r;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_s();
    fn();
    r.push_back(amount / (now_s() - t0));
  }
  std::sort(r.begin(), r.end());
  return {r.back(), r.front(), r[r.size() / 2]};
}

// ---------------------------------------------------------------- machine

struct AlignedBytes {
  uint8_t* p = nullptr;
  size_t n = 0;
  explicit AlignedBytes(size_t bytes) : n(bytes) {
    // 2 MiB-aligned and advised into huge pages, as the engine reads weights (safetensors.cpp):
    // with 4 KiB pages every row of a large matrix costs a TLB miss the engine does not pay.
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
    p = static_cast<uint8_t*>(std::aligned_alloc(kHuge, rounded));
    if (p == nullptr) {
      std::fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
      std::exit(1);
    }
    ::madvise(p, rounded, MADV_HUGEPAGE);  // advice only
  }
  ~AlignedBytes() { std::free(p); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
};

// ---------------------------------------------------------------- weights

// Fast deterministic fill (xorshift per 1 MiB piece, in parallel).
void fill_random(uint8_t* p, size_t n, uint64_t seed) {
  const size_t piece = 1 << 20;
  thread_pool().parallel_for(static_cast<int64_t>((n + piece - 1) / piece), [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      uint64_t s = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(k) * 0xD1B54A32D192ED03ull + 1;
      const size_t lo = static_cast<size_t>(k) * piece, hi = std::min(n, lo + piece);
      for (size_t i = lo; i < hi; i += 8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        std::memcpy(p + i, &s, std::min<size_t>(8, hi - i));
      }
    }
  });
}

size_t g_fp8_subnormal_stride = 512;  // --fp8-subnormal-stride

// Makes random bytes valid, moderate values of the format (no NaN/inf/subnormal floats).
void sanitize(WFormat f, uint8_t* p, size_t n) {
  thread_pool().parallel_for(static_cast<int64_t>(n / 4096 + 1), [&](int64_t b, int64_t e) {
    const size_t lo = static_cast<size_t>(b) * 4096, hi = std::min(n, static_cast<size_t>(e) * 4096);
    if (f == WFormat::F32) {
      for (size_t i = lo; i + 4 <= hi; i += 4) {
        uint32_t u;
        std::memcpy(&u, p + i, 4);
        u = (u & 0x807FFFFFu) | ((120u + ((u >> 23) & 7u)) << 23);
        std::memcpy(p + i, &u, 4);
      }
    } else if (f == WFormat::BF16 || f == WFormat::F16) {
      for (size_t i = lo; i + 2 <= hi; i += 2) {
        uint16_t h;
        std::memcpy(&h, p + i, 2);
        h = f == WFormat::BF16 ? static_cast<uint16_t>((h & 0x807Fu) | ((120u + ((h >> 7) & 7u)) << 7))
                               : static_cast<uint16_t>((h & 0x83FFu) | ((10u + ((h >> 10) & 7u)) << 10));
        std::memcpy(p + i, &h, 2);
      }
    } else if (f == WFormat::FP8Block) {
      // E4M3 subnormals (exponent 0) only at one byte in 8192, about the share in make-tiny's
      // quantised normal weights (0.012-0.017%) and in real blocks scaled to their largest value:
      // random bytes would have one in 16, which on Intel makes the bits decode measure
      // microcode assists, not the kernel (qmatmul.h, Fp8Decode).
      // --fp8-subnormal-stride N keeps them at one byte in N instead (1: all of random bytes').
      for (size_t i = lo; i < hi; ++i) {
        if ((p[i] & 0x7F) == 0x7F) p[i] ^= 1;
        if ((p[i] & 0x78) == 0 && (p[i] & 7) != 0 && i % g_fp8_subnormal_stride != 0) p[i] |= 0x08;
      }
    }
  });
}

struct WeightSet {
  std::vector<QWeight> ws;
  size_t bytes = 0;
  AlignedBytes data;
  std::vector<uint8_t> scales;
  WeightSet(WFormat f, int64_t rows, int64_t cols, int count)
      : data(static_cast<size_t>(count) * payload(f, rows, cols)) {
    const size_t pb = payload(f, rows, cols);
    fill_random(data.p, data.n, static_cast<uint64_t>(f) + 1);
    sanitize(f, data.p, data.n);
    int64_t sc = 0, srows = 0;
    uint8_t lo = 0, span = 1;
    if (f == WFormat::FP8Block) {
      sc = (cols + 127) / 128, srows = (rows + 127) / 128, lo = 120, span = 10;
    } else if (f == WFormat::MXFP4) {
      sc = (cols + 31) / 32, srows = rows, lo = 120, span = 10;
    } else if (f == WFormat::NVFP4) {
      sc = (cols + 15) / 16, srows = rows, lo = 0x30, span = 16;  // e4m3 0.125 .. 0.9
    }
    scales.resize(static_cast<size_t>(count * sc * srows));
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(lo + (i * 7) % span);
    for (int k = 0; k < count; ++k) {
      QWeight w;
      w.fmt = f;
      w.rows = rows;
      w.cols = cols;
      w.data = data.p + static_cast<size_t>(k) * pb;
      w.scale = sc ? scales.data() + static_cast<size_t>(k * sc * srows) : nullptr;
      w.scale_cols = sc;
      w.scale2 = 0.5f;
      w.name = wformat_name(f);
      measure_scale_range(w);  // as the loader does for weights read into memory
      bytes += w.stored_bytes();
      ws.push_back(w);
    }
  }
  static size_t payload(WFormat f, int64_t rows, int64_t cols) {
    QWeight w;
    w.fmt = f;
    w.rows = rows;
    w.cols = cols;
    w.scale_cols = 0;
    return w.stored_bytes();
  }
};

constexpr WFormat kFormats[] = {WFormat::F32, WFormat::BF16, WFormat::F16, WFormat::FP8Block, WFormat::MXFP4,
                                WFormat::NVFP4};

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int reps = 5, threads = 0;
  int64_t gemv_tokens = 1;
  bool tokens_given = false;
  double gib = 1.0;
  std::string isa_arg, only, formats_arg;
  bool probe = true, shuffle = false;
  long long shape_rows = 4096, shape_cols = 7168;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--gib" && i + 1 < argc) {
      gib = std::atof(argv[++i]);
    } else if (a == "--isa" && i + 1 < argc) {
      isa_arg = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--format" && i + 1 < argc) {
      formats_arg = argv[++i];
    } else if (a == "--tokens" && i + 1 < argc) {
      gemv_tokens = std::atoll(argv[++i]);
      tokens_given = true;
      if (gemv_tokens < 1 || gemv_tokens > 512) {
        std::fprintf(stderr, "--tokens wants 1..512\n");
        return 2;
      }
    } else if (a == "--no-probe") {
      probe = false;
    } else if (a == "--shuffle") {
      shuffle = true;
    } else if (a == "--fp8-subnormal-stride" && i + 1 < argc) {
      const long long n = std::atoll(argv[++i]);
      if (n < 1) {
        std::fprintf(stderr, "--fp8-subnormal-stride wants a positive byte stride\n");
        return 2;
      }
      g_fp8_subnormal_stride = static_cast<size_t>(n);
    } else if (a == "--shape" && i + 1 < argc) {
      if (std::sscanf(argv[++i], "%lldx%lld", &shape_rows, &shape_cols) != 2 || shape_rows <= 0 || shape_cols <= 0) {
        std::fprintf(stderr, "--shape wants ROWSxCOLS, e.g. 2048x4096\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--reps N] [--gib G] [--isa scalar|avx2|avx512] [--threads N] "
                   "[--only bw|gemv|sweep|gemm] [--shape ROWSxCOLS] [--format F[,F...]] [--no-probe] [--tokens T] "
                   "[--fp8-subnormal-stride N] [--shuffle]\n",
                   argv[0]);
      return 2;
    }
  }
  if (quick) gib = std::min(gib, 0.25), reps = std::min(reps, 3);
  // --format: a comma-separated subset of kFormats, names compared case-insensitively.
  std::vector<WFormat> formats;
  {
    auto upper = [](std::string v) {
      for (char& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      return v;
    };
    size_t pos = 0;
    while (!formats_arg.empty() && pos <= formats_arg.size()) {
      const size_t end = std::min(formats_arg.find(',', pos), formats_arg.size());
      const std::string name = upper(formats_arg.substr(pos, end - pos));
      bool found = false;
      for (WFormat f : kFormats)
        if (upper(wformat_name(f)) == name) formats.push_back(f), found = true;
      if (!found) {
        std::fprintf(stderr, "unknown format '%s' (F32, BF16, F16, FP8Block, MXFP4, NVFP4)\n", name.c_str());
        return 2;
      }
      pos = end + 1;
    }
    if (formats.empty()) formats.assign(std::begin(kFormats), std::end(kFormats));
  }
  if (!isa_arg.empty()) {
    const Isa isa = isa_arg == "scalar" ? Isa::Scalar : isa_arg == "avx2" ? Isa::AVX2 : Isa::AVX512;
    if (!isa_supported(isa)) {
      std::fprintf(stderr, "ISA %s not supported here\n", isa_arg.c_str());
      return 2;
    }
    set_isa_override(isa);
  }
  set_threads(threads);
  const int nthr = thread_pool().size();
  const Isa isa = active_isa();
  std::printf("qmatmul_bench: isa=%s threads=%d reps=%d weights=%.2f GiB per format (GEMV)\n", isa_name(isa), nthr,
              reps, gib);

  // Machine: the same probes `dsv4 bench` uses (src/tools/roofline).
  if (only == "bw") {
    const double bw = measure_read_bandwidth(static_cast<size_t>(1) << 30, reps);
    std::printf("read bandwidth, %d threads: best %6.2f GB/s\n", nthr, bw);
    return 0;
  }
  double bw = 0, peak = 0;
  if (probe) {
    set_threads(1);
    const double bw1 = measure_read_bandwidth(static_cast<size_t>(1) << 30, reps);
    std::printf("read bandwidth, 1 thread : best %6.2f GB/s\n", bw1);
    set_threads(threads);
    bw = measure_read_bandwidth(static_cast<size_t>(1) << 30, reps);
    std::printf("read bandwidth, %d threads: best %6.2f GB/s\n", nthr, bw);
    peak = measure_peak_gflops(reps);
    std::printf("peak FMA (%s, %d threads): best %7.1f GFLOP/s\n", isa_name(isa), nthr, peak);
  }

  // GEMV over > LLC of weights: a set of ROWS x COLS matrices (default 4096 x 7168), each called once per repetition.
  const int64_t rows = shape_rows, cols = shape_cols;
  auto run_section = [&](const char* name) { return only.empty() || only == name; };
  std::vector<float> x(static_cast<size_t>(512 * cols));
  // Activation-like values (uniform in [-1, 1)), not random bit patterns: the MXFP4 GEMV checks
  // the activations' range (deferred scales, qmatmul_kernels.inc), as real activations pass it.
  {
    uint64_t st = 0x9E3779B97F4A7C15ull;
    for (float& v : x) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>(static_cast<double>(st >> 11) * 0x1p-52 - 1.0);
    }
  }
  std::vector<float> y(static_cast<size_t>(512 * rows));
  if (run_section("gemv")) {
  const int64_t T1 = gemv_tokens;
  std::printf("\nGEMV T=%lld, %lld x %lld matrices, each read once per pass\n", static_cast<long long>(T1),
              static_cast<long long>(rows), static_cast<long long>(cols));
  std::printf("%-9s %5s %9s %9s %9s %9s %7s %9s %8s %8s %6s\n", "format", "mats", "MiB", "best GB/s", "median", "worst",
              "of bw", "ms/mat", "GFLOP/s", "fixed us", "of mat");
  for (WFormat f : formats) {
    const size_t per = WeightSet::payload(f, rows, cols);
    const int count = std::max(1, static_cast<int>(gib * (1u << 30) / static_cast<double>(per)));
    WeightSet set(f, rows, cols, count);
    // --shuffle: a fixed random order, so consecutive calls read unrelated addresses.
    std::vector<size_t> order(set.ws.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (shuffle) {
      uint64_t st = 0x2545F4914F6CDD1Dull;
      for (size_t i = order.size(); i > 1; --i) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        std::swap(order[i - 1], order[(st >> 33) % i]);
      }
    }
    auto pass = [&] {
      for (size_t i : order) qmatmul(set.ws[i], 0, rows, x.data(), cols, T1, y.data(), rows);
    };
    pass();
    const Stats s = rate(reps, static_cast<double>(set.bytes) / 1e9, pass);
    char of_bw[16] = "      -";
    if (bw > 0) std::snprintf(of_bw, sizeof of_bw, "%6.0f%%", 100.0 * s.best / bw);
    const double flop_per_byte = 2.0 * static_cast<double>(rows * cols * T1) * count / static_cast<double>(set.bytes);
    // A call's fixed cost (x packing, scale preparation, the thread split): the same call for one
    // row, the best of `reps` runs of 16 calls. It grows with T x cols and not with rows, so at small shapes it is
    // much of ms/mat (x packing was 32% of a 128x4096 BF16 call at T = 8: docs/perf.md "Session
    // 42"), and figures there are not the tile's rate.
    constexpr int kFixedCalls = 16;
    auto one_row = [&] {
      for (int k = 0; k < kFixedCalls; ++k) qmatmul(set.ws[0], 0, 1, x.data(), cols, T1, y.data(), rows);
    };
    one_row();
    const double fixed_us = 1e6 / rate(reps, kFixedCalls, one_row).best;
    const double ms_mat = 1e3 * static_cast<double>(set.bytes) / 1e9 / s.best / count;
    std::printf("%-9s %5d %9.0f %9.2f %9.2f %9.2f %s %9.3f %8.1f %8.1f %5.0f%%\n", wformat_name(f), count,
                static_cast<double>(set.bytes) / (1 << 20), s.best, s.median, s.worst, of_bw, ms_mat,
                s.best * flop_per_byte, fixed_us, 100.0 * fixed_us / (1e3 * ms_mat));
  }
  }

  // Fused vs GEMM path across T (one 4096 x 7168 matrix, L3-resident after the first call).
  const int64_t Ts[] = {1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 96, 128, 256};
  if (run_section("sweep")) {
  std::printf("\nT sweep (GFLOP/s), fused path vs GEMM path, one %lld x %lld matrix\n", static_cast<long long>(rows),
              static_cast<long long>(cols));
  for (WFormat f : {WFormat::FP8Block, WFormat::MXFP4, WFormat::NVFP4, WFormat::BF16}) {
    WeightSet set(f, rows, cols, 1);
    std::printf("%-9s", wformat_name(f));
    for (int64_t T : Ts) std::printf(" %7lld", static_cast<long long>(T));
    std::printf("\n");
    set_qmatmul_fused_max_tokens(-1);
    const int crossover = qmatmul_fused_max_tokens(f);
    double best[2][std::size(Ts)] = {};
    for (int p = 0; p < 2; ++p) {
      set_qmatmul_fused_max_tokens(p == 0 ? 1 << 20 : 0);
      std::printf("  %-6s ", p == 0 ? "fused" : "gemm");
      for (size_t i = 0; i < std::size(Ts); ++i) {
        const int64_t T = Ts[i];
        auto call = [&] { qmatmul(set.ws[0], 0, rows, x.data(), cols, T, y.data(), rows); };
        call();
        best[p][i] = rate(quick ? 2 : 3, 2.0 * rows * cols * static_cast<double>(T) / 1e9, call).best;
        std::printf(" %7.1f", best[p][i]);
      }
      std::printf("\n");
    }
    // The first T of the list from which the GEMM path stays ahead (one sweep: noisy; compare
    // several before moving a default).
    size_t from = std::size(Ts);
    while (from > 0 && best[1][from - 1] > best[0][from - 1]) --from;
    if (from < std::size(Ts)) {
      std::printf("  (default: fused up to T = %d; this sweep: GEMM ahead from T = %lld)\n", crossover,
                  static_cast<long long>(Ts[from]));
    } else {
      std::printf("  (default: fused up to T = %d; this sweep: fused still ahead at T = %lld)\n", crossover,
                  static_cast<long long>(Ts[from - 1]));
    }
  }
  set_qmatmul_fused_max_tokens(-1);
  }

  // GEMM T=512 (or --tokens with --only gemm).
  if (!run_section("gemm")) return 0;
  const int64_t T = only == "gemm" && tokens_given ? gemv_tokens : 512;
  std::printf("\nGEMM T=%lld, %lld x %lld, GFLOP/s (peak FMA %.1f)\n", static_cast<long long>(T),
              static_cast<long long>(rows), static_cast<long long>(cols), peak);
  std::printf("%-9s %10s %10s %7s\n", "format", "best", "worst", "of peak");
  for (WFormat f : formats) {
    WeightSet set(f, rows, cols, 1);
    auto call = [&] { qmatmul(set.ws[0], 0, rows, x.data(), cols, T, y.data(), rows); };
    call();
    const Stats s = rate(quick ? 2 : 3, 2.0 * rows * cols * static_cast<double>(T) / 1e9, call);
    std::printf("%-9s %10.1f %10.1f %6.0f%%\n", wformat_name(f), s.best, s.worst, peak > 0 ? 100.0 * s.best / peak : 0.0);
  }
  return 0;
}
