// The one list of tensors (model/tensors.h): it matches the published-layout golden checkpoints
// tensor for tensor, the bound model has every slot filled, the const walk checks the structure,
// and the memory accounting agrees with the file contents.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/names.h"
#include "model/tensors.h"
#include "model/weights.h"
#include "test_util.h"
#include "tools/make_tiny.h"

namespace dsv4 {
namespace {

using testing::golden_dir;

std::string model_dir(const std::string& name) {
  const std::string d = golden_dir(name);
  return d.empty() ? d : d + "/model";
}

std::vector<TensorDesc> list_of(const ModelConfig& c) {
  std::vector<TensorDesc> out;
  for_each_tensor(c, [&](const TensorDesc& t) { out.push_back(t); });
  return out;
}

// Every checkpoint tensor is a listed tensor or a companion (block scales, NVFP4 global and
// input scales) of a listed linear, and every listed tensor is in the checkpoint.
void expect_list_matches_checkpoint(const std::string& dir) {
  ASSERT_FALSE(dir.empty()) << "golden case missing";
  const ModelWeights w = load_model(dir, LoadMode::Mmap);
  std::set<std::string> expected, companions;
  for (const TensorDesc& t : list_of(w.cfg)) {
    EXPECT_TRUE(expected.insert(t.name_in(w.layout)).second) << "listed twice: " << t.name;
    if (t.kind() == TensorKind::Linear)
      for (const char* s : {".scale", ".weight_scale", ".weight_scale_2", ".input_scale"})
        companions.insert(layout_tensor_name(w.layout, t.base() + s));
  }
  std::set<std::string> in_file;
  for (const std::string& n : w.store.names()) {
    in_file.insert(n);
    EXPECT_TRUE(expected.count(n) || companions.count(n)) << n << " is in " << dir << " but not in the list";
  }
  for (const std::string& n : expected) EXPECT_TRUE(in_file.count(n)) << n << " is listed but not in " << dir;
}

TEST(TensorList, MatchesGoldenNative) { expect_list_matches_checkpoint(model_dir("tiny-native")); }
TEST(TensorList, MatchesGoldenNvfp4) { expect_list_matches_checkpoint(model_dir("tiny-nvfp4-sharded")); }
TEST(TensorList, MatchesGoldenHfBf16) { expect_list_matches_checkpoint(model_dir("tiny-hf-bf16-sharded")); }

TEST(TensorList, FollowsTheConfig) {
  const ModelConfig c = tiny_preset("tiny");  // ratios {0, 4, 16, 4, 16 | mtp 0}, 2 hash layers
  std::map<int64_t, std::set<std::string>> parts;
  int64_t experts = 0, mtp = 0;
  for (const TensorDesc& t : list_of(c)) {
    if (t.layer >= 0) {
      EXPECT_TRUE(t.name.starts_with("layers." + std::to_string(t.layer) + ".")) << t.name;
    }
    if (t.mtp) {
      ++mtp;
      EXPECT_TRUE(t.name.starts_with("mtp.0.")) << t.name;
    }
    if (t.expert >= 0) {
      ++experts;
      EXPECT_EQ(t.part, Part::RoutedExperts) << t.name;
    }
    if (t.layer >= 0) parts[t.layer].insert(part_name(t.part));
    if (t.role == Role::HashTable) {
      EXPECT_LT(t.layer, c.n_hash) << t.name;
      EXPECT_EQ(t.limit, c.n_experts);
      EXPECT_EQ(t.shape, (std::vector<int64_t>{c.vocab, c.n_active}));
    }
    if (t.role == Role::RouterBias) {
      EXPECT_TRUE(t.layer >= c.n_hash || t.mtp) << t.name;
    }
    if (t.kind() == TensorKind::Linear) {
      EXPECT_EQ(t.shape.size(), 2u) << t.name;
    }
  }
  EXPECT_EQ(experts, (c.n_layers + 1) * c.n_experts * 3);
  EXPECT_GT(mtp, 0);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    EXPECT_EQ(parts[l].count("compressor"), c.ratio(l) > 0 ? 1u : 0u) << l;
    EXPECT_EQ(parts[l].count("indexer"), c.ratio(l) == 4 ? 1u : 0u) << l;
  }
}

TEST(TensorList, BindingFillsEverySlot) {
  const std::string dir = model_dir("tiny-nvfp4-sharded");
  ASSERT_FALSE(dir.empty());
  const ModelWeights w = load_model(dir, LoadMode::Mmap);
  const std::vector<TensorDesc> list = list_of(w.cfg);
  size_t i = 0;
  std::set<const void*> targets;
  for_each_tensor(w, [&](const TensorDesc& t, TensorTarget<true> x) {
    ASSERT_LT(i, list.size());
    EXPECT_EQ(t.name, list[i++].name);  // the config walk and the model walk are one list
    EXPECT_TRUE(targets.insert(x.address()).second) << t.name << " shares its slot";
    switch (t.kind()) {
      case TensorKind::Linear:
        ASSERT_NE(x.linear, nullptr);
        EXPECT_FALSE(x.linear->empty()) << t.name;
        EXPECT_EQ(x.linear->rows, t.shape[0]) << t.name;
        EXPECT_EQ(x.linear->cols, t.shape[1]) << t.name;
        break;
      case TensorKind::Floats: {
        ASSERT_NE(x.floats, nullptr);
        int64_t n = 1;
        for (int64_t s : t.shape) n *= s;
        EXPECT_EQ(static_cast<int64_t>(x.floats->size()), n) << t.name;
        break;
      }
      case TensorKind::Ids:
        ASSERT_NE(x.ids, nullptr);
        EXPECT_EQ(static_cast<int64_t>(x.ids->size()), t.shape[0] * t.shape[1]) << t.name;
        break;
    }
  });
  EXPECT_EQ(i, list.size());
}

TEST(TensorList, ConstWalkRejectsAStructureThatDisagreesWithTheConfig) {
  ModelWeights w = load_model(model_dir("tiny-native"), LoadMode::Mmap);
  auto walk = [&] { for_each_tensor(static_cast<const ModelWeights&>(w), [](const TensorDesc&, TensorTarget<true>) {}); };
  EXPECT_NO_THROW(walk());
  w.layers[1].attn.indexer.reset();  // layer 1 is CSA(4)
  try {
    walk();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.1.attn.indexer"), std::string::npos) << e.what();
  }
}

// What the engine holds, recomputed from the file: linears keep their stored bytes (payload and
// block scales: every 2-D BF16 / F8 / I8 tensor of the native checkpoint), small tensors become
// 4 bytes per value (F32, I64 tables, 1-D BF16 norms).
TEST(TensorList, WeightBytesAgreeWithTheFile) {
  const ModelWeights w = load_model(model_dir("tiny-native"), LoadMode::Mmap);
  size_t want = 0;
  for (const std::string& n : w.store.names()) {
    const TensorInfo& t = w.store.get(n);
    const bool stored = t.dtype == DType::F8_E4M3 || t.dtype == DType::F8_E8M0 || t.dtype == DType::I8 ||
                        (t.dtype == DType::BF16 && t.shape.size() == 2);
    want += stored ? t.nbytes : static_cast<size_t>(t.numel()) * 4;
  }
  const WeightBytes b = weight_bytes(w);
  EXPECT_EQ(b.main_bytes() + b.mtp_bytes(), want);
  EXPECT_GT(b.mtp_bytes(), 0u);
  EXPECT_GT(b.main[static_cast<int>(Part::RoutedExperts)].bytes, b.main[static_cast<int>(Part::SharedExpert)].bytes);
}

}  // namespace
}  // namespace dsv4
