#pragma once
// A bump allocator for the temporaries of a forward pass. Memory is taken from the system in
// blocks that are kept for the life of the thread, handed out in stack order and given back by
// Scope, so every step after the first reuses pages that are already mapped: a 512-token chunk
// allocates a few hundred MB of activations per layer, and fresh mmaps of that (page faults and
// kernel zeroing) cost ~15% of a prefill. Also the shape a GPU workspace will take (one arena,
// sized by the largest chunk, no allocation inside a step).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

namespace dsv4 {

// A view of n floats in an arena; valid until the Scope that was open when it was taken ends.
struct Floats {
  float* p = nullptr;
  int64_t n = 0;
  float* data() const { return p; }
  int64_t size() const { return n; }
  float& operator[](int64_t i) const { return p[i]; }
  float* begin() const { return p; }
  float* end() const { return p + n; }
};

class Arena {
 public:
  // Everything taken while a Scope is alive is given back when it ends. Scopes nest.
  class Scope {
   public:
    explicit Scope(Arena& a) : a_(a), block_(a.block_), used_(a.used_) {}
    ~Scope() { a_.block_ = block_, a_.used_ = used_; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Arena& a_;
    size_t block_;
    int64_t used_;
  };

  // n floats, 64-byte aligned, zero-filled unless zero is false (for buffers the caller
  // overwrites completely).
  Floats take(int64_t n, bool zero = true);
  // Bytes held from the system (for tests and diagnostics).
  int64_t reserved_bytes() const;

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  struct Block {
    std::unique_ptr<float[], Free> mem;
    int64_t cap = 0;  // floats
  };
  std::vector<Block> blocks_;
  size_t block_ = 0;  // the block allocations come from
  int64_t used_ = 0;  // floats used in it
};

// The calling thread's arena (the forward pass runs on one calling thread; pool workers only
// write into views it hands them).
Arena& thread_arena();

}  // namespace dsv4
