// The single-process pieces of parallel runs (docs/parallel.md): how the model is split, the
// partial loading each rank does, the request encoding. The runs themselves: tests/mpi/*.sh
// (ctest label mpi).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "engine/lockstep.h"
#include "io/safetensors.h"
#include "model/rows.h"
#include "model/tensors.h"
#include "model/weights.h"
#include "parallel/partition.h"
#include "test_util.h"

using namespace dsv4;
using namespace dsv4::testing;

// Any world size, dividing the count or not: contiguous ranges that cover everything once, in
// rank order, balanced to within one.
TEST(Parallel, SplitsAreContiguousAndBalanced) {
  for (int64_t n = 0; n <= 40; ++n)
    for (int world = 1; world <= 9; ++world) {
      const Share sh{0, world, true, true};
      int64_t lo = n, hi = 0, at = 0;
      for (int r = 0; r < world; ++r) {
        const ExpertSplit es{r, world, n};
        EXPECT_EQ(es.begin(), at) << n << " " << world;
        EXPECT_EQ(es.begin(), sh.part(n, r));
        EXPECT_LE(es.begin(), es.end());
        lo = std::min(lo, es.end() - es.begin());
        hi = std::max(hi, es.end() - es.begin());
        for (int64_t e = es.begin(); e < es.end(); ++e) EXPECT_TRUE(es.owns(e));
        if (es.begin() > 0) {
          EXPECT_FALSE(es.owns(es.begin() - 1));
        }
        at = es.end();
      }
      EXPECT_EQ(at, n);
      EXPECT_LE(hi - lo, 1) << n << " " << world;
    }
}

TEST(Parallel, MessagesReadBackWhatWasWritten) {
  Msg m(Cmd::Step);
  m.put<uint64_t>(7).put_vec(std::vector<int32_t>{5, 17, 42}).put(Rows::All).put(true).put_str("model dir").put<int64_t>(-3);
  Msg r;
  r.bytes() = m.bytes();
  EXPECT_EQ(r.cmd(), Cmd::Step);
  EXPECT_EQ(r.get<uint64_t>(), 7u);
  EXPECT_EQ(r.get_vec<int32_t>(), (std::vector<int32_t>{5, 17, 42}));
  EXPECT_EQ(r.get<Rows>(), Rows::All);
  EXPECT_TRUE(r.get<bool>());
  EXPECT_EQ(r.get_str(), "model dir");
  EXPECT_EQ(r.get<int64_t>(), -3);
}

// TensorStore::hold reads only the byte range asked of each tensor: that range has the file's
// bytes and lives in this process's memory; a tensor not asked for stays in the file mapping.
TEST(Parallel, HoldReadsOnlyTheRangesAsked) {
  const std::string dir = temp_dir("parallel-hold");
  SafeTensorsWriter w;
  std::vector<uint8_t> a(4096 * 3), b(1000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7 + 1);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 3 + 2);
  w.add("a", DType::U8, {3, 4096}, a);
  w.add("b", DType::U8, {1000}, b);
  w.write(dir);
  TensorStore mapped = TensorStore::open_dir(dir, LoadMode::Mmap);
  const uint8_t* a_mapped = mapped.get("a").data;
  TensorStore s = TensorStore::open_dir(dir, LoadMode::Mmap);
  s.hold(LoadMode::Read, [](const TensorInfo& t) -> std::pair<size_t, size_t> {
    if (t.name == "a") return {4096, 8192};  // the middle row
    return {0, 0};
  });
  EXPECT_EQ(s.load_mode(), LoadMode::Read);
  const TensorInfo& ta = s.get("a");
  EXPECT_EQ(std::memcmp(ta.data + 4096, a.data() + 4096, 4096), 0);
  // Outside the range the memory was never written (zero pages, not the file's bytes): the
  // tensor lives in the process's memory, not in the mapping.
  for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(ta.data[i], 0) << i;
  for (size_t i = 8192; i < a.size(); ++i) ASSERT_EQ(ta.data[i], 0) << i;
  EXPECT_EQ(std::memcmp(a_mapped, a.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(s.get("b").data, b.data(), b.size()), 0);  // still mapped: the file's bytes
}

// A rank of an EP run binds only its experts; a TP rank binds every matrix whole (it reads only
// its rows of wq_b / wo_a / head, which the kernels then read). Together the EP ranks hold every
// expert exactly once.
TEST(Parallel, EpRanksBindOnlyTheirExperts) {
  const std::string m = golden_dir("tiny-native") + "/model";
  const ModelWeights whole = load_model(m, LoadMode::Read);
  const int world = 3;
  size_t expert_bytes = 0, other = 0;
  for_each_tensor(whole, [&](const TensorDesc& t, TensorTarget<true> x) {
    if (x.linear) (t.expert >= 0 ? expert_bytes : other) += x.linear->stored_bytes();
  });
  size_t seen_experts = 0;
  for (int r = 0; r < world; ++r) {
    const ModelWeights w = load_model(m, LoadMode::Read, Share{r, world, true, false});
    const ExpertSplit es{r, world, w.cfg.n_experts};
    size_t mine = 0, rest = 0;
    for_each_tensor(w, [&](const TensorDesc& t, TensorTarget<true> x) {
      if (!x.linear) return;
      if (t.expert >= 0) {
        EXPECT_EQ(x.linear->rows > 0, es.owns(t.expert)) << t.name << " on rank " << r;
        mine += x.linear->stored_bytes();
      } else {
        rest += x.linear->stored_bytes();
      }
    });
    EXPECT_EQ(rest, other);
    seen_experts += mine;
    // TP: everything bound, whole shapes.
    const ModelWeights t = load_model(m, LoadMode::Read, Share{r, world, false, true});
    EXPECT_EQ(t.head.rows, whole.head.rows);
    EXPECT_EQ(t.layers[0].attn.wq_b.rows, whole.layers[0].attn.wq_b.rows);
    EXPECT_GT(t.layers[0].ffn.experts.back().w1.rows, 0);
  }
  EXPECT_EQ(seen_experts, expert_bytes);
}
