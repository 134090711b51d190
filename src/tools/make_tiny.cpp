// Random DeepSeek-V4 checkpoints. Values are drawn per tensor from a PRNG keyed by (seed, native
// tensor name), so a tensor's values do not depend on generation order and the three layouts of one
// seed describe the same model up to quantisation. Everything is integer arithmetic or correctly
// rounded IEEE arithmetic except log/sin/cos/exp, whose results are snapped to bf16 precision before
// use: a last-ulp libm (or FMA contraction) difference between platforms would have to land exactly
// on a bf16 rounding boundary to change a byte of the output.
#include "tools/make_tiny.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/formats.h"
#include "core/rng.h"
#include "io/names.h"
#include "io/safetensors.h"
#include "model/tensors.h"

namespace dsv4 {
namespace {

using Shape = std::vector<int64_t>;

// ---------------------------------------------------------------------------------------------
// Presets: the dimensions that differ between presets; shared hyper-parameters live in
// config_from(). Add a preset by adding a row.

struct PresetDims {
  int64_t vocab, dim, n_layers, n_heads, head_dim, rope_dim, q_lora, o_groups, o_lora;
  int64_t n_experts, n_active, moe_inter, n_hash, window;
  int64_t index_heads, index_dim, index_topk;
  std::vector<int64_t> compress_ratios;  // n_layers + 1 entries (last = MTP)
  int64_t n_mtp = 1;
  double route_scale = 2.5;
};

struct Preset {
  const char* name;
  PresetDims dims;
};

const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = {
      {"tiny",
       {.vocab = 1024, .dim = 256, .n_layers = 5, .n_heads = 4, .head_dim = 128, .rope_dim = 64,
        .q_lora = 128, .o_groups = 2, .o_lora = 128, .n_experts = 8, .n_active = 2,
        .moe_inter = 128, .n_hash = 2, .window = 16, .index_heads = 4, .index_dim = 128,
        .index_topk = 4, .compress_ratios = {0, 4, 16, 4, 16, 0}}},
      {"small",
       {.vocab = 1024, .dim = 512, .n_layers = 6, .n_heads = 8, .head_dim = 256, .rope_dim = 64,
        .q_lora = 256, .o_groups = 4, .o_lora = 256, .n_experts = 8, .n_active = 3,
        .moe_inter = 256, .n_hash = 3, .window = 32, .index_heads = 8, .index_dim = 128,
        .index_topk = 8, .compress_ratios = {4, 16, 4, 0, 4, 16, 0}}},
      // The real 129280-token vocabulary at toy width, so `generate` runs end to end with the
      // real tokenizer (the text is meaningless: the weights are random).
      {"demo",
       {.vocab = 129280, .dim = 128, .n_layers = 4, .n_heads = 2, .head_dim = 128, .rope_dim = 64,
        .q_lora = 64, .o_groups = 1, .o_lora = 64, .n_experts = 4, .n_active = 2,
        .moe_inter = 64, .n_hash = 1, .window = 16, .index_heads = 2, .index_dim = 128,
        .index_topk = 4, .compress_ratios = {0, 4, 16, 4, 0}}},
      // Benchmark proxy: the real V4-Flash layer dimensions with 4 layers (window, CSA, HCA,
      // CSA) and 32 experts, so it fits in a few GB; one MTP block as V4-Flash has (what a
      // draft costs: `bench --draft`).
      {"flash-proxy",
       {.vocab = 129280, .dim = 4096, .n_layers = 4, .n_heads = 64, .head_dim = 512, .rope_dim = 64,
        .q_lora = 1024, .o_groups = 8, .o_lora = 1024, .n_experts = 32, .n_active = 6,
        .moe_inter = 2048, .n_hash = 1, .window = 128, .index_heads = 64, .index_dim = 128,
        .index_topk = 512, .compress_ratios = {0, 4, 128, 4, 0}, .route_scale = 1.5}},
  };
  return table;
}

ModelConfig config_from(const PresetDims& p) {
  ModelConfig c;
  c.vocab = p.vocab;
  c.dim = p.dim;
  c.n_layers = p.n_layers;
  c.n_heads = p.n_heads;
  c.head_dim = p.head_dim;
  c.rope_dim = p.rope_dim;
  c.q_lora = p.q_lora;
  c.o_groups = p.o_groups;
  c.o_lora = p.o_lora;
  c.window = p.window;
  c.compress_ratios = p.compress_ratios;
  c.n_experts = p.n_experts;
  c.n_active = p.n_active;
  c.n_shared = 1;
  c.moe_inter = p.moe_inter;
  c.n_hash = p.n_hash;
  c.hc = 4;
  c.sinkhorn_iters = 20;
  c.index_heads = p.index_heads;
  c.index_dim = p.index_dim;
  c.index_topk = p.index_topk;
  c.n_mtp = p.n_mtp;
  c.eps = 1e-6;
  c.hc_eps = 1e-6;
  c.route_scale = p.route_scale;
  c.swiglu_limit = 10.0;
  c.rope_theta = 10000.0;
  c.compress_rope_theta = 160000.0;
  c.yarn_factor = 16.0;
  c.yarn_original = 65536;
  c.yarn_beta_fast = 32.0;
  c.yarn_beta_slow = 1.0;
  c.max_positions = 1048576;
  c.bos = 0;
  c.eos = 1;
  return c;
}

std::string preset_names() {
  std::string s;
  for (const Preset& p : presets()) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Deterministic random numbers (core/rng.h), one stream per tensor name; normals by Box-Muller.

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001B3ull;
  return h;
}

// bf16 precision, kept as float: see the file comment for why every drawn value passes here.
float snap(double v) { return bf16_to_f32(f32_to_bf16(static_cast<float>(v))); }

class Rng {
 public:
  Rng(uint64_t seed, const std::string& stream) { xoshiro256_seed(s_, splitmix64(seed) ^ fnv1a(stream)); }

  uint64_t next() { return xoshiro256_next(s_); }
  double uniform() { return xoshiro256_uniform(s_); }

  // Uniform integer in [0, n) without modulo bias.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next();
    while (x >= limit);
    return x % n;
  }

  double normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double a = 2.0 * std::numbers::pi * u2;
    spare_ = r * std::sin(a);
    have_spare_ = true;
    return r * std::cos(a);
  }

 private:
  uint64_t s_[4];
  double spare_ = 0.0;
  bool have_spare_ = false;
};

// ---------------------------------------------------------------------------------------------
// Little-endian payload encoders (explicit byte order, independent of the host).

std::vector<uint8_t> bytes_bf16(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = f32_to_bf16(v[i]);
    out[2 * i] = static_cast<uint8_t>(h);
    out[2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
  return out;
}

void put_u32(uint8_t* p, uint32_t x) {
  for (int b = 0; b < 4; ++b) p[b] = static_cast<uint8_t>(x >> (8 * b));
}

std::vector<uint8_t> bytes_f32(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  for (size_t i = 0; i < v.size(); ++i) put_u32(&out[4 * i], std::bit_cast<uint32_t>(v[i]));
  return out;
}

std::vector<uint8_t> bytes_i64(const std::vector<int64_t>& v) {
  std::vector<uint8_t> out(v.size() * 8);
  for (size_t i = 0; i < v.size(); ++i)
    for (int b = 0; b < 8; ++b) out[8 * i + b] = static_cast<uint8_t>(static_cast<uint64_t>(v[i]) >> (8 * b));
  return out;
}

// E8M0 byte of a power of two.
uint8_t e8m0_of(float pow2) { return static_cast<uint8_t>(std::ilogb(pow2) + 127); }

float amax_of(const float* x, size_t n, size_t stride = 1) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i * stride]));
  return m;
}

// Keeps block scales inside the normal E8M0 range for an all-zero block.
constexpr float kTinyAmax = 0x1.0p-100f;

struct Quantized {
  std::vector<uint8_t> data, scale;
};

// FP8 e4m3 with one power-of-two scale per 128x128 block (the official linear format).
Quantized quant_fp8_block(const std::vector<float>& w, int64_t rows, int64_t cols) {
  constexpr int64_t B = 128;
  const int64_t sr = (rows + B - 1) / B, sc = (cols + B - 1) / B;
  Quantized q{std::vector<uint8_t>(w.size()), std::vector<uint8_t>(sr * sc)};
  for (int64_t br = 0; br < sr; ++br) {
    for (int64_t bc = 0; bc < sc; ++bc) {
      const int64_t r0 = br * B, r1 = std::min(rows, r0 + B), c0 = bc * B, c1 = std::min(cols, c0 + B);
      float amax = kTinyAmax;
      for (int64_t r = r0; r < r1; ++r) amax = std::max(amax, amax_of(&w[r * cols + c0], c1 - c0));
      const float scale = pow2_ceil(amax / 448.0f);
      q.scale[br * sc + bc] = e8m0_of(scale);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) q.data[r * cols + c] = f32_to_e4m3(w[r * cols + c] / scale);
    }
  }
  return q;
}

// Two E2M1 codes per byte, the even column in the low nibble.
void pack_e2m1(uint8_t* dst, int64_t col, uint8_t code) {
  if (col % 2 == 0)
    dst[col / 2] = static_cast<uint8_t>((dst[col / 2] & 0xF0) | code);
  else
    dst[col / 2] = static_cast<uint8_t>((dst[col / 2] & 0x0F) | (code << 4));
}

// MXFP4: per row, one power-of-two E8M0 scale per 32 columns.
Quantized quant_mxfp4(const std::vector<float>& w, int64_t rows, int64_t cols) {
  constexpr int64_t B = 32;
  Quantized q{std::vector<uint8_t>(rows * cols / 2), std::vector<uint8_t>(rows * cols / B)};
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = &w[r * cols];
    for (int64_t b = 0; b < cols / B; ++b) {
      const float scale = pow2_ceil(std::max(kTinyAmax, amax_of(x + b * B, B)) / 6.0f);
      q.scale[r * (cols / B) + b] = e8m0_of(scale);
      for (int64_t c = b * B; c < (b + 1) * B; ++c) pack_e2m1(&q.data[r * cols / 2], c, f32_to_e2m1(x[c] / scale));
    }
  }
  return q;
}

struct NvQuantized {
  Quantized q;     // data + e4m3 block scales
  float scale2;    // weight_scale_2
};

// NVFP4 as ModelOpt writes it: a global f32 scale maps the tensor amax onto 6 * 448, then one
// E4M3 scale per 16 columns.
NvQuantized quant_nvfp4(const std::vector<float>& w, int64_t rows, int64_t cols) {
  constexpr int64_t B = 16;
  const float scale2 = std::max(kTinyAmax, amax_of(w.data(), w.size())) / (6.0f * 448.0f);
  NvQuantized n{{std::vector<uint8_t>(rows * cols / 2), std::vector<uint8_t>(rows * cols / B)}, scale2};
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = &w[r * cols];
    for (int64_t b = 0; b < cols / B; ++b) {
      const uint8_t sb = f32_to_e4m3(amax_of(x + b * B, B) / 6.0f / scale2);
      n.q.scale[r * (cols / B) + b] = sb;
      const float scale = e4m3_to_f32(sb) * scale2;
      // A block too small for the smallest e4m3 scale is stored as zeros rather than divided by 0.
      for (int64_t c = b * B; c < (b + 1) * B; ++c)
        pack_e2m1(&n.q.data[r * cols / 2], c, scale > 0.0f ? f32_to_e2m1(x[c] / scale) : 0);
    }
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// Checkpoint generation.

enum class Format { Native, NVFP4, HFBF16 };

Format parse_format(const std::string& s) {
  if (s == "native") return Format::Native;
  if (s == "nvfp4") return Format::NVFP4;
  if (s == "hf-bf16") return Format::HFBF16;
  throw Error("make_tiny: unknown format '" + s + "' (valid: native, nvfp4, hf-bf16)");
}

// How one linear weight is stored.
enum class Enc { BF16, FP8, MXFP4, NVFP4 };

// Writes the tensors of the one list (model/tensors.h) in its order: the list says which tensors
// exist, their names, shapes and how the releases store them; this class only chooses the
// encoding per format and draws the values.
class Builder {
 public:
  Builder(const ModelConfig& c, Format f, uint64_t seed) : c_(c), fmt_(f), seed_(seed) {}

  const SafeTensorsWriter& build() {
    for_each_tensor(c_, [this](const TensorDesc& t) { emit(t); });
    return w_;
  }

 private:
  void emit(const TensorDesc& t) {
    switch (t.kind()) {
      case TensorKind::Linear: linear(t); break;
      case TensorKind::Floats: small(t); break;
      case TensorKind::Ids: put(t.name, DType::I64, t.shape, bytes_i64(hash_table(t))); break;
    }
  }

  // --- value streams (keyed by the native name, see the file comment)
  std::vector<float> normal(const std::string& key, int64_t n, double std, double mean = 0.0) {
    Rng rng(seed_, key);
    std::vector<float> v(n);
    for (float& x : v) x = snap(mean + std * rng.normal());
    return v;
  }
  std::vector<float> uniform(const std::string& key, int64_t n, double lo, double hi) {
    Rng rng(seed_, key);
    std::vector<float> v(n);
    for (float& x : v) x = snap(lo + (hi - lo) * rng.uniform());
    return v;
  }

  // --- emitting
  void put(const std::string& native, DType dt, Shape shape, std::vector<uint8_t> bytes) {
    const std::string name = fmt_ == Format::HFBF16 ? layout_tensor_name(Layout::HF, native) : native;
    w_.add(name, dt, std::move(shape), std::move(bytes));
  }
  void f32(const std::string& name, Shape shape, const std::vector<float>& v) {
    put(name, DType::F32, std::move(shape), bytes_f32(v));
  }

  // The encoding of a linear in this format.
  Enc encoding(const TensorDesc& t) const {
    switch (t.stored) {
      case Stored::DenseLinear: return fmt_ == Format::HFBF16 ? Enc::BF16 : Enc::FP8;
      case Stored::ExpertLinear:
        if (fmt_ == Format::HFBF16) return Enc::BF16;
        return fmt_ == Format::NVFP4 && !t.mtp ? Enc::NVFP4 : Enc::MXFP4;  // the NVIDIA release keeps MTP in MXFP4
      default: return Enc::BF16;
    }
  }

  // A linear weight [out, in] ~ N(0, gain^2/in): unit-variance inputs give unit-variance outputs
  // (times gain); the embedding ~ N(0, 1).
  void linear(const TensorDesc& t) {
    const int64_t out = t.shape[0], in = t.shape[1];
    const std::string base = t.base(), wn = t.name;
    const Enc enc = encoding(t);
    if ((enc == Enc::MXFP4 || enc == Enc::NVFP4) && in % 32 != 0)
      throw Error("make_tiny: " + wn + " has " + std::to_string(in) + " inputs; FP4 experts need a multiple of 32");
    double std = 1.0;
    if (t.role != Role::Embedding) {
      double gain = 1.0;
      if (t.role == Role::ExpertUp || t.role == Role::ExpertDown) {
        const double g = expert_gain(base.substr(0, base.rfind('.') + 1) + "gain");
        gain = t.role == Role::ExpertUp ? g : 1.0 / (g * g);
      }
      std = gain / std::sqrt(static_cast<double>(in));
    }
    const std::vector<float> v = normal(wn, out * in, std);
    switch (enc) {
      case Enc::BF16:
        put(wn, DType::BF16, {out, in}, bytes_bf16(v));
        break;
      case Enc::FP8: {
        Quantized q = quant_fp8_block(v, out, in);
        put(wn, DType::F8_E4M3, {out, in}, std::move(q.data));
        put(base + ".scale", DType::F8_E8M0, {(out + 127) / 128, (in + 127) / 128}, std::move(q.scale));
        break;
      }
      case Enc::MXFP4: {
        Quantized q = quant_mxfp4(v, out, in);
        put(wn, DType::I8, {out, in / 2}, std::move(q.data));
        put(base + ".scale", DType::F8_E8M0, {out, in / 32}, std::move(q.scale));
        break;
      }
      case Enc::NVFP4: {
        NvQuantized n = quant_nvfp4(v, out, in);
        put(wn, DType::U8, {out, in / 2}, std::move(n.q.data));
        put(base + ".weight_scale", DType::F8_E4M3, {out, in / 16}, std::move(n.q.scale));
        put(base + ".weight_scale_2", DType::F32, {}, bytes_f32({n.scale2}));
        // The engine does not quantise activations; any positive value is valid here.
        put(base + ".input_scale", DType::F32, {}, bytes_f32({1.0f / 448.0f}));
        break;
      }
    }
  }

  // Small float tensors: the distribution by role, the dtype from the list.
  void small(const TensorDesc& t) {
    int64_t n = 1;
    for (int64_t s : t.shape) n *= s;
    std::vector<float> v;
    switch (t.role) {
      // RMSNorm weights near 1 so activations keep their scale through every layer.
      case Role::Norm: v = normal(t.name, n, 0.1, 1.0); break;
      case Role::MixFn: v = normal(t.name, n, hc_fn_std()); break;
      case Role::MixBase:
        v = normal(t.name, n, 0.5);
        // Bias the residual mixing matrix towards identity so the hc copies stay distinct.
        for (int64_t i = 0; i < c_.hc; ++i) v[2 * c_.hc + i * c_.hc + i] += 2.0f;
        break;
      case Role::HeadBase: v = normal(t.name, n, 0.5); break;
      case Role::MixScale: v = uniform(t.name, n, 0.5, 1.5); break;
      case Role::Sink:
      case Role::Ape: v = normal(t.name, n, 1.0); break;
      case Role::RouterBias: v = normal(t.name, n, 0.1); break;
      default: throw Error("make_tiny: no value rule for " + t.name);
    }
    if (t.stored == Stored::Bf16)
      put(t.name, DType::BF16, t.shape, bytes_bf16(v));
    else
      f32(t.name, t.shape, v);
  }

  // --- hyper-connections
  // fn scaled so the mixing logits m = (x . fn) * rms^-1 have std ~0.64 at any width.
  double hc_fn_std() const { return 0.64 / std::sqrt(static_cast<double>(c_.hc * c_.dim)); }

  // --- MoE
  // tid2eid [V, k]: k distinct expert ids in [0, E) per token (partial Fisher-Yates).
  std::vector<int64_t> hash_table(const TensorDesc& t) {
    Rng rng(seed_, t.name);
    const int64_t V = t.shape[0], k = t.shape[1], E = t.limit;
    std::vector<int64_t> out;
    out.reserve(V * k);
    std::vector<int64_t> ids(E);
    for (int64_t tok = 0; tok < V; ++tok) {
      for (int64_t e = 0; e < E; ++e) ids[e] = e;
      for (int64_t j = 0; j < k; ++j) {
        std::swap(ids[j], ids[j + static_cast<int64_t>(rng.below(E - j))]);
        out.push_back(ids[j]);
      }
    }
    return out;
  }
  // Per-expert gain, log-uniform in [0.5, 6]: w1/w3 scale by g and w2 by 1/g^2, so an expert's
  // output stays O(1) while large-gain experts drive the gate past the SwiGLU clamp.
  double expert_gain(const std::string& key) {
    Rng rng(seed_, key);
    return snap(0.5 * std::exp(std::log(12.0) * rng.uniform()));
  }

  const ModelConfig& c_;
  Format fmt_;
  uint64_t seed_;
  SafeTensorsWriter w_;
};

// ---------------------------------------------------------------------------------------------
// config.json / hf_quant_config.json

nlohmann::json fp8_quant_config() {
  return {{"quant_method", "fp8"},
          {"fmt", "e4m3"},
          {"scale_fmt", "ue8m0"},
          {"activation_scheme", "dynamic"},
          {"weight_block_size", {128, 128}}};
}

// The modules ModelOpt leaves out of NVFP4 in the NVIDIA release (everything but routed experts).
const nlohmann::json& nvfp4_excluded() {
  static const nlohmann::json ex = {"*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"};
  return ex;
}

const nlohmann::json& modelopt_producer() {
  static const nlohmann::json p = {{"name", "modelopt"}, {"version", "dsv4-make-tiny"}};
  return p;
}

// The NVIDIA release's quantization_config: the FP8 keys plus ModelOpt's description.
nlohmann::json nvfp4_quant_config(const ModelConfig& c) {
  nlohmann::json q = fp8_quant_config();
  q["quant_algo"] = "MIXED_PRECISION";
  q["moe_quant_algo"] = "NVFP4";
  q["group_size"] = 16;
  q["kv_cache_quant_algo"] = nullptr;
  q["producer"] = modelopt_producer();
  q["ignore"] = nvfp4_excluded();
  nlohmann::json layers = nlohmann::json::object();
  for (int64_t l = 0; l < c.n_layers; ++l)
    layers["layers." + std::to_string(l) + ".ffn.experts"] = {{"quant_algo", "NVFP4"}, {"group_size", 16}};
  q["quantized_layers"] = layers;
  const nlohmann::json fp4 = {{"num_bits", 4}, {"type", "float"}, {"group_size", 16},
                              {"strategy", "tensor_group"}, {"symmetric", true}};
  nlohmann::json weights = fp4, acts = fp4;
  weights["dynamic"] = false;
  acts["dynamic"] = "local";
  q["config_groups"] = {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", acts}}}};
  return q;
}

nlohmann::json hf_quant_config() {
  return {{"producer", modelopt_producer()},
          {"quantization",
           {{"quant_algo", "NVFP4"},
            {"group_size", 16},
            {"kv_cache_quant_algo", nullptr},
            {"exclude_modules", nvfp4_excluded()}}}};
}

void write_json(const std::filesystem::path& path, const nlohmann::json& j) {
  std::ofstream f(path, std::ios::binary);
  f << j.dump(2) << "\n";
  if (!f) throw Error("make_tiny: cannot write " + path.string());
}

}  // namespace

ModelConfig tiny_preset(const std::string& preset) {
  for (const Preset& p : presets())
    if (preset == p.name) return config_from(p.dims);
  throw Error("make_tiny: unknown preset '" + preset + "' (valid: " + preset_names() + ")");
}

static void remove_previous_checkpoint(const std::string& out_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(out_dir, ec)) return;
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string n = e.path().filename().string();
    const bool shard = n.rfind("model", 0) == 0 && n.size() > 12 && n.ends_with(".safetensors");
    if (shard || n == "model.safetensors.index.json" || n == "config.json" || n == "hf_quant_config.json" ||
        n == "tokenizer.json" || n == "tokenizer_config.json")
      fs::remove(e.path());
  }
}

// The tokenizer files travel with the model so `generate --model DIR` finds them.
static void copy_tokenizer(const std::string& from, const std::filesystem::path& to) {
  namespace fs = std::filesystem;
  if (from.empty()) return;
  const fs::path src = fs::is_directory(from) ? fs::path(from) / "tokenizer.json" : fs::path(from);
  if (!fs::exists(src)) throw Error("make_tiny: no tokenizer.json at " + src.string());
  fs::copy_file(src, to / "tokenizer.json", fs::copy_options::overwrite_existing);
  const fs::path cfg = src.parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg)) fs::copy_file(cfg, to / "tokenizer_config.json", fs::copy_options::overwrite_existing);
}

void make_tiny(const TinyOptions& opt) {
  const Format fmt = parse_format(opt.format);
  if (opt.shards < 1) throw Error("make_tiny: shards must be >= 1, got " + std::to_string(opt.shards));
  if (opt.out_dir.empty()) throw Error("make_tiny: no output directory given");
  const ModelConfig cfg = tiny_preset(opt.preset);

  // A checkpoint written earlier into the same directory (other shard count, other format)
  // would otherwise mix with this one: remove exactly the files a checkpoint consists of.
  remove_previous_checkpoint(opt.out_dir);
  Builder builder(cfg, fmt, opt.seed);
  builder.build().write(opt.out_dir, opt.shards);

  nlohmann::json j = config_to_json(cfg);
  if (fmt != Format::HFBF16) {
    j["quantization_config"] = fmt == Format::NVFP4 ? nvfp4_quant_config(cfg) : fp8_quant_config();
    j["expert_dtype"] = "fp4";
  }
  const std::filesystem::path dir(opt.out_dir);
  write_json(dir / "config.json", j);
  if (fmt == Format::NVFP4) write_json(dir / "hf_quant_config.json", hf_quant_config());
  copy_tokenizer(opt.tokenizer_dir, dir);
}

}  // namespace dsv4
