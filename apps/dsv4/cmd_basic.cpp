// dsv4 score / make-tiny / inspect.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "args.h"
#include "device.h"
#include "engine/score.h"
#include "tools/bench.h"
#include "tools/inspect.h"
#include "tools/make_tiny.h"
#include "tools/npy.h"

namespace dsv4::cli {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  for (;;) {
    size_t j = s.find(',', i);
    out.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) return out;
    i = j + 1;
  }
}

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
  const std::string dir = a.str("model");
  std::vector<std::string> token_args = a.all("tokens"), outs = a.all("out");
  const std::string mtp_out = a.str("mtp-out", "");
  const bool have_prefill = a.has("prefill");
  const int64_t prefill_arg = a.integer("prefill", 0);
  const int64_t chunk = a.integer("chunk", 0);
  EngineOptions eo;
  eo.model_dir = dir;
  eo.threads = static_cast<int>(a.integer("threads", 0));
  eo.load = load_mode_option(a);
  eo.device = device_option(a);
  eo.memory_budget = memory_budget_option(a);
  eo.parallel = parallel_option(a);
  a.check_all_used();
  if (token_args.empty()) throw Usage("missing required option --tokens");
  if (outs.size() != token_args.size())
    throw Usage("give one --out per --tokens (" + std::to_string(token_args.size()) + " --tokens, " + std::to_string(outs.size()) + " --out)");
  if (!mtp_out.empty() && token_args.size() != 1) throw Usage("--mtp-out takes one sequence (one --tokens)");
  if (chunk < 0) throw Usage("--chunk must be >= 1 (or 0 for all), got " + std::to_string(chunk));
  std::vector<ScoreJob> jobs(token_args.size());
  int64_t total = 0, longest = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    jobs[j].tokens = parse_tokens(token_args[j]);
    const int64_t T = static_cast<int64_t>(jobs[j].tokens.size());
    if (T == 0) throw Usage("--tokens is empty");
    jobs[j].prefill = have_prefill ? prefill_arg : T;
    if (jobs[j].prefill < 0 || jobs[j].prefill > T)
      throw Usage("--prefill must be in [0, " + std::to_string(T) + "], got " + std::to_string(jobs[j].prefill));
    jobs[j].chunk = chunk;
    jobs[j].mtp = !mtp_out.empty();
    if (jobs[j].mtp && T < 2) throw Usage("--mtp-out needs at least 2 tokens");
    total += T;
    longest = std::max(longest, T);
  }
  if (eo.device == Device::Cuda) eo.context = longest;  // the caches are sized for it

  auto t0 = std::chrono::steady_clock::now();
  Engine engine(eo);
  const int64_t V = engine.info().vocab;
  for (size_t j = 0; j < jobs.size(); ++j)
    for (size_t i = 0; i < jobs[j].tokens.size(); ++i)
      if (jobs[j].tokens[i] >= V)
        throw Error("--tokens: token id " + std::to_string(jobs[j].tokens[i]) + " at index " + std::to_string(i) +
                    " is >= vocab_size " + std::to_string(V) + " of " + dir);
  if (!mtp_out.empty() && !engine.info().has_mtp) throw Error("--mtp-out: " + dir + " has no MTP block");
  auto t1 = std::chrono::steady_clock::now();
  score(engine, jobs);
  auto t2 = std::chrono::steady_clock::now();
  for (size_t j = 0; j < jobs.size(); ++j)
    write_npy_f32(outs[j], {static_cast<int64_t>(jobs[j].tokens.size()), V}, jobs[j].logits.data());
  if (!mtp_out.empty()) write_npy_f32(mtp_out, {static_cast<int64_t>(jobs[0].tokens.size()) - 1, V}, jobs[0].mtp_logits.data());

  auto sec = [](auto x, auto y) { return std::chrono::duration<double>(y - x).count(); };
  std::fprintf(stderr, "dsv4 score: %zu sequence%s, %lld tokens on %s, load %.2fs, forward %.2fs -> %s%s%s\n", jobs.size(),
               jobs.size() == 1 ? "" : "s", static_cast<long long>(total), engine.info().device.c_str(), sec(t0, t1), sec(t1, t2),
               outs[0].c_str(), outs.size() > 1 ? ", ..." : "", mtp_out.empty() ? "" : (" (+ MTP " + mtp_out + ")").c_str());
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
  const Parallel par = parallel_option(a);
  const int64_t world = a.integer("world", 1);
  a.check_all_used();
  if (world < 1 || world > 4096) throw Usage("--world must be in [1, 4096], got " + std::to_string(world));
  if (world > 1 && par == Parallel::None) throw Usage("--world needs --parallel ep, tp or ep+tp");
  const bool ep = par == Parallel::Ep || par == Parallel::EpTp, tp = par == Parallel::Tp || par == Parallel::EpTp;
  std::fputs(inspect_model(dir, par == Parallel::None ? 1 : static_cast<int>(world), ep, tp).c_str(), stdout);
  return 0;
}

int cmd_bench(const Args& a) {
  BenchOptions o;
  o.model_dir = a.str("model");
  o.prompt_len = a.integer("prompt-len", 512);
  o.gen = a.integer("gen", 16);
  o.chunk = a.integer("chunk", 0);
  o.threads = static_cast<int>(a.integer("threads", 0));
  o.json = a.flag("json");
  o.profile = a.flag("profile");
  o.load = load_mode_option(a);
  o.device = device_option(a);
  o.memory_budget = memory_budget_option(a);
  o.parallel = parallel_option(a);
  o.batches.clear();
  for (const std::string& b : split_commas(a.str("batch", "1"))) {
    char* end = nullptr;
    const long long v = std::strtoll(b.c_str(), &end, 10);
    if (b.empty() || *end != '\0' || v < 1 || v > 4096) throw Usage("--batch: '" + b + "' is not a batch size (1..4096)");
    o.batches.push_back(v);
  }
  for (const std::string& d : a.has("draft") ? split_commas(a.str("draft")) : std::vector<std::string>{}) {
    char* end = nullptr;
    const long long v = std::strtoll(d.c_str(), &end, 10);
    if (d.empty() || *end != '\0' || v < 1 || v > kCheapRewind)
      throw Usage("--draft: '" + d + "' is not a draft count (1.." + std::to_string(kCheapRewind) + ")");
    o.drafts.push_back(v);
  }
  if (!o.drafts.empty() && std::find(o.batches.begin(), o.batches.end(), 1) == o.batches.end())
    throw Usage("--draft is measured against batch-1 decode: include 1 in --batch");
  if (o.profile && o.device != Device::Cpu) throw Usage("--profile times the CPU backend's matmuls: use it with --device cpu");
  a.check_all_used();
  BenchResult r = run_bench(o);
  std::fputs((o.json ? bench_json(r) + "\n" : bench_table(r)).c_str(), stdout);
  return 0;
}

}  // namespace dsv4::cli
