#include "core/arena.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace dsv4 {

namespace {
constexpr int64_t kAlignFloats = 16;               // 64 bytes
constexpr int64_t kMinBlockFloats = int64_t{4} << 20;  // 16 MiB
}  // namespace

Floats Arena::take(int64_t n, bool zero) {
  const int64_t need = std::max<int64_t>((n + kAlignFloats - 1) / kAlignFloats * kAlignFloats, kAlignFloats);
  // The current block, else the first later one with room (left unused by an earlier,
  // differently shaped step), else a new one. Blocks never move, so views stay valid.
  while (block_ < blocks_.size() && blocks_[block_].cap - used_ < need) ++block_, used_ = 0;
  if (block_ == blocks_.size()) {
    const int64_t last = blocks_.empty() ? 0 : blocks_.back().cap;
    Block b;
    b.cap = std::max({need, kMinBlockFloats, last});
    // Not initialised: pages are touched (mapped) only as they are used.
    b.mem.reset(static_cast<float*>(std::aligned_alloc(64, sizeof(float) * static_cast<size_t>(b.cap))));
    if (!b.mem) throw std::bad_alloc();
    blocks_.push_back(std::move(b));
    used_ = 0;
  }
  Floats f{blocks_[block_].mem.get() + used_, n};
  used_ += need;
  if (zero && n > 0) std::memset(f.p, 0, sizeof(float) * static_cast<size_t>(n));
  return f;
}

int64_t Arena::reserved_bytes() const {
  int64_t s = 0;
  for (const Block& b : blocks_) s += b.cap * static_cast<int64_t>(sizeof(float));
  return s;
}

Arena& thread_arena() {
  thread_local Arena a;
  return a;
}

}  // namespace dsv4
