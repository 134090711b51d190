#pragma once
// How a multi-process run splits the model (docs/parallel.md). Pure arithmetic, shared by the
// loader, the forward and `dsv4 inspect --parallel`.
#include <cstdint>

namespace dsv4 {

// Expert parallelism: rank r holds the routed experts [first(r), first(r + 1)), contiguous
// and balanced to within one expert for any world size (it need not divide the count), so
// every rank's outputs are one contiguous block of the step's expert-ordered rows.
struct ExpertSplit {
  int rank = 0, world = 1;
  int64_t experts = 0;
  int64_t first(int r) const { return experts * r / world; }
  int64_t begin() const { return first(rank); }
  int64_t end() const { return first(rank + 1); }
  bool owns(int64_t e) const { return e >= begin() && e < end(); }
  bool active() const { return world > 1; }
};

// What this rank of a parallel run holds: EP, its experts; TP, its attention output groups
// (and their heads) and its vocabulary rows of the head. Each split is contiguous and balanced:
// rank r holds [part(n, r), part(n, r + 1)) of n things.
struct Share {
  int rank = 0, world = 1;
  bool ep = false, tp = false;
  int64_t part(int64_t n, int r) const { return n * r / world; }
  bool active() const { return world > 1 && (ep || tp); }
};

}  // namespace dsv4
