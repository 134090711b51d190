// dsv4 command-line interface: score, make-tiny, inspect.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threads.h"
#include "io/npy.h"
#include "model/forward.h"
#include "model/score.h"
#include "tools/make_tiny.h"

using namespace dsv4;

namespace {

const char* kHelp = R"(dsv4 - DeepSeek-V4 inference engine (CPU reference backend)

Usage: dsv4 <command> [options]

Commands:
  score       Run the model over a token sequence and write the logits of every position.
      --model DIR        checkpoint directory (config.json + *.safetensors [+ index])
      --tokens LIST      comma-separated token ids, e.g. 5,17,42
      --prefill P        the first P tokens go in as prefill (default: all); the rest are
                         fed one at a time as decode steps
      --chunk C          prefill chunk size (default: all of the prefill in one chunk)
      --threads N        worker threads (default: all cores)
      --out F.npy        output: float32 NumPy array [T, vocab]

  make-tiny   Write a random checkpoint at small dimensions that exercises every layer kind
              (window-only, CSA, HCA, hash-routed MoE, MTP).
      --out DIR          output directory (created)
      --preset NAME      tiny | small | demo (default tiny); demo has the real 129280-token
                         vocabulary so it can be paired with the real tokenizer
      --format F         native | nvfp4 | hf-bf16 (default native)
      --seed S           random seed (default 0)
      --shards N         number of safetensors shards (default 1)
      --tokenizer DIR    copy DIR/tokenizer.json (or a tokenizer.json file) into the model

  inspect     Describe a checkpoint: layout and formats, config summary, layer kinds, bytes
              per dtype.
      --model DIR

  help, --help, -h       this text

Errors print one line to stderr and exit with status 1 (2 for bad usage).
)";

struct Usage : Error {
  using Error::Error;
};

class Args {
 public:
  Args(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) throw Usage("unexpected argument '" + a + "'");
      if (i + 1 >= argc) throw Usage("option " + a + " needs a value");
      kv_[a.substr(2)] = argv[++i];
    }
  }
  bool has(const std::string& k) const { return kv_.count(k) != 0; }
  std::string str(const std::string& k) const {
    auto it = kv_.find(k);
    if (it == kv_.end()) throw Usage("missing required option --" + k);
    used_[k] = true;
    return it->second;
  }
  std::string str(const std::string& k, const std::string& def) const { return has(k) ? str(k) : def; }
  int64_t integer(const std::string& k, int64_t def) const {
    if (!has(k)) return def;
    std::string v = str(k);
    char* end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0') throw Usage("option --" + k + " expects an integer, got '" + v + "'");
    return x;
  }
  void check_all_used() const {
    for (const auto& [k, v] : kv_)
      if (!used_.count(k)) throw Usage("unknown option --" + k);
  }

 private:
  std::map<std::string, std::string> kv_;
  mutable std::map<std::string, bool> used_;
};

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
  a.check_all_used();
  if (T == 0) throw Usage("--tokens is empty");
  if (prefill < 0 || prefill > T) throw Usage("--prefill must be in [0, " + std::to_string(T) + "], got " + std::to_string(prefill));
  if (chunk < 0) throw Usage("--chunk must be >= 1 (or 0 for all), got " + std::to_string(chunk));

  auto t0 = std::chrono::steady_clock::now();
  Model model(load_model(dir));
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
  std::fprintf(stderr, "dsv4 score: %lld tokens (%lld prefill, %lld decode), load %.2fs, forward %.2fs -> %s\n",
               static_cast<long long>(T), static_cast<long long>(prefill), static_cast<long long>(T - prefill), sec(t0, t1),
               sec(t1, t2), out.c_str());
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
  ModelWeights w = load_model(dir);
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
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kHelp, stderr);
    return 2;
  }
  std::string cmd = argv[1];
  try {
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
      std::fputs(kHelp, stdout);
      return 0;
    }
    for (int i = 2; i < argc; ++i)
      if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
        std::fputs(kHelp, stdout);
        return 0;
      }
    Args args(argc, argv, 2);
    if (cmd == "score") return cmd_score(args);
    if (cmd == "make-tiny") return cmd_make_tiny(args);
    if (cmd == "inspect") return cmd_inspect(args);
    throw Usage("unknown command '" + cmd + "' (try dsv4 --help)");
  } catch (const Usage& e) {
    std::fprintf(stderr, "dsv4: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
    return 1;
  }
}
