// dsv4 score / make-tiny / inspect.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "args.h"
#include "device.h"
#include "core/threads.h"
#include "io/npy.h"
#include "model/forward.h"
#include "model/score.h"
#include "model/tensors.h"
#include "tools/bench.h"
#include "tools/make_tiny.h"

namespace dsv4::cli {

std::vector<int32_t> parse_tokens(const std::string& s) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    while (!tok.empty() && (tok.back() == ' ' || tok.back() == '\n' || tok.back() == '\r')) tok.pop_back();
    while (!tok.empty() && tok.front() == ' ') tok.erase(tok.begin());
    if (tok.empty()) {
      if (j == s.size() && !out.empty() && i == j) break;  // trailing comma
      throw Usage("--tokens: empty entry at position " + std::to_string(out.size()));
    }
    char* end = nullptr;
    long long v = std::strtoll(tok.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > 0x7fffffff) throw Usage("--tokens: '" + tok + "' is not a token id");
    out.push_back(static_cast<int32_t>(v));
    i = j + 1;
  }
  return out;
}

int cmd_score(const Args& a) {
  const std::string dir = a.str("model"), out = a.str("out");
  std::vector<int32_t> tokens = parse_tokens(a.str("tokens"));
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t prefill = a.integer("prefill", T);
  const int64_t chunk = a.integer("chunk", 0);
  set_threads(static_cast<int>(a.integer("threads", 0)));
  const LoadMode load = load_mode_option(a);
  const Device device = device_option(a);
  a.check_all_used();
  if (T == 0) throw Usage("--tokens is empty");
  if (prefill < 0 || prefill > T) throw Usage("--prefill must be in [0, " + std::to_string(T) + "], got " + std::to_string(prefill));
  if (chunk < 0) throw Usage("--chunk must be >= 1 (or 0 for all), got " + std::to_string(chunk));

  auto t0 = std::chrono::steady_clock::now();
  Model model = make_model(load_model(dir, load), device, T);
  const int64_t V = model.config().vocab;
  for (int64_t i = 0; i < T; ++i)
    if (tokens[i] >= V)
      throw Error("--tokens: token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                  " is >= vocab_size " + std::to_string(V) + " of " + dir);
  auto t1 = std::chrono::steady_clock::now();

  std::vector<float> logits = score_tokens(model, tokens, prefill, chunk);
  auto t2 = std::chrono::steady_clock::now();
  write_npy_f32(out, {T, V}, logits.data());

  auto sec = [](auto x, auto y) { return std::chrono::duration<double>(y - x).count(); };
  std::fprintf(stderr, "dsv4 score: %lld tokens (%lld prefill, %lld decode) on %s, load %.2fs, forward %.2fs -> %s\n",
               static_cast<long long>(T), static_cast<long long>(prefill), static_cast<long long>(T - prefill), model.device(),
               sec(t0, t1), sec(t1, t2), out.c_str());
  return 0;
}

int cmd_make_tiny(const Args& a) {
  TinyOptions o;
  o.out_dir = a.str("out");
  o.preset = a.str("preset", "tiny");
  o.format = a.str("format", "native");
  o.seed = static_cast<uint64_t>(a.integer("seed", 0));
  o.shards = static_cast<int>(a.integer("shards", 1));
  o.tokenizer_dir = a.str("tokenizer", "");
  a.check_all_used();
  make_tiny(o);
  std::fprintf(stderr, "dsv4 make-tiny: wrote %s (preset %s, format %s, seed %llu, %d shard%s)\n", o.out_dir.c_str(),
               o.preset.c_str(), o.format.c_str(), static_cast<unsigned long long>(o.seed), o.shards, o.shards == 1 ? "" : "s");
  return 0;
}

int cmd_inspect(const Args& a) {
  const std::string dir = a.str("model");
  a.check_all_used();
  ModelWeights w = load_model(dir, LoadMode::Mmap);  // looks at headers only
  const ModelConfig& c = w.cfg;
  std::printf("model:     %s\n", dir.c_str());
  std::printf("format:    %s\n", w.format_summary().c_str());
  std::printf("files:     %zu safetensors file(s)\n", w.store.files().size());
  std::printf("config:    vocab %lld, hidden %lld, layers %lld, heads %lld x %lld (rope %lld), q_lora %lld, o %lldx%lld\n",
              (long long)c.vocab, (long long)c.dim, (long long)c.n_layers, (long long)c.n_heads, (long long)c.head_dim,
              (long long)c.rope_dim, (long long)c.q_lora, (long long)c.o_groups, (long long)c.o_lora);
  std::printf("           window %lld, experts %lld (top %lld, inter %lld, hash layers %lld), hc %lld, index %lldx%lld top %lld, mtp %lld\n",
              (long long)c.window, (long long)c.n_experts, (long long)c.n_active, (long long)c.moe_inter, (long long)c.n_hash,
              (long long)c.hc, (long long)c.index_heads, (long long)c.index_dim, (long long)c.index_topk, (long long)c.n_mtp);
  std::printf("layers:\n");
  for (int64_t l = 0; l < c.n_layers; ++l)
    std::printf("  %3lld  %-9s %s\n", (long long)l, c.layer_kind(l).c_str(), w.layers[l].hash ? "hash-routed" : "score-routed");
  if (w.mtp) std::printf("  mtp  %-9s score-routed\n", c.layer_kind(c.n_layers).c_str());
  std::printf("KV cache (FP8 + scale per 64 for non-RoPE dims, F32 RoPE dims; FP4 indexer keys):\n");
  std::map<int64_t, bool> kinds;
  for (int64_t l = 0; l < c.n_layers; ++l) kinds[c.ratio(l)] = true;
  for (const auto& [ratio, _] : kinds) {
    CacheCost k = layer_cache_cost(c, ratio);
    std::printf("  %-9s %8.1f bytes/token + %zu bytes fixed (window ring, compressor rows)\n",
                ratio == 0 ? "window" : ratio == 4 ? "CSA(4)" : ("HCA(" + std::to_string(ratio) + ")").c_str(), k.bytes_per_token,
                k.fixed_bytes);
  }
  std::map<std::string, std::pair<size_t, size_t>> by_dtype;
  size_t total = 0;
  for (const auto& f : w.store.files())
    for (const auto& [name, t] : f->tensors()) {
      auto& e = by_dtype[dtype_name(t.dtype)];
      e.first += 1;
      e.second += t.nbytes;
      total += t.nbytes;
    }
  std::printf("bytes per dtype:\n");
  for (const auto& [k, v] : by_dtype) std::printf("  %-8s %6zu tensors %14zu bytes\n", k.c_str(), v.first, v.second);
  std::printf("  total    %14zu bytes\n", total);
  // What the engine holds, from the tensor list: linears in their stored form (what a backend
  // uploads), small tensors converted to 4-byte values.
  const WeightBytes held = weight_bytes(w);
  std::printf("weights by part (linears as stored, small tensors as 4-byte values):\n");
  std::printf("  %-15s %7s %14s %7s %14s\n", "part", "tensors", "bytes", "MTP", "MTP bytes");
  for (int p = 0; p < kNumParts; ++p) {
    const WeightBytes::Row &m = held.main[p], &t = held.mtp[p];
    if (m.tensors + t.tensors == 0) continue;
    std::printf("  %-15s %7zu %14zu %7zu %14zu\n", part_name(static_cast<Part>(p)), m.tensors, m.bytes, t.tensors, t.bytes);
  }
  std::printf("  %-15s %7s %14zu %7s %14zu\n", "total", "", held.main_bytes(), "", held.mtp_bytes());
  return 0;
}

int cmd_bench(const Args& a) {
  BenchOptions o;
  o.model_dir = a.str("model");
  o.prompt_len = a.integer("prompt-len", 512);
  o.gen = a.integer("gen", 16);
  o.threads = static_cast<int>(a.integer("threads", 0));
  o.json = a.flag("json");
  o.profile = a.flag("profile");
  o.load = load_mode_option(a);
  const Device device = device_option(a);
  if (o.profile && device != Device::Cpu) throw Usage("--profile times the CPU backend's matmuls: use it with --device cpu");
  a.check_all_used();
  if (device == Device::Cuda) {
    o.device = "cuda";
    o.make_model = [&o](ModelWeights w) { return make_model(std::move(w), Device::Cuda, o.prompt_len + o.gen); };
  }
  BenchResult r = run_bench(o);
  std::fputs((o.json ? bench_json(r) + "\n" : bench_table(r)).c_str(), stdout);
  return 0;
}

}  // namespace dsv4::cli
