// The CUDA backend's decode steps as CUDA graphs (backends/cuda/step_graphs.h): replayed steps
// give the logits of eager steps bit for bit, and the CPU backend's within the golden bound, over
// 100 decode steps that cross the window's wrap-around (window 16) and many ratio-4 / ratio-16
// block boundaries, at batch 1 and 4; and a step that does what capture forbids (a
// cudaMalloc inside it) fails without changing the sequence. Skipped without a CUDA device
// (label gpu); on the emulator (gpu-emu) it also checks that graphs were launched.
#include <algorithm>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "core/error.h"
#include "model/forward.h"
#include "forwarding_backend.h"
#include "test_cuda_model.h"
#include "test_cuda_util.h"
#include "test_util.h"
#include "tools/logits.h"
#if defined(DSV4_CUDA_EMU)
#include "kernels/cuda_emu/control.h"
#endif

using namespace dsv4;
using namespace dsv4::testing;

namespace {

class CudaGraph : public GpuTest {};

// Decode steps: 6 window wraps, 25 ratio-4 and 6 ratio-16 blocks. (200 ran twice as long on the
// emulator, ~170 CPU-s, and crossed the same boundaries only more often.)
constexpr int64_t kDecode = 100;

// Sequence i's tokens: a prompt of 5 + i tokens, then kDecode more (seeded random ids).
std::vector<int32_t> tokens_of(int i, int64_t vocab) {
  std::mt19937 g(1234 + i);
  std::uniform_int_distribution<int32_t> d(2, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(5 + i + kDecode));
  for (int32_t& v : t) v = d(g);
  return t;
}

// Prefills each sequence alone (one step each), then decodes all of them together, one token per
// sequence per step. Returns each sequence's decode logits [kDecode, vocab].
std::vector<std::vector<float>> run(const Model& m, const std::vector<std::vector<int32_t>>& toks) {
  const int64_t V = m.config().vocab, B = static_cast<int64_t>(toks.size());
  std::vector<SequenceState> st;
  for (int64_t b = 0; b < B; ++b) st.push_back(m.new_sequence());
  std::vector<std::vector<float>> out(static_cast<size_t>(B), std::vector<float>(static_cast<size_t>(kDecode * V)));
  std::vector<float> scratch(static_cast<size_t>(V));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t prompt = static_cast<int64_t>(toks[b].size()) - kDecode;
    m.step(Stack::Main, {{&st[b], toks[b].data(), prompt, Rows::Last, scratch.data(), nullptr, nullptr}});
  }
  for (int64_t i = 0; i < kDecode; ++i) {
    std::vector<SeqInput> in;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t prompt = static_cast<int64_t>(toks[b].size()) - kDecode;
      in.push_back({&st[b], toks[b].data() + prompt + i, 1, Rows::Last, out[b].data() + i * V, nullptr, nullptr});
    }
    m.step(Stack::Main, in);
  }
  return out;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b, int64_t V) {
  const int64_t T = static_cast<int64_t>(a.size()) / V;
  std::vector<double> e = rel_l2_rows(a.data(), b.data(), T, V);
  return *std::max_element(e.begin(), e.end());
}

uint64_t graph_launches() {
#if defined(DSV4_CUDA_EMU)
  return emu::stats().graph_launches;
#else
  return 0;
#endif
}

// The CPU backend's logits for each sequence alone, and the golden case's bound: the two backends
// are each within the case's max of a float64 reference, so within twice that of each other.
void expect_near_cpu(const std::vector<std::vector<int32_t>>& toks, const std::vector<std::vector<float>>& got) {
  const Model cpu = cpu_model();
  const double bound = 2 * read_json(golden_dir("tiny-native") + "/case.json")["pass"]["max_rel_l2"].get<double>();
  for (size_t b = 0; b < toks.size(); ++b) {
    const std::vector<float> want = run(cpu, {toks[b]})[0];
    const double e = max_rel(got[b], want, cpu.config().vocab);
    std::printf("[cuda graph] sequence %zu: max rel L2 vs CPU %.3g over %lld decode steps\n", b, e,
                static_cast<long long>(kDecode));
    EXPECT_LE(e, bound) << "sequence " << b;
  }
}

}  // namespace

// One test, so the emulator runs the 100-step decode only three times (two at batch 1, one at
// batch 4). Batch 1: graph replay == eager, bit for bit. Batch 4 (sequences at different
// positions): each sequence's rows equal its batch-1 run bit for bit (sequence 0), and every
// sequence is near the CPU.
TEST_F(CudaGraph, ReplayEqualsEagerAndCpuAtBatch1And4) {
  const Model graphs = cuda_model({.context = 256, .graphs = true}), eager = cuda_model({.context = 256, .graphs = false});
  const int64_t V = graphs.config().vocab;
  std::vector<std::vector<int32_t>> toks;
  for (int i = 0; i < 4; ++i) toks.push_back(tokens_of(i, V));

  [[maybe_unused]] const uint64_t g0 = graph_launches();  // read only by the emulator's check
  const std::vector<float> replayed = run(graphs, {toks[0]})[0];
#if defined(DSV4_CUDA_EMU)
  EXPECT_EQ(graph_launches() - g0, static_cast<uint64_t>(kDecode)) << "every decode step is one graph launch";
#endif
  const uint64_t g1 = graph_launches();
  const std::vector<float> plain = run(eager, {toks[0]})[0];
  EXPECT_EQ(graph_launches(), g1) << "graphs off: no graph launched";
  EXPECT_TRUE(replayed == plain) << "graph replay differs from eager steps (max rel " << max_rel(replayed, plain, V) << ")";

  const std::vector<std::vector<float>> batched = run(graphs, toks);
#if defined(DSV4_CUDA_EMU)
  EXPECT_EQ(graph_launches() - g1, static_cast<uint64_t>(kDecode));
#endif
  EXPECT_TRUE(batched[0] == replayed) << "batch 4 differs from batch 1 (max rel " << max_rel(batched[0], replayed, V) << ")";
  expect_near_cpu(toks, batched);
}

namespace {

// The CUDA backend with one planted fault: while `plant` is set, the first matmul of a step
// allocates device memory (what a graph capture forbids).
class PlantingBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  bool plant = false;

  Step begin(const StepPlan& plan) override {
    planted_ = false;
    return ForwardingBackend::begin(plan);
  }
  void matmul(Step& s, const Matmul& m) override {
    if (plant && !planted_) {
      planted_ = true;
      gpu::DeviceBuffer scratch(256);  // the planted allocation
    }
    ForwardingBackend::matmul(s, m);
  }

 private:
  bool planted_ = false;
};

}  // namespace

// A cudaMalloc inside the captured decode step fails the step (CUDA refuses it during capture);
// the failed capture ran nothing, so the same step then succeeds and matches an eager run.
TEST_F(CudaGraph, AllocationInsideCapturedStepFails) {
  CudaOptions o;
  o.context = 64;
  PlantingBackend* planting = nullptr;
  const Model m(load_model(tiny_model_dir()), [&](const ModelWeights& w) {
    auto b = std::make_unique<PlantingBackend>(make_cuda_backend(w, o));
    planting = b.get();
    return b;
  });
  const Model eager = cuda_model({.context = 64, .graphs = false});
  const int64_t V = m.config().vocab;
  const std::vector<int32_t> toks = tokens_of(0, V);
  SequenceState st = m.new_sequence(), ref = eager.new_sequence();
  std::vector<float> a(static_cast<size_t>(V)), b(static_cast<size_t>(V));
  // An eager prefill step allows allocation.
  planting->plant = true;
  m.step(Stack::Main, {{&st, toks.data(), 5, Rows::Last, a.data(), nullptr, nullptr}});
  eager.step(Stack::Main, {{&ref, toks.data(), 5, Rows::Last, b.data(), nullptr, nullptr}});
  EXPECT_EQ(a, b);
  // The first decode step is captured: the allocation fails it.
  try {
    m.step(Stack::Main, {{&st, toks.data() + 5, 1, Rows::Last, a.data(), nullptr, nullptr}});
    ADD_FAILURE() << "a cudaMalloc inside a captured step did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaErrorStreamCaptureUnsupported"), std::string::npos) << e.what();
  }
  EXPECT_EQ(st.pos, 5);
  planting->plant = false;
  for (int i = 0; i < 3; ++i) {  // captured, then replayed
    m.step(Stack::Main, {{&st, toks.data() + 5 + i, 1, Rows::Last, a.data(), nullptr, nullptr}});
    eager.step(Stack::Main, {{&ref, toks.data() + 5 + i, 1, Rows::Last, b.data(), nullptr, nullptr}});
    EXPECT_EQ(a, b) << "decode step " << i;
  }
}

// The routed experts on the device (steps of up to 16 rows) give the floats of the host-built
// per-expert lists (longer steps): 20 tokens as one prefill step == the same 20 as decode steps,
// bit for bit (every other kernel is chunk-invariant bit for bit too).
TEST_F(CudaGraph, DeviceRoutingEqualsHostLists) {
  const Model eager = cuda_model({.context = 64, .graphs = false});
  const int64_t V = eager.config().vocab, n = 20;
  const std::vector<int32_t> toks = tokens_of(0, V);
  std::vector<float> chunk(static_cast<size_t>(n * V)), steps(static_cast<size_t>(n * V));
  SequenceState a = eager.new_sequence(), b = eager.new_sequence();
  eager.step(Stack::Main, {{&a, toks.data(), n, Rows::All, chunk.data(), nullptr, nullptr}});
  for (int64_t i = 0; i < n; ++i) eager.step(Stack::Main, {{&b, toks.data() + i, 1, Rows::All, steps.data() + i * V, nullptr, nullptr}});
  EXPECT_TRUE(chunk == steps) << "max rel " << max_rel(chunk, steps, V);
}

// Greedy ids only (SeqInput::argmax_out, the head + argmax_rows inside the step's graph): the
// argmax of an eager step's logits. The steps cycle through the three tails (ids, logits, none),
// each captured once and then replayed: a graph of one tail replayed for another would give
// stale ids or logits (or fail the op-count check).
TEST_F(CudaGraph, ArgmaxIdsEqualArgmaxOfLogits) {
  const Model graphs = cuda_model({.context = 64, .graphs = true}), eager = cuda_model({.context = 64, .graphs = false});
  const int64_t V = graphs.config().vocab;
  const std::vector<int32_t> toks = tokens_of(0, V);
  SequenceState a = graphs.new_sequence(), b = eager.new_sequence();
  std::vector<float> l(static_cast<size_t>(V)), got(static_cast<size_t>(V));
  for (int64_t i = 0; i < 9; ++i) {
    const int tail = static_cast<int>(i % 3);
    int32_t id = -1;
    if (tail == 0) graphs.step(Stack::Main, {{&a, toks.data() + i, 1, Rows::Last, nullptr, nullptr, nullptr, &id}});
    if (tail == 1) graphs.step(Stack::Main, {{&a, toks.data() + i, 1, Rows::Last, got.data(), nullptr, nullptr}});
    if (tail == 2) graphs.step(Stack::Main, {{&a, toks.data() + i, 1, Rows::None, nullptr, nullptr, nullptr}});
    eager.step(Stack::Main, {{&b, toks.data() + i, 1, Rows::Last, l.data(), nullptr, nullptr}});
    if (tail == 0) {
      EXPECT_EQ(id, std::max_element(l.begin(), l.end()) - l.begin()) << "step " << i;
    }
    if (tail == 1) {
      EXPECT_EQ(got, l) << "step " << i;
    }
  }
}
