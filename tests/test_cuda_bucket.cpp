// One CUDA graph per batch bucket (backends/cuda/step_graphs.h, docs/cuda.md "One graph per batch
// bucket"): decode steps whose membership changes every step (sequences joining and leaving, a
// batch of 3 padded to 4 with rows of the backend's scratch sequence) replay the graph of their
// bucket, and every sequence's outputs equal its solo eager run bit for bit. Skipped without a
// CUDA device (label gpu); on the emulator (gpu-emu) it also counts captures and instantiations.
#include <algorithm>
#include <random>

#include "backends/cuda/cuda_backend.h"
#include "model/forward.h"
#include "test_cuda_model.h"
#include "test_cuda_util.h"
#include "test_util.h"
#if defined(DSV4_CUDA_EMU)
#include "kernels/cuda_emu/control.h"
#endif

using namespace dsv4;
using namespace dsv4::testing;

namespace {

class CudaBucket : public GpuTest {};

#if defined(DSV4_CUDA_EMU)
struct Counts {
  uint64_t captures = 0, instantiations = 0, launches = 0;
};
Counts counts() {
  const emu::Stats s = emu::stats();
  return {s.graph_captures, s.graph_instantiations, s.graph_launches};
}
#endif

// One decode step of the schedule: the sequences in it, in row order, and whether they ask for
// greedy ids only (else logits; `none` names a sequence that asks for no head output at all).
struct Plan {
  std::vector<int> seqs;
  bool ids = false;
  int none = -1;
};

}  // namespace

TEST_F(CudaBucket, ChangingMembershipReplaysOneGraphPerBucket) {
  const Model graphs = cuda_model({.context = 64, .graphs = true}), eager = cuda_model({.context = 64, .graphs = false});
  const int64_t V = graphs.config().vocab;
  constexpr int kSeqs = 5;
  // Buckets 4 (batches of 3 and 4), 1 and 2; an ids step of each of buckets 4 and 2; a step where
  // one sequence wants no output (the bucket's rows all get the head: same graph).
  const std::vector<Plan> schedule = {
      {{0, 1, 2}},       {{0, 1, 3}},       {{1, 2, 3, 4}}, {{4}},          {{2}},
      {{0, 2, 3}, false, 3}, {{3, 4}},      {{0, 1}},       {{0, 4, 1}},    {{2, 0, 4}, true},
      {{1, 2, 3}, true}, {{3, 1}, true},    {{4, 0}, true}, {{4, 3, 2, 1}},
  };
  // Each sequence's tokens: a prompt of 3 + i, then one per decode step it takes part in.
  std::mt19937 rng(77);
  std::uniform_int_distribution<int32_t> tok(2, static_cast<int32_t>(V - 1));
  std::vector<std::vector<int32_t>> toks(kSeqs);
  std::vector<int64_t> prompt(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    prompt[i] = 3 + i;
    toks[i].resize(static_cast<size_t>(prompt[i]));
    for (int32_t& t : toks[i]) t = tok(rng);
  }
  for (const Plan& p : schedule)
    for (int i : p.seqs) toks[i].push_back(tok(rng));

  // The batched run: prompts one by one (eager), then the schedule. Each sequence's outputs per
  // decode step it takes part in: logits, or the greedy id (-1: no output asked).
  std::vector<SequenceState> st;
  std::vector<float> scratch(static_cast<size_t>(V));
  for (int i = 0; i < kSeqs; ++i) {
    st.push_back(graphs.new_sequence());
    graphs.step(Stack::Main, {{&st[i], toks[i].data(), prompt[i], Rows::Last, scratch.data(), nullptr, nullptr}});
  }
  std::vector<std::vector<std::vector<float>>> logits(kSeqs);
  std::vector<std::vector<int32_t>> ids(kSeqs);
  std::vector<int64_t> fed(prompt);
#if defined(DSV4_CUDA_EMU)
  std::vector<bool> bucket_seen(32, false);
  Counts before = counts();
#endif
  for (size_t k = 0; k < schedule.size(); ++k) {
    const Plan& p = schedule[k];
    std::vector<SeqInput> in;
    std::vector<std::vector<float>> out(p.seqs.size(), std::vector<float>(static_cast<size_t>(V)));
    std::vector<int32_t> id(p.seqs.size(), -1);
    for (size_t r = 0; r < p.seqs.size(); ++r) {
      const int i = p.seqs[r];
      SeqInput si{&st[i], toks[i].data() + fed[i], 1, Rows::Last, p.ids ? nullptr : out[r].data(), nullptr, nullptr};
      if (p.ids) si.argmax_out = &id[r];
      if (i == p.none) si = {&st[i], toks[i].data() + fed[i], 1, Rows::None, nullptr, nullptr, nullptr};
      in.push_back(si);
    }
    graphs.step(Stack::Main, in);
    for (size_t r = 0; r < p.seqs.size(); ++r) {
      const int i = p.seqs[r];
      ++fed[i];
      EXPECT_EQ(st[i].pos, fed[i]);
      logits[i].push_back(p.ids || i == p.none ? std::vector<float>() : out[r]);
      ids[i].push_back(p.ids ? id[r] : -1);
    }
#if defined(DSV4_CUDA_EMU)
    // A step is one graph launch; only the first step of a bucket (per tail) captures and
    // instantiates, whichever sequences later steps hold.
    const Counts now = counts();
    const size_t bucket = p.seqs.size() == 3 ? 4 : p.seqs.size();
    const size_t key = bucket + (p.ids ? 8 : 0);  // distinct per (bucket, tail) here
    const uint64_t fresh = bucket_seen[key] ? 0 : 1;
    bucket_seen[key] = true;
    EXPECT_EQ(now.launches - before.launches, 1u) << "step " << k;
    EXPECT_EQ(now.captures - before.captures, fresh) << "step " << k;
    EXPECT_EQ(now.instantiations - before.instantiations, fresh) << "step " << k;
    before = now;
#endif
  }

  // Each sequence alone, eagerly: the same tokens, logits at every decode step.
  for (int i = 0; i < kSeqs; ++i) {
    SequenceState solo = eager.new_sequence();
    eager.step(Stack::Main, {{&solo, toks[i].data(), prompt[i], Rows::Last, scratch.data(), nullptr, nullptr}});
    for (size_t j = 0; j < logits[i].size(); ++j) {
      eager.step(Stack::Main, {{&solo, toks[i].data() + prompt[i] + j, 1, Rows::Last, scratch.data(), nullptr, nullptr}});
      if (!logits[i][j].empty()) {
        EXPECT_TRUE(logits[i][j] == scratch) << "sequence " << i << ", decode step " << j;
      }
      if (ids[i][j] >= 0) {
        EXPECT_EQ(ids[i][j], std::max_element(scratch.begin(), scratch.end()) - scratch.begin())
            << "sequence " << i << ", decode step " << j;
      }
    }
  }
}
