// make_tiny: presets, argument checks, determinism, tensor layouts against the golden
// checkpoints, config.json round trip, sharding, and the quantised payloads.
#include "tools/make_tiny.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/formats.h"
#include "core/weight.h"
#include "io/config.h"
#include "io/names.h"
#include "io/safetensors.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Generated checkpoints are cached per process (one per format/seed/shards) and removed at exit.

fs::path scratch_root() {
  static const fs::path root = fs::path(testing::TempDir()) / ("dsv4_make_tiny_" + std::to_string(getpid()));
  return root;
}

class ScratchCleanup : public testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(scratch_root(), ec);
  }
};
[[maybe_unused]] testing::Environment* const kCleanup = testing::AddGlobalTestEnvironment(new ScratchCleanup);

std::string generated(const std::string& format, uint64_t seed = 7, int shards = 1,
                      const std::string& preset = "tiny") {
  static std::map<std::string, std::string> cache;
  const std::string key = preset + "_" + format + "_s" + std::to_string(seed) + "_n" + std::to_string(shards);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  TinyOptions opt;
  opt.out_dir = (scratch_root() / key).string();
  opt.preset = preset;
  opt.format = format;
  opt.seed = seed;
  opt.shards = shards;
  make_tiny(opt);
  return cache[key] = opt.out_dir;
}

// The golden copy in tests/data is preferred; /work/shared may be absent (CI).
std::string golden_model(const std::string& name) {
  for (const std::string& root : {std::string(DSV4_TEST_DATA) + "/golden", std::string(DSV4_SHARED_DIR) + "/golden"}) {
    const fs::path p = fs::path(root) / name / "model";
    if (fs::exists(p / "config.json")) return p.string();
  }
  return "";
}

#define REQUIRE_GOLDEN(var, name)                                   \
  const std::string var = golden_model(name);                       \
  if (var.empty()) GTEST_SKIP() << "golden case " << name << " not available"

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(slurp(p)); }

// name -> "DTYPE [shape]"
std::map<std::string, std::string> layout_of(const TensorStore& s) {
  std::map<std::string, std::string> m;
  for (const std::string& n : s.names()) {
    const TensorInfo& t = s.get(n);
    m[n] = std::string(dtype_name(t.dtype)) + " " + t.shape_str();
  }
  return m;
}

void expect_same_layout(const std::string& got_dir, const std::string& want_dir) {
  const auto got = layout_of(TensorStore::open_dir(got_dir));
  const auto want = layout_of(TensorStore::open_dir(want_dir));
  for (const auto& [name, desc] : want) {
    auto it = got.find(name);
    if (it == got.end())
      ADD_FAILURE() << "missing " << name << " (" << desc << ")";
    else
      EXPECT_EQ(it->second, desc) << name;
  }
  for (const auto& [name, desc] : got)
    if (!want.count(name)) ADD_FAILURE() << "extra " << name << " (" << desc << ")";
}

std::vector<float> floats_of(const TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype == DType::F32) {
      std::memcpy(&v[i], t.data + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      v[i] = bf16_to_f32(h);
    }
  }
  return v;
}

// A linear weight in whatever form the checkpoint stores it, decided by dtype and keys present.
QWeight qweight(const TensorStore& s, const std::string& base) {
  const TensorInfo& w = s.get(base + ".weight");
  QWeight q;
  q.name = w.name;
  q.data = w.data;
  q.rows = w.shape[0];
  q.cols = w.shape[1];
  if (w.dtype == DType::BF16) {
    q.fmt = WFormat::BF16;
  } else if (w.dtype == DType::F8_E4M3) {
    q.fmt = WFormat::FP8Block;
    const TensorInfo& sc = s.get(base + ".scale");
    q.scale = sc.data;
    q.scale_cols = sc.shape[1];
  } else if (s.has(base + ".scale")) {
    q.fmt = WFormat::MXFP4;
    q.cols *= 2;
    const TensorInfo& sc = s.get(base + ".scale");
    q.scale = sc.data;
    q.scale_cols = sc.shape[1];
  } else {
    q.fmt = WFormat::NVFP4;
    q.cols *= 2;
    const TensorInfo& sc = s.get(base + ".weight_scale");
    q.scale = sc.data;
    q.scale_cols = sc.shape[1];
    std::memcpy(&q.scale2, s.get(base + ".weight_scale_2").data, 4);
  }
  return q;
}

double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s / static_cast<double>(v.size()));
}

double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// The bases of every stored linear (names ending ".weight" with a 2-D quantised payload).
std::vector<std::string> quantised_bases(const TensorStore& s) {
  std::vector<std::string> out;
  for (const std::string& n : s.names()) {
    const TensorInfo& t = s.get(n);
    const bool q = t.dtype == DType::F8_E4M3 || t.dtype == DType::I8 || t.dtype == DType::U8;
    if (q && n.ends_with(".weight")) out.push_back(n.substr(0, n.size() - 7));
  }
  return out;
}

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(config_to_json(a).dump(), config_to_json(b).dump());
}

// ---------------------------------------------------------------------------------------------

TEST(MakeTinyPreset, TinyHasTheDocumentedDimensions) {
  const ModelConfig c = tiny_preset("tiny");
  EXPECT_EQ(c.vocab, 1024);
  EXPECT_EQ(c.dim, 256);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.q_lora, 128);
  EXPECT_EQ(c.o_groups, 2);
  EXPECT_EQ(c.o_lora, 128);
  EXPECT_EQ(c.n_experts, 8);
  EXPECT_EQ(c.n_active, 2);
  EXPECT_EQ(c.n_shared, 1);
  EXPECT_EQ(c.moe_inter, 128);
  EXPECT_EQ(c.n_hash, 2);
  EXPECT_EQ(c.compress_ratios, (std::vector<int64_t>{0, 4, 16, 4, 16, 0}));
  EXPECT_EQ(c.window, 16);
  EXPECT_EQ(c.index_heads, 4);
  EXPECT_EQ(c.index_dim, 128);
  EXPECT_EQ(c.index_topk, 4);
  EXPECT_EQ(c.hc, 4);
  EXPECT_EQ(c.sinkhorn_iters, 20);
  EXPECT_EQ(c.n_mtp, 1);
  EXPECT_DOUBLE_EQ(c.route_scale, 2.5);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 10.0);
  EXPECT_DOUBLE_EQ(c.yarn_factor, 16.0);
  EXPECT_EQ(c.yarn_original, 65536);
  EXPECT_EQ(c.max_positions, 1048576);
}

TEST(MakeTinyPreset, SmallDiffersWhereDocumented) {
  const ModelConfig c = tiny_preset("small");
  EXPECT_EQ(c.dim, 512);
  EXPECT_EQ(c.n_layers, 6);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.q_lora, 256);
  EXPECT_EQ(c.o_groups, 4);
  EXPECT_EQ(c.o_lora, 256);
  EXPECT_EQ(c.n_active, 3);
  EXPECT_EQ(c.moe_inter, 256);
  EXPECT_EQ(c.n_hash, 3);
  EXPECT_EQ(c.compress_ratios, (std::vector<int64_t>{4, 16, 4, 0, 4, 16, 0}));
  EXPECT_EQ(c.window, 32);
  EXPECT_EQ(c.index_heads, 8);
  EXPECT_EQ(c.index_topk, 8);
}

TEST(MakeTinyPreset, PresetsPassConfigValidation) {
  for (const char* p : {"tiny", "small"}) {
    const ModelConfig c = tiny_preset(p);
    expect_same_config(parse_config(config_to_json(c), p), c);
  }
}

TEST(MakeTinyPreset, MatchesGoldenConfigs) {
  for (const auto& [preset, golden] : {std::pair{"tiny", "tiny-native"}, std::pair{"small", "small-native"}}) {
    const std::string dir = golden_model(golden);
    if (dir.empty()) continue;
    expect_same_config(tiny_preset(preset), load_config(dir + "/config.json"));
  }
}

TEST(MakeTinyPreset, UnknownPresetListsValidNames) {
  try {
    tiny_preset("huge");
    FAIL() << "no throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("huge"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tiny"), std::string::npos) << msg;
    EXPECT_NE(msg.find("small"), std::string::npos) << msg;
  }
}

TEST(MakeTinyArgs, RejectsBadOptions) {
  TinyOptions opt;
  opt.out_dir = (scratch_root() / "never").string();
  opt.format = "gguf";
  EXPECT_THROW(make_tiny(opt), Error);
  opt.format = "native";
  opt.shards = 0;
  EXPECT_THROW(make_tiny(opt), Error);
  opt.shards = 1;
  opt.preset = "nope";
  EXPECT_THROW(make_tiny(opt), Error);
  EXPECT_FALSE(fs::exists(opt.out_dir));
}

TEST(MakeTinyDeterminism, SameSeedGivesIdenticalFiles) {
  for (const char* fmt : {"native", "nvfp4"}) {
    const fs::path a = generated(fmt, 11, 2);
    TinyOptions opt;
    opt.out_dir = (scratch_root() / (std::string("again_") + fmt)).string();
    opt.format = fmt;
    opt.seed = 11;
    opt.shards = 2;
    make_tiny(opt);
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(a)) names.insert(e.path().filename().string());
    std::set<std::string> names_b;
    for (const auto& e : fs::directory_iterator(opt.out_dir)) names_b.insert(e.path().filename().string());
    EXPECT_EQ(names, names_b);
    for (const std::string& n : names) EXPECT_TRUE(slurp(a / n) == slurp(fs::path(opt.out_dir) / n)) << fmt << " " << n;
  }
}

TEST(MakeTinyDeterminism, DifferentSeedGivesDifferentWeights) {
  const fs::path a = generated("native", 1), b = generated("native", 2);
  EXPECT_EQ(slurp(a / "config.json"), slurp(b / "config.json"));
  EXPECT_NE(slurp(a / "model.safetensors"), slurp(b / "model.safetensors"));
  const TensorStore sa = TensorStore::open_dir(a.string()), sb = TensorStore::open_dir(b.string());
  const TensorInfo& ea = sa.get("embed.weight");
  EXPECT_NE(std::memcmp(ea.data, sb.get("embed.weight").data, ea.nbytes), 0);
}

TEST(MakeTinyLayout, NativeMatchesGolden) {
  REQUIRE_GOLDEN(g, "tiny-native");
  expect_same_layout(generated("native"), g);
}

TEST(MakeTinyLayout, Nvfp4MatchesGolden) {
  REQUIRE_GOLDEN(g, "tiny-nvfp4-sharded");
  const std::string d = generated("nvfp4", 7, 2);
  expect_same_layout(d, g);
  EXPECT_TRUE(fs::exists(fs::path(d) / "model-00002-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(d) / "hf_quant_config.json"));
}

TEST(MakeTinyLayout, HfBf16MatchesGolden) {
  REQUIRE_GOLDEN(g, "tiny-hf-bf16-sharded");
  const std::string d = generated("hf-bf16", 7, 3);
  expect_same_layout(d, g);
  EXPECT_TRUE(fs::exists(fs::path(d) / "model.safetensors.index.json"));
}

TEST(MakeTinyLayout, SmallNativeMatchesGolden) {
  REQUIRE_GOLDEN(g, "small-native");
  expect_same_layout(generated("native", 7, 1, "small"), g);
}

TEST(MakeTinyLayout, LayerKindsFollowTheRatios) {
  const ModelConfig c = tiny_preset("tiny");
  const TensorStore s = TensorStore::open_dir(generated("native"));
  for (int64_t l = 0; l <= c.n_layers; ++l) {
    const std::string p = l < c.n_layers ? "layers." + std::to_string(l) + "." : "mtp.0.";
    const int64_t ratio = c.ratio(l);
    EXPECT_EQ(s.has(p + "attn.compressor.ape"), ratio > 0) << p;
    EXPECT_EQ(s.has(p + "attn.indexer.wq_b.weight"), ratio == 4) << p;
    if (ratio > 0) {
      EXPECT_EQ(s.get(p + "attn.compressor.wkv.weight").shape[0], (ratio == 4 ? 2 : 1) * c.head_dim);
    }
    const bool hash = l < c.n_hash;
    EXPECT_EQ(s.has(p + "ffn.gate.tid2eid"), hash) << p;
    EXPECT_EQ(s.has(p + "ffn.gate.bias"), !hash) << p;
  }
}

TEST(MakeTinyConfig, RoundTripsThroughParseConfig) {
  for (const char* fmt : {"native", "nvfp4", "hf-bf16"}) {
    const fs::path d = generated(fmt, 7, std::string(fmt) == "native" ? 1 : 2);
    const nlohmann::json j = read_json(d / "config.json");
    expect_same_config(parse_config(j, fmt), tiny_preset("tiny"));
    EXPECT_EQ(j.contains("quantization_config"), std::string(fmt) != "hf-bf16") << fmt;
    EXPECT_EQ(fs::exists(d / "hf_quant_config.json"), std::string(fmt) == "nvfp4") << fmt;
    if (!j.contains("quantization_config")) continue;
    const nlohmann::json& q = j["quantization_config"];
    EXPECT_EQ(q["quant_method"], "fp8");
    EXPECT_EQ(q["fmt"], "e4m3");
    EXPECT_EQ(q["scale_fmt"], "ue8m0");
    EXPECT_EQ(q["activation_scheme"], "dynamic");
    EXPECT_EQ(q["weight_block_size"], nlohmann::json({128, 128}));
    EXPECT_EQ(j["expert_dtype"], "fp4");
    EXPECT_EQ(q.contains("moe_quant_algo"), std::string(fmt) == "nvfp4");
    if (q.contains("moe_quant_algo")) {
      EXPECT_EQ(q["moe_quant_algo"], "NVFP4");
    }
  }
  const nlohmann::json hq = read_json(fs::path(generated("nvfp4", 7, 2)) / "hf_quant_config.json");
  EXPECT_EQ(hq["quantization"]["quant_algo"], "NVFP4");
  EXPECT_EQ(hq["quantization"]["group_size"], 16);
}

TEST(MakeTinySharding, ShardsHoldTheSameTensorsAsOneFile) {
  const std::string one = generated("native", 7, 1), three = generated("native", 7, 3);
  const TensorStore a = TensorStore::open_dir(one), b = TensorStore::open_dir(three);
  EXPECT_EQ(b.files().size(), 3u);
  ASSERT_EQ(a.names(), b.names());
  for (const std::string& n : a.names()) {
    const TensorInfo &x = a.get(n), &y = b.get(n);
    EXPECT_EQ(x.dtype, y.dtype) << n;
    EXPECT_EQ(x.shape, y.shape) << n;
    ASSERT_EQ(x.nbytes, y.nbytes) << n;
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0) << n;
  }
}

// The three layouts of one seed are one model: each quantised linear must dequantise close to
// the BF16 copy in the hf-bf16 checkpoint (FP8 ~3% rms error, FP4 ~10-15%).
void expect_close_to_bf16(const std::string& dir, double fp8_tol, double fp4_tol) {
  const TensorStore q = TensorStore::open_dir(dir);
  const TensorStore ref = TensorStore::open_dir(generated("hf-bf16", 7, 3));
  const std::vector<std::string> bases = quantised_bases(q);
  ASSERT_FALSE(bases.empty());
  std::map<WFormat, int> seen;
  for (const std::string& base : bases) {
    const QWeight w = qweight(q, base);
    ++seen[w.fmt];
    const std::vector<float> got = dequant_all(w);
    ASSERT_TRUE(all_finite(got)) << base;
    const std::string hf = layout_tensor_name(Layout::HF, base + ".weight");
    const std::vector<float> want = dequant_all(qweight(ref, hf.substr(0, hf.size() - 7)));
    ASSERT_EQ(got.size(), want.size()) << base;
    EXPECT_LT(rel_err(got, want), w.fmt == WFormat::FP8Block ? fp8_tol : fp4_tol) << base << " " << wformat_name(w.fmt);
  }
  EXPECT_GT(seen[WFormat::FP8Block], 0);
  EXPECT_GT(seen[WFormat::MXFP4], 0);
}

TEST(MakeTinyPayload, NativeDequantisesCloseToBf16) { expect_close_to_bf16(generated("native"), 0.04, 0.2); }

TEST(MakeTinyPayload, Nvfp4DequantisesCloseToBf16) { expect_close_to_bf16(generated("nvfp4", 7, 2), 0.04, 0.2); }

TEST(MakeTinyPayload, ScalesAreValid) {
  const TensorStore s = TensorStore::open_dir(generated("nvfp4", 7, 2));
  int nv = 0;
  for (const std::string& n : s.names()) {
    const TensorInfo& t = s.get(n);
    if (t.dtype == DType::F8_E8M0) {
      for (size_t i = 0; i < t.nbytes; ++i) ASSERT_NE(t.data[i], 0xFF) << n;
    }
    if (t.dtype == DType::F8_E4M3) {  // weights and NVFP4 block scales: never NaN
      for (size_t i = 0; i < t.nbytes; ++i) ASSERT_NE(t.data[i] & 0x7F, 0x7F) << n;
    }
    if (n.ends_with(".weight_scale_2") || n.ends_with(".input_scale")) {
      ++nv;
      ASSERT_EQ(t.dtype, DType::F32);
      ASSERT_TRUE(t.shape.empty()) << n;
      float v;
      std::memcpy(&v, t.data, 4);
      EXPECT_TRUE(std::isfinite(v) && v > 0) << n;
    }
  }
  EXPECT_GT(nv, 0);
}

TEST(MakeTinyPayload, FloatTensorsAreFiniteAndScaled) {
  const ModelConfig c = tiny_preset("tiny");
  const TensorStore s = TensorStore::open_dir(generated("native"));
  for (const std::string& n : s.names()) {
    const TensorInfo& t = s.get(n);
    if (t.dtype != DType::F32 && t.dtype != DType::BF16) continue;
    const std::vector<float> v = floats_of(t);
    ASSERT_TRUE(all_finite(v)) << n;
    if (n.find("norm.weight") != std::string::npos) {
      double mean = 0;
      for (float x : v) mean += x;
      EXPECT_NEAR(mean / static_cast<double>(v.size()), 1.0, 0.1) << n;
    }
  }
  EXPECT_NEAR(rms(floats_of(s.get("embed.weight"))), 1.0, 0.05);
  EXPECT_NEAR(rms(floats_of(s.get("head.weight"))) * std::sqrt(static_cast<double>(c.dim)), 1.0, 0.05);
  // Dense linears ~ N(0, 1/in) before quantisation.
  const QWeight wq = qweight(s, "layers.1.attn.wq_b");
  EXPECT_NEAR(rms(dequant_all(wq)) * std::sqrt(static_cast<double>(wq.cols)), 1.0, 0.1);
}

TEST(MakeTinyPayload, HashTablesHoldDistinctValidExperts) {
  const ModelConfig c = tiny_preset("tiny");
  const TensorStore s = TensorStore::open_dir(generated("native"));
  for (int64_t l = 0; l < c.n_hash; ++l) {
    const TensorInfo& t = s.get("layers." + std::to_string(l) + ".ffn.gate.tid2eid");
    ASSERT_EQ(t.shape, (std::vector<int64_t>{c.vocab, c.n_active}));
    std::vector<int> use(c.n_experts, 0);
    for (int64_t tok = 0; tok < c.vocab; ++tok) {
      std::set<int64_t> row;
      for (int64_t j = 0; j < c.n_active; ++j) {
        int64_t e;
        std::memcpy(&e, t.data + 8 * (tok * c.n_active + j), 8);
        ASSERT_GE(e, 0);
        ASSERT_LT(e, c.n_experts);
        row.insert(e);
        ++use[e];
      }
      ASSERT_EQ(static_cast<int64_t>(row.size()), c.n_active) << "token " << tok;
    }
    for (int u : use) EXPECT_GT(u, 0);  // every expert reachable
  }
}

}  // namespace
}  // namespace dsv4
