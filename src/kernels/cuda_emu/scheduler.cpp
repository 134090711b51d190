// dsv4 CUDA emulator: kernel launches. Every CUDA thread of a block is a fiber (own stack, a
// hand-written x86-64 context switch); fibers run in thread order until they wait at a
// __syncthreads or a warp collective, and the last one to arrive releases the group.
//
// Run queue: the threads that can run, in order (reverse order with DSV4_EMU_REVERSE=1). A
// waiting or exiting fiber switches straight to the next fiber in the queue; only when the queue
// is empty does control return to the host (scheduler) context: either every thread has exited,
// or the block is stuck (a barrier or collective that part of its group never reaches), which
// fails the launch with a description of who waits where. A warp released from a collective
// goes to the front of the queue: its lanes run on while their stacks are in cache.
//
// Barrier rules (what a GPU does for code that follows the CUDA programming guide):
// - __syncthreads releases when every thread of the block that has not exited is waiting, all
//   at the same __syncthreads (same source line); threads that exit early do not block it.
// - A warp collective (shuffle, vote, __syncwarp) releases when every lane of its mask is there,
//   all with the same operation and mask; then the values are exchanged at once. Warps wait
//   independently: their collectives may sit in loops with per-warp trip counts.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda_emu/internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define DSV4_EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#else
#define DSV4_EMU_ASAN 0
#endif

#if !defined(__x86_64__)
#error "the dsv4 CUDA emulator's context switch is written for x86-64"
#endif

// ================================================================ context switch (x86-64 SysV)
//
// dsv4_emu_ctx_switch(&from_sp, to_sp): pushes the callee-saved registers (rbp, rbx, r12-r15)
// and the floating-point control state (MXCSR, x87 control word: rounding modes and exception
// masks are callee-saved by the ABI), stores the stack pointer in *from_sp, loads to_sp and pops
// the same frame from there. The control state is loaded only when it differs from the running
// one: ldmxcsr / fldcw were most of a switch's time, and kernels almost never change it. MXCSR's
// six exception flags (bits 0-5) are left out of that comparison: any inexact operation sets one,
// so a fiber that has computed and one that has not yet differ there, and the ABI does not
// preserve the flags across calls anyway.
// Everything else is caller-saved, so the compiler has spilled it.
// A new fiber's stack holds such a frame whose return address is dsv4_emu_fiber_start, which
// calls dsv4_emu_fiber_main with a 16-byte-aligned stack (rbp = 0 ends frame-pointer walks).
extern "C" void dsv4_emu_ctx_switch(void** from_sp, void* to_sp);
extern "C" [[noreturn]] void dsv4_emu_fiber_main();
extern "C" void dsv4_emu_fiber_start();

asm(R"(
  .text
  .globl dsv4_emu_ctx_switch
  .type dsv4_emu_ctx_switch, @function
  .p2align 4
dsv4_emu_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movl (%rsp), %eax
  movzwl 4(%rsp), %ecx
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  movl (%rsp), %edx
  xorl %eax, %edx
  testl $-64, %edx
  jz 1f
  ldmxcsr (%rsp)
1:
  cmpw 4(%rsp), %cx
  je 2f
  fldcw 4(%rsp)
2:
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size dsv4_emu_ctx_switch, .-dsv4_emu_ctx_switch

  .globl dsv4_emu_fiber_start
  .type dsv4_emu_fiber_start, @function
  .p2align 4
dsv4_emu_fiber_start:
  .cfi_startproc
  .cfi_undefined rip
  xorl %ebp, %ebp
  call dsv4_emu_fiber_main@PLT
  ud2
  .cfi_endproc
  .size dsv4_emu_fiber_start, .-dsv4_emu_fiber_start
)");

namespace dsv4::emu {

uint3 g_thread_idx{0, 0, 0}, g_block_idx{0, 0, 0};
dim3 g_block_dim, g_grid_dim;
void* g_dynamic_smem = nullptr;

namespace {

enum class State : uint8_t { Ready, Running, AtBarrier, AtWarp, Exited };

// One CUDA thread (or, for g_host, the launching host thread).
struct Fiber {
  void* sp = nullptr;  // saved stack pointer while switched out
  uint3 tid{0, 0, 0};
  int warp = 0, lane = 0;
  State state = State::Ready;
  // Where it waits (its part of a warp collective is in its Warp).
  const char* file = nullptr;
  int line = 0;
  // The stack (not used for g_host), and AddressSanitizer's per-fiber fake stack.
  char* stack_lo = nullptr;
  size_t stack_size = 0;
  void* asan_fake = nullptr;
};

// A lane's part of a warp collective. Kept together per warp (not in each Fiber): completing a
// collective reads all 32 lanes' operands, which then share a few cache lines.
struct LaneOperand {
  uint64_t value = 0, result = 0;
  int arg = 0, width = 32;
};

struct Warp {
  unsigned lanes = 0;    // lanes that exist (the last warp of a block may be partial)
  unsigned arrived = 0;  // lanes waiting at the current collective
  unsigned mask = 0;
  Collective op = Collective::SyncWarp;
  ButterflyRounds rounds = nullptr;  // Collective::Butterfly's
  LaneOperand lane[32];
};

struct Block {
  std::vector<Fiber> threads;
  std::vector<Warp> warps;
  std::vector<int> queue;  // ring buffer of runnable thread indices
  size_t head = 0, count = 0;
  int n = 0, live = 0, at_barrier = 0;
  const char* bar_file = nullptr;
  int bar_line = 0;
  bool failed = false;
  std::string failure;
  void (*run)(const void*) = nullptr;
  const void* call = nullptr;
};

Fiber g_host;
Fiber* g_cur = &g_host;
Fiber* g_prev = nullptr;  // who switched to the running fiber (ASan learns the host stack from it)
Block g_blk;
bool g_reverse = [] {
  const char* e = std::getenv("DSV4_EMU_REVERSE");
  return e && *e && std::strcmp(e, "0") != 0;
}();
uint64_t g_fpu_frame = 0;  // MXCSR | x87 control word << 32, copied into every new fiber

struct Stack {
  char* lo;
  size_t size;
};
std::vector<Stack> g_stacks;  // one per thread index, reused by every block and launch

size_t stack_bytes() {
  static const size_t bytes = [] {
    size_t kb = DSV4_EMU_ASAN ? 256 : 64;
    if (const char* e = std::getenv("DSV4_EMU_STACK_KB")) kb = std::strtoull(e, nullptr, 10);
    if (kb < 16) kb = 16;
    return kb * 1024;
  }();
  return bytes;
}

// Stacks for n threads: mmap'd lazily (pages are touched only as deep as a kernel goes), with a
// PROT_NONE guard page below each, so an overflow faults instead of corrupting a neighbour.
void ensure_stacks(size_t n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)), size = stack_bytes();
  while (g_stacks.size() < n) {
    void* m = mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "cuda-emu: cannot map fiber stacks\n");
      std::abort();
    }
    mprotect(m, page, PROT_NONE);
    g_stacks.push_back({static_cast<char*>(m) + page, size});
  }
}

// ---------------------------------------------------------------- run queue

// head < size and count <= size, so one conditional subtraction wraps an index (a division per
// push and pop was a tenth of the emulator's time: every warp collective pushes 32 lanes).
void push(int i) {
  Block& b = g_blk;
  size_t k = b.head + b.count++;
  if (k >= b.queue.size()) k -= b.queue.size();
  b.queue[k] = i;
}

// ids[0, n) run next, in that order, before the rest of the queue.
void push_front(const int* ids, int n) {
  Block& b = g_blk;
  const size_t size = b.queue.size();
  size_t k = b.head >= static_cast<size_t>(n) ? b.head - n : b.head + size - n;
  b.head = k;
  b.count += n;
  for (int j = 0; j < n; ++j) {
    b.queue[k] = ids[j];
    if (++k == size) k = 0;
  }
}

int pop() {
  Block& b = g_blk;
  if (b.count == 0) return -1;
  const int i = b.queue[b.head];
  if (++b.head == b.queue.size()) b.head = 0;
  --b.count;
  return i;
}

// ---------------------------------------------------------------- switching

// The second half of an ASan fiber switch, on the stack switched to. The host thread's stack
// bounds (needed to switch back to it) are learnt from the first switch away from it.
inline void asan_switched_in(void* fake_stack) {
#if DSV4_EMU_ASAN
  const void* old_lo = nullptr;
  size_t old_size = 0;
  __sanitizer_finish_switch_fiber(fake_stack, &old_lo, &old_size);
  if (g_prev == &g_host && old_lo) {
    g_host.stack_lo = static_cast<char*>(const_cast<void*>(old_lo));
    g_host.stack_size = old_size;
  }
#else
  (void)fake_stack;
#endif
}

// The counters, reached without a call per switch.
Stats* const g_stats_ptr = &mutable_stats();

void switch_to(Fiber* from, Fiber* to, bool from_is_done) {
  ++g_stats_ptr->switches;
  g_cur = to;
  if (to != &g_host) {
    to->state = State::Running;
    g_thread_idx = to->tid;
  }
  g_prev = from;
#if DSV4_EMU_ASAN
  if (from_is_done && from != &g_host) {
    // A finished fiber never returns from this frame or its callers' (fiber_main, yield), so
    // their redzones would stay poisoned; the next fiber on this stack puts its kernel's locals
    // there (ASan then reported sincos writing into its own locals). Everything below this frame
    // has returned, so only the top of the stack needs clearing.
    char* const top = from->stack_lo + from->stack_size;
    char* lo = static_cast<char*>(__builtin_frame_address(0)) - 1024;
    if (lo < from->stack_lo) lo = from->stack_lo;
    ASAN_UNPOISON_MEMORY_REGION(lo, static_cast<size_t>(top - lo));
  }
  // Tell ASan which stack we move to; a finished fiber's fake stack can be dropped.
  __sanitizer_start_switch_fiber(from_is_done ? nullptr : &from->asan_fake, to->stack_lo, to->stack_size);
#endif
  dsv4_emu_ctx_switch(&from->sp, to->sp);
  asan_switched_in(from->asan_fake);
}

// The current fiber stops running (it waits, or it has exited): on to the next runnable thread,
// or back to the host when there is none.
void yield(Fiber* me, bool done) {
  const int next = pop();
  switch_to(me, next >= 0 ? &g_blk.threads[next] : &g_host, done);
}

std::string where(const Fiber& f) { return std::string(short_path(f.file)) + ":" + std::to_string(f.line); }

const char* op_name(Collective op) {
  switch (op) {
    case Collective::SyncWarp: return "__syncwarp";
    case Collective::ShflIdx: return "__shfl_sync";
    case Collective::ShflUp: return "__shfl_up_sync";
    case Collective::ShflDown: return "__shfl_down_sync";
    case Collective::ShflXor: return "__shfl_xor_sync";
    case Collective::Ballot: return "__ballot_sync";
    case Collective::Any: return "__any_sync";
    case Collective::All: return "__all_sync";
    case Collective::Butterfly: return "gpu::warp_butterfly";
  }
  return "?";
}

std::string thread_name(const Fiber& f) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "thread (%u,%u,%u) [warp %d lane %d]", f.tid.x, f.tid.y, f.tid.z, f.warp, f.lane);
  return buf;
}

// The launch cannot go on: return to the host for good (g_blk.failure says why).
[[noreturn]] void fail() {
  g_blk.failed = true;
  switch_to(g_cur, &g_host, true);
  __builtin_unreachable();
}

// The message is built and stored in a statement of its own, so its temporaries are destroyed
// before the fiber is abandoned mid-stack (they would leak: LeakSanitizer in the emu-asan tier).
#define DSV4_EMU_FAIL(message) \
  do {                         \
    g_blk.failure = (message); \
    fail();                    \
  } while (0)

Fiber* current_thread(const char* what) {
  if (g_cur == &g_host) {
    std::fprintf(stderr, "cuda-emu: %s called outside a kernel\n", what);
    std::abort();
  }
  return g_cur;
}

// Every thread waiting at the block barrier becomes runnable (in thread order).
void release_barrier() {
  Block& b = g_blk;
  for (int k = 0; k < b.n; ++k) {
    const int i = g_reverse ? b.n - 1 - k : k;
    Fiber& f = b.threads[i];
    if (f.state != State::AtBarrier) continue;
    f.state = State::Ready;
    if (&f != g_cur) push(i);
  }
  b.at_barrier = 0;
  ++g_stats_ptr->syncthreads;
}

// Whole description of a stuck block: who waits where, who has exited.
std::string describe_deadlock() {
  const Block& b = g_blk;
  std::string s = "deadlock: " + std::to_string(b.live) + " of " + std::to_string(b.n) + " threads have not exited";
  if (b.at_barrier > 0) {
    s += "; " + std::to_string(b.at_barrier) + " wait at __syncthreads (" + short_path(b.bar_file) + ":" +
         std::to_string(b.bar_line) + ")";
  }
  int shown = 0;
  for (size_t w = 0; w < b.warps.size(); ++w) {
    const Warp& wp = b.warps[w];
    if (!wp.arrived) continue;
    unsigned exited = 0, elsewhere = 0;
    const Fiber* any = nullptr;
    for (int l = 0; l < 32; ++l) {
      if (!(wp.lanes >> l & 1u)) continue;
      const Fiber& f = b.threads[w * 32 + l];
      if (wp.arrived >> l & 1u) any = &f;
      else if (f.state == State::Exited) exited |= 1u << l;
      else elsewhere |= 1u << l;
    }
    if (shown++ < 4) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "; warp %zu: lanes 0x%08x wait at %s (%s, mask 0x%08x), lanes 0x%08x have exited, lanes 0x%08x "
                    "wait elsewhere",
                    w, wp.arrived, op_name(wp.op), any ? where(*any).c_str() : "?", wp.mask, exited, elsewhere);
      s += buf;
    }
  }
  if (shown > 4) s += "; (" + std::to_string(shown - 4) + " more warps)";
  return s;
}

// The results of a shuffle, vote or __syncwarp whose mask has fully arrived.
void exchange(const Block& b, int w, Warp& wp) {
  LaneOperand* op = wp.lane;
  const unsigned mask = wp.mask;
  unsigned ballot = 0;
  for (int l = 0; l < 32; ++l)
    if ((mask >> l & 1u) && op[l].value != 0) ballot |= 1u << l;
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    LaneOperand& o = op[l];
    const int width = o.width, seg = l & ~(width - 1), arg = o.arg;
    int src = l;
    switch (wp.op) {
      case Collective::SyncWarp: break;
      case Collective::ShflIdx: src = seg + (((arg % width) + width) % width); break;
      case Collective::ShflUp: src = (l - seg) >= arg ? l - arg : l; break;
      case Collective::ShflDown: src = (l - seg) + arg < width ? l + arg : l; break;
      case Collective::ShflXor: src = l ^ arg; if (src >= seg + width || src > 31) src = l; break;
      case Collective::Ballot: o.result = ballot; continue;
      case Collective::Any: o.result = ballot != 0; continue;
      case Collective::All: o.result = ballot == mask; continue;
      case Collective::Butterfly: continue;  // (complete_warp's)
    }
    if (src < 0 || src > 31 || !(mask >> src & 1u)) {
      const Fiber& f = b.threads[static_cast<size_t>(w) * 32 + l];
      DSV4_EMU_FAIL(thread_name(f) + " at " + where(f) + ": " + op_name(wp.op) + " reads lane " + std::to_string(src) +
           ", which is not in the mask");
    }
    o.result = op[src].value;
  }
}

// A warp whose mask has fully arrived: every lane's result at once, then the lanes run again,
// ahead of the other warps (their stacks are still in cache; a GPU's warps progress
// independently too).
void complete_warp(int w) {
  Block& b = g_blk;
  Warp& wp = b.warps[w];
  const unsigned mask = wp.mask;
  if (wp.op == Collective::Butterfly) {  // full mask; the rounds in the shuffles' order
    uint64_t v[32];
    for (int l = 0; l < 32; ++l) v[l] = wp.lane[l].value;
    wp.rounds(v);
    for (int l = 0; l < 32; ++l) wp.lane[l].result = v[l];
  } else {
    exchange(b, w, wp);
  }
  // In thread order (reverse order when asked); the running lane just goes on.
  Fiber* lanes = &b.threads[static_cast<size_t>(w) * 32];
  int ids[32], n = 0;
  for (int k = 0; k < 32; ++k) {
    const int l = g_reverse ? 31 - k : k;
    if (!(mask >> l & 1u)) continue;
    lanes[l].state = State::Ready;
    if (&lanes[l] != g_cur) ids[n++] = w * 32 + l;
  }
  push_front(ids, n);
  wp.arrived = 0;
  ++g_stats_ptr->warp_collectives;
}

// Runs one block to completion (or failure).
void run_block() {
  Block& b = g_blk;
  b.head = b.count = 0;
  b.live = b.n;
  b.at_barrier = 0;
  const unsigned bx = g_block_dim.x, by = g_block_dim.y;
  for (int k = 0; k < b.n; ++k) {
    const int i = g_reverse ? b.n - 1 - k : k;
    Fiber& f = b.threads[i];
    f.tid = uint3{i % bx, (i / bx) % by, i / (bx * by)};
    f.warp = i / 32;
    f.lane = i % 32;
    f.state = State::Ready;
    f.asan_fake = nullptr;
    f.stack_lo = g_stacks[i].lo;
    f.stack_size = g_stacks[i].size;
    // The initial frame popped by dsv4_emu_ctx_switch: FPU state, r15..r12, rbx, rbp = 0, then
    // the return address. The 16-byte-aligned top makes the stack aligned at the `call`. Each
    // thread's top is moved down by a different number of cache lines: the stacks are a whole
    // number of pages apart, so unmoved their tops (where every switch reads and writes) all fell
    // in the same L1 set, and twelve ways held twelve of a block's 128-256 tops.
    const size_t color = static_cast<size_t>(i % 64) * 64;
    uint64_t* sp = reinterpret_cast<uint64_t*>(f.stack_lo + f.stack_size - 64 - color);
    sp[0] = g_fpu_frame;
    for (int r = 1; r <= 6; ++r) sp[r] = 0;
    sp[7] = reinterpret_cast<uint64_t>(&dsv4_emu_fiber_start);
    f.sp = sp;
    push(i);
  }
  for (Warp& w : b.warps) w.lanes = w.arrived = 0;  // the lane operands are written before they are read
  for (int i = 0; i < b.n; ++i) b.warps[i / 32].lanes |= 1u << (i % 32);

  switch_to(&g_host, &b.threads[pop()], false);
  // Back on the host: the run queue is empty.
  if (!b.failed && b.live > 0) {
    b.failed = true;
    b.failure = describe_deadlock();
  }
#if DSV4_EMU_ASAN
  // Fibers abandoned mid-stack leave ASan's stack redzones behind; the next block reuses the stacks.
  if (b.failed)
    for (int i = 0; i < b.n; ++i) ASAN_UNPOISON_MEMORY_REGION(g_stacks[i].lo, g_stacks[i].size);
#endif
}

}  // namespace

}  // namespace dsv4::emu

// A new fiber starts here (on its own stack) and never returns: after the kernel body it hands
// over to the next runnable thread, or to the host.
extern "C" void dsv4_emu_fiber_main() {
  using namespace dsv4::emu;
  asan_switched_in(nullptr);
  Fiber* me = g_cur;
  ++g_stats_ptr->threads;
  g_blk.run(g_blk.call);
  me->state = State::Exited;
  --g_blk.live;
  if (g_blk.at_barrier > 0 && g_blk.at_barrier == g_blk.live) release_barrier();
  yield(me, true);
  __builtin_unreachable();
}

namespace dsv4::emu {

void syncthreads(const char* file, int line) {
  Fiber* me = current_thread("__syncthreads");
  Block& b = g_blk;
  me->file = file;
  me->line = line;
  if (b.at_barrier == 0) {
    b.bar_file = file;
    b.bar_line = line;
  } else if (line != b.bar_line || (file != b.bar_file && std::strcmp(file, b.bar_file) != 0)) {
    DSV4_EMU_FAIL("divergent __syncthreads: " + thread_name(*me) + " waits at " + where(*me) + " while " +
         std::to_string(b.at_barrier) + " threads wait at " + short_path(b.bar_file) + ":" + std::to_string(b.bar_line));
  }
  me->state = State::AtBarrier;
  if (++b.at_barrier == b.live) {
    release_barrier();
    me->state = State::Running;
    return;
  }
  yield(me, false);
}

namespace {
// Why a warp collective cannot go on (kept out of warp_collective: its hot path stays small).
[[gnu::noinline, gnu::cold, noreturn]] void fail_collective(Fiber* me, const Warp& w, Collective op, unsigned mask, int width,
                                                             ButterflyRounds rounds) {
  const unsigned bit = 1u << me->lane;
  if (!(mask & bit))
    DSV4_EMU_FAIL(thread_name(*me) + " at " + where(*me) + ": " + op_name(op) + " with a mask that does not include the lane");
  if (mask & ~w.lanes)
    DSV4_EMU_FAIL(thread_name(*me) + " at " + where(*me) + ": " + op_name(op) + " mask names lanes past the end of the block");
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0)
    DSV4_EMU_FAIL(thread_name(*me) + " at " + where(*me) + ": shuffle width " + std::to_string(width) + " is not a power of two <= 32");
  if (w.op == op && w.mask == mask && w.rounds != rounds)
    DSV4_EMU_FAIL("divergent warp collective: " + thread_name(*me) + " at " + where(*me) + ": " + op_name(op) +
                  " with another value type or combine than the lanes waiting there");
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s (mask 0x%08x) while lanes 0x%08x wait at %s (mask 0x%08x)", op_name(op), mask,
                w.arrived, op_name(w.op), w.mask);
  DSV4_EMU_FAIL("divergent warp collective: " + thread_name(*me) + " at " + where(*me) + ": " + buf);
}

// The calling lane's arrival at a collective; returns its result once the warp completes it.
uint64_t arrive(Collective op, unsigned mask, uint64_t value, int arg, int width, ButterflyRounds rounds, const char* file,
                int line) {
  Fiber* me = current_thread(op_name(op));
  Warp& w = g_blk.warps[me->warp];
  me->file = file;
  me->line = line;
  const unsigned bit = 1u << me->lane;
  const bool bad_args = !(mask & bit) || (mask & ~w.lanes) || width <= 0 || width > 32 || (width & (width - 1)) != 0;
  if (w.arrived == 0 && !bad_args) {
    w.mask = mask;
    w.op = op;
    w.rounds = rounds;
  } else if (bad_args || w.mask != mask || w.op != op || w.rounds != rounds) [[unlikely]] {
    fail_collective(me, w, op, mask, width, rounds);
  }
  LaneOperand& o = w.lane[me->lane];
  o.arg = arg;
  o.width = width;
  o.value = value;
  me->state = State::AtWarp;
  w.arrived |= bit;
  if (w.arrived == w.mask) {
    complete_warp(me->warp);
    me->state = State::Running;
    return o.result;
  }
  yield(me, false);
  return o.result;
}
}  // namespace

uint64_t warp_collective(Collective op, unsigned mask, uint64_t value, int arg, int width, const char* file, int line) {
  return arrive(op, mask, value, arg, width, nullptr, file, line);
}

uint64_t warp_butterfly(ButterflyRounds rounds, uint64_t value, const char* file, int line) {
  return arrive(Collective::Butterfly, 0xFFFFFFFFu, value, 0, 32, rounds, file, line);
}

void set_reverse(bool on) {
  std::lock_guard<std::mutex> lock(device_mutex());
  g_reverse = on;
}

bool reverse() {
  std::lock_guard<std::mutex> lock(device_mutex());
  return g_reverse;
}

bool check_pointers(const LaunchConfig& cfg, const void* const* pointers, int n_pointers) {
  // Pointer arguments must be device pointers: a host pointer would fault on the GPU.
  for (int i = 0; i < n_pointers; ++i) {
    if (pointers[i] && !points_into_device_memory(pointers[i])) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%p", pointers[i]);
      fail_sticky(cudaErrorIllegalAddress, std::string("launch of ") + cfg.name + ": pointer argument " +
                                               std::to_string(i) + " (" + buf + ") is not in device memory");
      return false;
    }
  }
  return true;
}

void launch(const LaunchConfig& cfg, void (*run)(const void*), std::shared_ptr<const void> call,
            const void* const* pointers, int n_pointers) {
  std::lock_guard<std::mutex> lock(device_mutex());
  if (const cudaError_t e = sticky_error()) {  // a failed kernel poisons every later call
    record(e);
    return;
  }
  // Configuration, checked as the CUDA runtime does (not sticky: cudaGetLastError clears it).
  const dim3 g = cfg.grid, bk = cfg.block;
  const uint64_t threads = static_cast<uint64_t>(bk.x) * bk.y * bk.z;
  if (bk.x == 0 || bk.y == 0 || bk.z == 0 || bk.x > kMaxBlockX || bk.y > kMaxBlockY || bk.z > kMaxBlockZ ||
      threads > kMaxThreads || g.x == 0 || g.y == 0 || g.z == 0 || g.x > kMaxGridX || g.y > kMaxGridYZ ||
      g.z > kMaxGridYZ) {
    record(cudaErrorInvalidConfiguration);
    return;
  }
  if (cfg.smem > kSharedOptin ||
      (cfg.smem > kSharedDefault && cfg.smem > static_cast<size_t>(max_dynamic_smem(cfg.kernel)))) {
    record(cudaErrorInvalidValue);
    return;
  }
  if (!valid_stream(cfg.stream)) {
    record(cudaErrorInvalidResourceHandle);
    return;
  }
  if (!check_pointers(cfg, pointers, n_pointers)) return;
  if (capturing(cfg.stream)) {  // recorded with its arguments; graph.cpp replays it
    capture_node(cfg.stream, KernelNode{cfg, run, std::move(call), std::vector<const void*>(pointers, pointers + n_pointers)});
    return;
  }
  if (legacy_stream_work(cfg.stream)) return;
  execute(cfg, run, call.get());
}

void execute(const LaunchConfig& cfg, void (*run)(const void*), const void* call) {
  const dim3 g = cfg.grid, bk = cfg.block;
  const uint64_t threads = static_cast<uint64_t>(bk.x) * bk.y * bk.z;
  Stats& st = mutable_stats();
  ++st.launches;

  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  g_fpu_frame = mxcsr | (static_cast<uint64_t>(fpucw) << 32);

  Block& b = g_blk;
  b.n = static_cast<int>(threads);
  if (b.threads.size() < threads) b.threads.resize(threads);
  b.warps.resize((threads + 31) / 32);
  b.queue.assign(threads, 0);
  b.failed = false;
  b.failure.clear();
  b.run = run;
  b.call = call;
  ensure_stacks(threads);

  // Dynamic shared memory: exactly the launch's bytes (ASan sees overruns), filled with 0xFF
  // (NaN as floats) at each block's start, so reads of never-written slots stand out.
  void* smem = cfg.smem ? std::malloc(cfg.smem) : nullptr;
  g_dynamic_smem = smem;
  g_grid_dim = g;
  g_block_dim = bk;
  const uint64_t nblocks = static_cast<uint64_t>(g.x) * g.y * g.z;
  for (uint64_t k = 0; k < nblocks && !b.failed; ++k) {
    const uint64_t i = g_reverse ? nblocks - 1 - k : k;
    g_block_idx = uint3{static_cast<unsigned>(i % g.x), static_cast<unsigned>((i / g.x) % g.y),
                        static_cast<unsigned>(i / (static_cast<uint64_t>(g.x) * g.y))};
    if (smem) std::memset(smem, 0xFF, cfg.smem);
    ++st.blocks;
    run_block();
  }
  std::free(smem);
  g_dynamic_smem = nullptr;
  if (b.failed) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "block (%u,%u,%u) of grid (%u,%u,%u), block size (%u,%u,%u)", g_block_idx.x,
                  g_block_idx.y, g_block_idx.z, g.x, g.y, g.z, bk.x, bk.y, bk.z);
    fail_sticky(cudaErrorLaunchFailure, std::string("kernel ") + cfg.name + ", " + buf + ": " + b.failure);
  }
}

}  // namespace dsv4::emu
