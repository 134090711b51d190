#include "kernels/cpu/qmatmul.h"

#include <cpuid.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threads.h"
#include "kernels/cpu/qmatmul_impl.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace dsv4 {
namespace qmm {

namespace {

int64_t cdiv_pos(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct AlignedBuf {
  float* p = nullptr;
  size_t cap = 0;
  AlignedBuf() = default;
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  ~AlignedBuf() {
#if defined(__SANITIZE_ADDRESS__)
    if (p != nullptr) ASAN_UNPOISON_MEMORY_REGION(p, cap * sizeof(float));
#endif
    std::free(p);
  }
};

}  // namespace

namespace {
AlignedBuf* thread_bufs() {
  thread_local AlignedBuf bufs[kNumSlots];
  return bufs;
}
}  // namespace

void release_scratch() {
  for (int i = 0; i < kNumSlots; ++i) {
    AlignedBuf& b = thread_bufs()[i];
#if defined(__SANITIZE_ADDRESS__)
    if (b.p != nullptr) ASAN_UNPOISON_MEMORY_REGION(b.p, b.cap * sizeof(float));
#endif
    std::free(b.p);
    b.p = nullptr;
    b.cap = 0;
  }
}

float* scratch(ScratchSlot slot, size_t floats) {
  AlignedBuf& b = thread_bufs()[slot];
  if (floats > b.cap) {
    // Grow geometrically; round to whole cache lines as aligned_alloc requires.
    size_t cap = std::max(floats, b.cap + b.cap / 2);
    cap = (cap + 15) / 16 * 16;
    void* p = std::aligned_alloc(64, cap * sizeof(float));
    if (p == nullptr) throw Error("qmatmul: out of memory for scratch");
    std::free(b.p);
    b.p = static_cast<float*>(p);
    b.cap = cap;
  }
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer, reading or writing past what this call asked for is an error even
  // where an earlier, larger request left room.
  ASAN_UNPOISON_MEMORY_REGION(b.p, floats * sizeof(float));
  ASAN_POISON_MEMORY_REGION(b.p + floats, (b.cap - floats) * sizeof(float));
#endif
  return b.p;
}

void FusedJob::Free::operator()(std::byte* p) const { std::free(p); }

void* FusedJob::store(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  for (;; ++block_, used_ = 0) {
    if (block_ == blocks_.size()) {
      // Blocks are kept for later jobs, so a step's jobs allocate only while they first grow.
      const size_t size = std::max<size_t>(bytes, size_t{1} << 20);
      Block b;
      b.mem.reset(static_cast<std::byte*>(std::aligned_alloc(64, size)));  // size: a multiple of 64
      if (!b.mem) throw Error("qmatmul: out of memory for a job's packed activations");
      b.size = size;
      blocks_.push_back(std::move(b));
    }
    Block& b = blocks_[block_];
    if (used_ + bytes <= b.size) {
      void* p = b.mem.get() + used_;
      used_ += bytes;
      return p;
    }
  }
}

float* FusedJob::floats(size_t n) {
  float* p = static_cast<float*>(store(n * sizeof(float)));
#if defined(__SANITIZE_ADDRESS__)
  ASAN_UNPOISON_MEMORY_REGION(p, n * sizeof(float));
#endif
  return p;
}

const float* FusedJob::packed(const PackKey& k, XStats* stats) const {
  for (const Packed& p : packed_) {
    if (p.key == k) {
      *stats = p.stats;
      return p.px;
    }
  }
  return nullptr;
}

void FusedJob::remember_packed(const PackKey& k, const float* px, const XStats& stats) { packed_.push_back({k, px, stats}); }

void FusedJob::clear() {
  parts_.clear();
  packed_.clear();
  block_ = used_ = 0;
}

void FusedJob::run() {
  if (parts_.empty()) return clear();
  first_.assign(1, 0);
  int64_t bytes = 0;
  for (const Part& p : parts_) {
    first_.push_back(first_.back() + p.units);
    bytes += p.bytes;
  }
  ThreadPool& pool = thread_pool();
  const int64_t units = first_.back();
  // About one range per kGemvChunkBytes, at least one per thread, at most one per unit.
  const int64_t most = std::min<int64_t>(units, 4096);
  const int64_t ranges = std::clamp<int64_t>(bytes / kGemvChunkBytes, std::min<int64_t>(pool.size(), most), most);
  const int cpt = static_cast<int>(cdiv_pos(ranges, pool.size()));
  pool.parallel_for(units, [&](int64_t b, int64_t e) {
    // The parts this range overlaps, each from its first unit in the range.
    size_t i = static_cast<size_t>(std::upper_bound(first_.begin(), first_.end(), b) - first_.begin()) - 1;
    for (; b < e; ++i) {
      const int64_t end = std::min(e, first_[i + 1]);
      parts_[i].run(parts_[i].ctx, b - first_[i], end - first_[i]);
      b = end;
    }
  }, cpt);
  clear();
}

namespace {

// Scalar fallback: dequant_row (the reference decoder) and a 4-way float dot per token.
void run_scalar(const QWeight& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y,
                int64_t ldy) {
  const int64_t cols = w.cols;
  thread_pool().parallel_for(r1 - r0, [&](int64_t b, int64_t e) {
    float* row = scratch(kSlotPanel, static_cast<size_t>(cols));
    for (int64_t i = b; i < e; ++i) {
      dequant_row(w, r0 + i, row);
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x + t * ldx;
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int64_t c = 0;
        for (; c + 4 <= cols; c += 4) {
          s0 += row[c] * xt[c];
          s1 += row[c + 1] * xt[c + 1];
          s2 += row[c + 2] * xt[c + 2];
          s3 += row[c + 3] * xt[c + 3];
        }
        for (; c < cols; ++c) s0 += row[c] * xt[c];
        y[t * ldy + i] = (s0 + s1) + (s2 + s3);
      }
    }
  });
}

// Default fused/GEMM crossover in T, per ISA and format (measured with qmatmul_bench's T sweep:
// the fused kernel's rate is flat from T~8 while the GEMM path keeps rising). AVX2 crosses
// earlier, except where its fused tiles hold two chains per lane in 2 x 2 tiles (session 25, Zen
// 4, two threads, 3 sweeps: FP8 fused 102-139 against GEMM 62-65 GFLOP/s at T = 12 and 105-106
// against 76-94 at T = 24; MXFP4 59-103 against 48-65 at T = 12, 58-102 against 51-70 at T = 16;
// NVFP4 46-74 against 48-53 at T = 12; BF16's GEMM ahead from T = 12: 65-67 against 71-83).
// NVFP4 up to T = 16 since session 26 (with the GEMM path's remainder tiles, 5 sweeps: fused
// 67-97 against GEMM 67-88 at T = 16, 84-97 against 105-121 at T = 24).
constexpr int fused_max_avx2(WFormat f) {
  switch (f) {
    case WFormat::FP8Block: return 24;
    case WFormat::MXFP4:
    case WFormat::NVFP4: return 16;
    default: return 8;
  }
}
// AVX-512: 24 where 512-bit FMAs issue at full width (session 2's Intel Xeon). AMD Zen 4 splits
// each 512-bit FMA over its two 256-bit pipes, so the GEMM path's broadcast microkernel gains less
// over the fused tiles and they stay ahead far longer (docs/perf.md "Session 26": "AMD EPYC"
// family 25, two threads, 3 sweeps of one 4096x7168 matrix with the GEMM path's remainder tiles,
// GFLOP/s fused / GEMM): FP8 at T = 80 161-183 / 160-179, at T = 96 144-184 / 150-186; BF16 at
// T = 80 174-188 / 182-186; MXFP4 at T = 32 135-188 / 167-170, at T = 48 154-181 / 183-185;
// NVFP4 at T = 48 161-184 / 136-182, at T = 64 162-182 / 148-191. A serving step's dense
// matmuls carry 64 prompt tokens plus the decoding streams (its routed experts ~12 tokens each).
constexpr int kDefaultFusedMaxT512 = 24;
int fused_max_zen4(WFormat f) {
  switch (f) {
    case WFormat::FP8Block:
    case WFormat::BF16: return 80;
    case WFormat::MXFP4: return 40;
    case WFormat::NVFP4: return 48;
    default: return kDefaultFusedMaxT512;  // F32 and F16: not measured
  }
}
// The CPU family of an AMD CPU (0x19: Zen 3 and 4, 0x1A: Zen 5), 0 on any other vendor.
unsigned amd_family() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__builtin_cpu_is("amd") || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
  const unsigned base = (a >> 8) & 0xF, ext = (a >> 20) & 0xFF;
  return base == 0xF ? base + ext : base;
}
// AMD family 0x19 with AVX-512 is Zen 4 (Zen 3, the same family, has no AVX-512).
bool is_zen4() { return amd_family() == 0x19; }
constexpr int kAuto = -1;
constexpr int64_t kSwapMaxRows = 24;  // F32 weights this small swap operands at large T (qmatmul)
std::atomic<int> g_override{-1};
std::atomic<int> g_fused_max{kAuto};

Isa env_isa() {
  static const Isa isa = [] {
    const char* e = std::getenv("DSV4_ISA");
    if (e == nullptr || *e == '\0') return best_isa();
    const std::string s(e);
    Isa want;
    if (s == "scalar") {
      want = Isa::Scalar;
    } else if (s == "avx2") {
      want = Isa::AVX2;
    } else if (s == "avx512") {
      want = Isa::AVX512;
    } else {
      std::fprintf(stderr, "dsv4: unknown DSV4_ISA='%s' (scalar|avx2|avx512), using %s\n", e, isa_name(best_isa()));
      return best_isa();
    }
    if (!isa_supported(want)) {
      std::fprintf(stderr, "dsv4: DSV4_ISA=%s is not supported by this CPU, using %s\n", e, isa_name(best_isa()));
      return best_isa();
    }
    return want;
  }();
  return isa;
}

}  // namespace
}  // namespace qmm

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::AVX2: return "avx2";
    case Isa::AVX512: return "avx512";
  }
  return "?";
}

// F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
static bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::AVX2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case Isa::AVX512:
      return isa_supported(Isa::AVX2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  return false;
}

Isa best_isa() {
  static const Isa best = isa_supported(Isa::AVX512) ? Isa::AVX512
                          : isa_supported(Isa::AVX2) ? Isa::AVX2
                                                     : Isa::Scalar;
  return best;
}

Isa active_isa() {
  const int o = qmm::g_override.load(std::memory_order_relaxed);
  return o >= 0 ? static_cast<Isa>(o) : qmm::env_isa();
}

void set_isa_override(Isa isa) {
  if (!isa_supported(isa)) throw Error(std::string("qmatmul: ISA ") + isa_name(isa) + " is not supported by this CPU");
  qmm::g_override.store(static_cast<int>(isa), std::memory_order_relaxed);
}

void clear_isa_override() { qmm::g_override.store(-1, std::memory_order_relaxed); }

const char* fp8_decode_name(Fp8Decode d) {
  switch (d) {
    case Fp8Decode::Auto: return "auto";
    case Fp8Decode::Bits: return "bits";
    case Fp8Decode::F16: return "f16";
  }
  return "?";
}

namespace qmm {
namespace {
std::atomic<int> g_fp8_override{-1};

Fp8Decode env_fp8_decode() {
  static const Fp8Decode d = [] {
    const char* e = std::getenv("DSV4_FP8_DECODE");
    if (e == nullptr || *e == '\0') return Fp8Decode::Auto;
    const std::string s(e);
    for (Fp8Decode v : {Fp8Decode::Auto, Fp8Decode::Bits, Fp8Decode::F16})
      if (s == fp8_decode_name(v)) return v;
    std::fprintf(stderr, "dsv4: unknown DSV4_FP8_DECODE='%s' (auto|bits|f16), using auto\n", e);
    return Fp8Decode::Auto;
  }();
  return d;
}

// E4M3 subnormal codes (exponent field 0, mantissa not 0) in a sample of the rows: 8 rows spread
// over [r0, r1), the first 512 bytes of each (~1 us; the bytes are about to be read anyway).
bool many_fp8_subnormals(const QWeight& w, int64_t r0, int64_t r1) {
  constexpr int kRows = 8;
  const int64_t len = std::min<int64_t>(w.cols, 512);
  int64_t sub = 0;
  for (int i = 0; i < kRows; ++i) {
    const uint8_t* p = w.data + (r0 + (r1 - r0) * i / kRows) * w.cols;
    for (int64_t j = 0; j < len; ++j) sub += (p[j] & 0x78) == 0 && (p[j] & 0x07) != 0;
  }
  return sub * 2048 >= kRows * len;
}
}  // namespace

bool fp8_via_f16(const QWeight& w, int64_t r0, int64_t r1) { return fp8_decode_for(w, r0, r1) == Fp8Decode::F16; }
bool zen5_shapes() {
  static const bool zen5 = amd_family() >= 0x1A;
  return zen5;
}
}  // namespace qmm

Fp8Decode active_fp8_decode() {
  const int o = qmm::g_fp8_override.load(std::memory_order_relaxed);
  return o >= 0 ? static_cast<Fp8Decode>(o) : qmm::env_fp8_decode();
}

void set_fp8_decode_override(Fp8Decode d) { qmm::g_fp8_override.store(static_cast<int>(d), std::memory_order_relaxed); }

void clear_fp8_decode_override() { qmm::g_fp8_override.store(-1, std::memory_order_relaxed); }

Fp8Decode fp8_decode_for(const QWeight& w, int64_t r0, int64_t r1) {
  const Fp8Decode d = active_fp8_decode();
  if (d != Fp8Decode::Auto) return d;
  static const bool intel = __builtin_cpu_is("intel");
  return intel && r1 > r0 && w.cols > 0 && qmm::many_fp8_subnormals(w, r0, r1) ? Fp8Decode::F16 : Fp8Decode::Bits;
}

void set_qmatmul_fused_max_tokens(int t) {
  qmm::g_fused_max.store(t < 0 ? qmm::kAuto : t, std::memory_order_relaxed);
}

namespace qmm {
namespace {
int fused_max_for(Isa isa, WFormat f) {
  const int t = g_fused_max.load(std::memory_order_relaxed);
  if (t != kAuto) return t;
  if (isa == Isa::AVX2) return fused_max_avx2(f);
  static const bool zen4 = is_zen4();
  return zen4 ? fused_max_zen4(f) : kDefaultFusedMaxT512;
}
}  // namespace
}  // namespace qmm

int qmatmul_fused_max_tokens(WFormat f) { return qmm::fused_max_for(active_isa(), f); }

void qmatmul_release_scratch() { qmm::release_scratch(); }

namespace qmm {
namespace {

// Checks a call's arguments; true when it still has work (rows, tokens and columns).
bool check_call(const QWeight& w, int64_t r0, int64_t r1, int64_t T, float* y, int64_t ldy) {
  if (w.empty()) throw Error("qmatmul: weight '" + w.name + "' has no data");
  if (r0 < 0 || r1 > w.rows || r0 > r1) {
    throw Error("qmatmul: rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ") out of range for '" +
                w.name + "' with " + std::to_string(w.rows) + " rows");
  }
  if (T < 0) throw Error("qmatmul: negative token count");
  if ((w.fmt == WFormat::MXFP4 || w.fmt == WFormat::NVFP4) && w.cols % 2 != 0) {
    throw Error("qmatmul: FP4 weight '" + w.name + "' has odd cols " + std::to_string(w.cols));
  }
  if (T == 0 || r0 == r1) return false;
  if (w.cols == 0) {  // empty sums
    for (int64_t t = 0; t < T; ++t) std::fill(y + t * ldy, y + t * ldy + (r1 - r0), 0.0f);
    return false;
  }
  return true;
}

// Whether the call is a few F32 rows against many tokens, which qmatmul runs swapped.
bool swaps(const QWeight& w, int64_t r0, int64_t r1, int64_t ldx, int64_t T, Isa isa) {
  const int64_t nr = r1 - r0;
  return w.fmt == WFormat::F32 && ldx == w.cols && nr <= kSwapMaxRows && T > nr && T > fused_max_for(isa, w.fmt);
}

void run_isa(Isa isa, const QWeight& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y,
             int64_t ldy, FusedJob* job) {
  switch (isa) {
    case Isa::AVX512: return run_avx512(w, r0, r1, x, ldx, T, y, ldy, fused_max_for(isa, w.fmt), job);
    case Isa::AVX2: return run_avx2(w, r0, r1, x, ldx, T, y, ldy, fused_max_for(isa, w.fmt), job);
    case Isa::Scalar: return run_scalar(w, r0, r1, x, ldx, T, y, ldy);
  }
}

FusedJob& thread_job() {
  thread_local FusedJob job;
  return job;
}

}  // namespace
}  // namespace qmm

void qmatmul(const QWeight& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y,
             int64_t ldy) {
  if (!qmm::check_call(w, r0, r1, T, y, ldy)) return;
  const Isa isa = active_isa();
  // A few F32 rows against many tokens (mHC's mixes: 24 x 16384 per chunk): the GEMM path would
  // pack all of x into panels for a few rows of work, and the 64-row panel of such long rows
  // spills L2. Swapped (x's rows as the F32 weight, W's rows as the tokens, the fused path) each
  // output is the same canonical dot -- F32 decodes both operands alike and fma(a, b, c) ==
  // fma(b, a, c) -- and x streams once.
  const int64_t nr = r1 - r0;
  if (qmm::swaps(w, r0, r1, ldx, T, isa)) {
    QWeight xw;
    xw.fmt = WFormat::F32;
    xw.rows = T;
    xw.cols = w.cols;
    xw.data = reinterpret_cast<const uint8_t*>(x);
    xw.name = w.name + " (activations)";
    thread_local std::vector<float> yt;
    yt.resize(static_cast<size_t>(nr * T));
    qmatmul(xw, 0, T, reinterpret_cast<const float*>(w.data) + r0 * w.cols, w.cols, nr, yt.data(), T);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < nr; ++j) y[t * ldy + j] = yt[j * T + t];
    return;
  }
  qmm::run_isa(isa, w, r0, r1, x, ldx, T, y, ldy, nullptr);
}

void qmatmul_many(const Matmul* calls, int64_t n) {
  const Isa isa = active_isa();
  qmm::FusedJob& job = qmm::thread_job();
  job.clear();  // a call that threw left it half filled
  for (int64_t i = 0; i < n; ++i) {
    const Matmul& c = calls[i];
    const int64_t r1 = c.r1 < 0 ? c.w->rows : c.r1, ldx = c.ldx < 0 ? c.w->cols : c.ldx,
                  ldy = c.ldy < 0 ? r1 - c.r0 : c.ldy;
    if (!qmm::check_call(*c.w, c.r0, r1, c.T, c.y, ldy)) continue;
    if (isa == Isa::Scalar || qmm::swaps(*c.w, c.r0, r1, ldx, c.T, isa)) {
      qmatmul(*c.w, c.r0, r1, c.x, ldx, c.T, c.y, ldy);
    } else {
      qmm::run_isa(isa, *c.w, c.r0, r1, c.x, ldx, c.T, c.y, ldy, &job);
    }
  }
  job.run();
}

}  // namespace dsv4
