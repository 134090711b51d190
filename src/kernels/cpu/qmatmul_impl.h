#pragma once
// Internals shared by the qmatmul driver (qmatmul.cpp) and its per-ISA kernels
// (qmatmul_avx2.cpp, qmatmul_avx512.cpp). Not part of the public API.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include "core/weight.h"

namespace dsv4::qmm {

// Of the packed tokens a fused tile multiplies: every nonzero x is a multiple of 2^lsb, every
// |x| is below 2^emax, every token's sum of |x| is below 2^sum_exp (1000: not finite). Decides
// whether deferred scales are exact (qmatmul_kernels.inc, deferral_exact) and whether scaling x
// is (FP8, fp8_fast_ok in qmatmul_kernels.inc).
struct XStats {
  int lsb = 1000;
  int emax = -1000;
  int sum_exp = -1000;
};

// The fused path's smallest range of work, in weight bytes: every range starts its streams cold,
// which costs small matrices more than any imbalance between threads would.
constexpr int64_t kGemvChunkBytes = int64_t{4} << 20;

// Several fused-path calls gathered into one job of the pool (qmatmul_many): each call is
// prepared (x packed, decoder and tile shape chosen) as it would be alone, then one parallel_for
// runs every call's rows, so the pool synchronises once for all of them and its threads balance
// over the whole job. Each output keeps its bits: the rows run the same tiles in the same order.
// Lives on the calling thread; its storage is kept (and reused) between jobs.
class FusedJob {
 public:
  // A prepared call: run(ctx, ua, ub) computes its units [ua, ub) (a unit is a fixed number of
  // rows); `bytes` of weights in all.
  struct Part {
    void (*run)(const void* ctx, int64_t ua, int64_t ub);
    const void* ctx;
    int64_t units;
    int64_t bytes;
  };
  // Floats (64-byte aligned) that stay in place until run() returns.
  float* floats(size_t n);
  template <class Ctx>
  void add(const Ctx& c, int64_t units, int64_t bytes) {
    static_assert(std::is_trivially_destructible_v<Ctx>);
    void* mem = store(sizeof(Ctx));
    parts_.push_back({&Ctx::run, new (mem) Ctx(c), units, bytes});
  }
  // Packed activations the job already holds for the same (x, ldx, T, decoder, cols), or null:
  // calls that share their input (an expert's w1 and w3, a layer's projections of x) share one
  // packed copy.
  struct PackKey {
    const float* x;
    int64_t ldx, T;
    const void* layout;  // the decoder type's tag
    int64_t cols;
    bool operator==(const PackKey&) const = default;
  };
  const float* packed(const PackKey& k, XStats* stats) const;
  void remember_packed(const PackKey& k, const float* px, const XStats& stats);
  // Runs every part, in ranges of about kGemvChunkBytes of weights handed out to whichever thread
  // asks (a range may span parts), and empties the job.
  void run();
  void clear();

 private:
  void* store(size_t bytes);
  struct Free {
    void operator()(std::byte* p) const;
  };
  struct Block {
    std::unique_ptr<std::byte, Free> mem;
    size_t size = 0;
  };
  std::vector<Block> blocks_;
  size_t block_ = 0, used_ = 0;
  std::vector<Part> parts_;
  std::vector<int64_t> first_;  // run(): the first unit of each part, then the total
  struct Packed {
    PackKey key;
    const float* px;
    XStats stats;
  };
  std::vector<Packed> packed_;
};

// One ISA's whole qmatmul: packs x, then splits rows over the pool. Arguments are validated.
// With a job, a call on the fused path is prepared and added to it instead (the caller runs
// the job); other calls run at once.
void run_avx2(const QWeight& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y,
              int64_t ldy, int fused_max_t, FusedJob* job);
void run_avx512(const QWeight& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T, float* y,
                int64_t ldy, int fused_max_t, FusedJob* job);

// Whether an AVX-512 qmatmul of rows [r0, r1) of FP8 weight w decodes through F16
// (fp8_decode_for in qmatmul.h).
bool fp8_via_f16(const QWeight& w, int64_t r0, int64_t r1);

// Whether the AVX-512 fused tiles take the shapes measured on AMD Zen 5 (family 0x1A and later;
// qmatmul_avx512.cpp, FusedShapes).
bool zen5_shapes();

// Per-thread, 64-byte aligned scratch that grows on demand and lives until the thread exits.
// Distinct slots may be held at once; the calling thread owns kSlotX for the packed activations
// while pool workers (and the caller, as one of them) use the others.
enum ScratchSlot { kSlotX = 0, kSlotPanel = 1, kSlotScale = 2, kSlotOut = 3, kSlotTmp = 4, kSlotXScaled = 5, kNumSlots = 6 };
float* scratch(ScratchSlot slot, size_t floats);
// Frees the calling thread's scratch.
void release_scratch();

}  // namespace dsv4::qmm
