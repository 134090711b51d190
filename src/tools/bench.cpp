#include "tools/bench.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/threads.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "kernels/cpu/qmatmul.h"
#include "model/weights.h"
#include "backends/cpu/ops.h"
#include "tools/roofline.h"

namespace dsv4 {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Peak RSS since the last reset_peak_rss() (Linux VmHWM), in MB; getrusage as a fallback.
double peak_rss_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

std::vector<BenchProfileRow> take_profile() {
  std::vector<BenchProfileRow> out;
  for (const MatmulProfileRow& p : take_matmul_profile()) out.push_back({p.what, p.calls, p.seconds, p.weight_bytes, p.flops});
  return out;
}

std::vector<BenchStageRow> take_stages() {
  std::vector<BenchStageRow> out;
  for (const StageProfileRow& p : take_stage_profile()) out.push_back({p.what, p.calls, p.seconds});
  return out;
}

// The bandwidth probe's buffer must not count as the model's memory: reset the high-water mark.
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

// The per-draft acceptance rate a at which n drafts give `cost` tokens per step (see
// BenchResult::DraftRow), by bisection; 0 when the step costs no more than a plain one, 2 when
// even a = 1 (n + 1 tokens) falls short.
double break_even_rate(int64_t n, double cost) {
  auto tokens = [n](double a) {
    double t = 0, p = 1;
    for (int64_t k = 0; k <= n; ++k, p *= a) t += p;
    return t;
  };
  if (cost <= 1) return 0;
  if (tokens(1.0) < cost) return 2;
  double lo = 0, hi = 1;
  for (int i = 0; i < 60; ++i) (tokens((lo + hi) / 2) < cost ? lo : hi) = (lo + hi) / 2;
  return hi;
}

// BenchOptions::drafts: an MTP sequence prefilled with the same prompt, then per draft count a
// fork of it decodes o.gen greedy speculative steps the way `generate --draft` does (draft,
// one step scoring the fed token and the drafts, check_drafts, rewind what was not confirmed).
template <class Prefill>
void measure_drafts(Engine& engine, const BenchOptions& o, Prefill& prefill, int32_t first, BenchResult& r) {
  const int64_t V = engine.info().vocab, context = engine.info().context;
  const double plain_step_s = r.decode_s / static_cast<double>(o.gen);  // batch 1 (checked up front)
  std::fprintf(stderr, "bench: prefill %lld tokens of a sequence with the MTP block in step...\n",
               static_cast<long long>(o.prompt_len));
  SequenceOptions so;
  so.mtp = true;
  so.max_positions = std::min(context, o.prompt_len + 1);
  Sequence mseq = engine.new_sequence(so);
  prefill(mseq);
  Sampler greedy(SamplingParams{});
  const std::vector<int32_t> no_history;
  for (int64_t n : o.drafts) {
    std::fprintf(stderr, "bench: decode %lld speculative steps of %lld drafts...\n", static_cast<long long>(o.gen),
                 static_cast<long long>(n));
    Sequence f = engine.fork(mseq, std::min(context, mseq.pos() + o.gen * (n + 1) + 1));
    BenchResult::DraftRow row;
    row.n = n;
    int32_t next = first;
    int64_t tokens = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < o.gen; ++i) {
      const auto td = std::chrono::steady_clock::now();
      const std::vector<int32_t> drafts = engine.draft({{&f, next, n}})[0];
      row.draft_s += seconds_since(td);
      StepRequest req;
      req.seq = &f;
      req.tokens = {next};
      req.tokens.insert(req.tokens.end(), drafts.begin(), drafts.end());
      req.logits = Rows::All;
      const int64_t base = f.pos();
      const std::vector<float> logits = std::move(engine.step({req})[0].logits);
      const int64_t used = check_drafts([&](const float* row) { return greedy.sample(row, V, no_history); }, logits.data(), V,
                                        drafts, [&](int32_t pick, int64_t) {
        next = pick;
        return true;
      });
      if (f.pos() > base + used) engine.truncate(f, base + used);
      tokens += used;
      row.drafted += n;
      row.accepted += used - 1;
    }
    const double s = seconds_since(t0);
    row.step_s = s / static_cast<double>(o.gen);
    row.draft_s /= static_cast<double>(o.gen);
    row.tok_s = static_cast<double>(tokens) / s;
    row.cost = row.step_s / plain_step_s;
    row.break_even = break_even_rate(n, row.cost);
    r.draft_rows.push_back(row);
  }
}

}  // namespace

BenchResult run_bench(const BenchOptions& o) {
  if (o.prompt_len < 1) throw Error("bench: --prompt-len must be >= 1");
  if (o.chunk < 0) throw Error("bench: --chunk must be >= 0 (0 = the whole prompt in one step)");
  if (o.gen < 1) throw Error("bench: --gen must be >= 1");
  set_threads(o.threads);
  BenchResult r;
  r.threads = thread_pool().size();
  r.prompt_len = o.prompt_len;
  r.gen = o.gen;
  r.isa = isa_name(active_isa());

  const bool cpu = o.device == Device::Cpu;
  r.device = cpu ? "cpu" : "cuda";
  for (int64_t b : o.batches)
    if (b < 1) throw Error("bench: --batch sizes must be >= 1, got " + std::to_string(b));
  for (int64_t n : o.drafts)
    if (n < 1 || n > kCheapRewind)
      throw Error("bench: --draft counts must be in [1, " + std::to_string(kCheapRewind) + "], got " + std::to_string(n));
  if (!o.drafts.empty() && std::find(o.batches.begin(), o.batches.end(), 1) == o.batches.end())
    throw Error("bench: --draft is measured against batch-1 decode: include 1 in --batch");
  // A wrong --model is told at once, not after the limits' ~10 s of measuring.
  (void)load_model_config(o.model_dir);
  if (cpu) {
    std::fprintf(stderr, "bench: measuring memory bandwidth and FMA peak (%d threads, %s)...\n", r.threads, r.isa.c_str());
    r.mem_bw_gb_s = measure_read_bandwidth(size_t{1} << 30, 5);
    r.peak_gflop_s = measure_peak_gflops(5);
  }
  reset_peak_rss();

  EngineOptions eo;
  eo.model_dir = o.model_dir;
  eo.load = o.load;
  eo.device = o.device;
  eo.threads = o.threads;
  eo.memory_budget = o.memory_budget;
  eo.parallel = o.parallel;
  // The device caches are sized for the context: batch 1 continues the prompt's sequence and
  // every later batch forks it where the last one left it.
  if (!cpu) eo.context = o.prompt_len + o.gen * static_cast<int64_t>(o.batches.size()) + 1;
  Engine engine(eo);
  const ModelInfo& info = engine.info();
  r.load = info.load;
  r.world = info.world;
  r.parallel = info.parallel;
  r.mapped_weights_mb = info.weight_bytes / (1024.0 * 1024.0);
  const int64_t V = info.vocab;
  if (!o.drafts.empty() && !info.has_mtp) throw Error(info.dir + " has no MTP block to draft with", ErrorKind::Unsupported);

  // Deterministic pseudo-random prompt (avoids special ids 0/1).
  uint64_t x = 0x9e3779b97f4a7c15ull;
  auto next_random = [&]() {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return static_cast<int32_t>(2 + x % static_cast<uint64_t>(V - 2));
  };
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt_len));
  for (auto& t : prompt) t = next_random();
  std::fprintf(stderr, "bench: prefill %lld tokens...\n", static_cast<long long>(o.prompt_len));
  SequenceOptions so;
  // Batch 1 continues this sequence (once per batch-1 row); forks reserve their own steps.
  so.max_positions = std::min(info.context, o.prompt_len + o.gen * static_cast<int64_t>(o.batches.size()));
  Sequence seq = engine.new_sequence(so);
  const bool profile = o.profile && cpu;
  set_matmul_profiling(profile);
  take_matmul_profile();  // start the prefill's period
  take_stage_profile();
  MatmulCounters before = matmul_counters();
  auto t0 = std::chrono::steady_clock::now();
  // As generation does: one step, or chunks of o.chunk (long prompts: a step's activations grow
  // with its tokens).
  const int64_t chunk = o.chunk > 0 ? o.chunk : o.prompt_len;
  auto prefill = [&](Sequence& sq) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<StepResult> out;
    for (int64_t p = 0; p < o.prompt_len; p += chunk) {
      const int64_t e = std::min(o.prompt_len, p + chunk);
      out = engine.step({{&sq, std::vector<int32_t>(prompt.begin() + p, prompt.begin() + e), e == o.prompt_len ? Rows::Last : Rows::None}});
      if (e < o.prompt_len)  // long prompts take minutes: say how far
        std::fprintf(stderr, "bench: prefill %lld / %lld tokens, %.1f tok/s so far\n", static_cast<long long>(e),
                     static_cast<long long>(o.prompt_len), static_cast<double>(e) / seconds_since(start));
    }
    return out;
  };
  std::vector<StepResult> res = prefill(seq);
  double prefill_s = seconds_since(t0);
  MatmulCounters mid = matmul_counters();
  if (profile) r.prefill_profile = take_profile(), r.prefill_stages = take_stages();
  r.prefill_tok_s = static_cast<double>(o.prompt_len) / prefill_s;
  r.prefill_flops_per_token = static_cast<double>(mid.flops - before.flops) / static_cast<double>(o.prompt_len);
  auto argmax = [V](const float* l) { return static_cast<int32_t>(std::max_element(l, l + V) - l); };
  const int32_t first = argmax(res[0].logits.data());

  // Decode: batch 1 continues the prefilled sequence itself; batch B > 1 decodes B forks of it.
  for (int64_t B : o.batches) {
    std::fprintf(stderr, "bench: decode %lld steps at batch %lld...\n", static_cast<long long>(o.gen), static_cast<long long>(B));
    std::vector<Sequence> forks;
    std::vector<int32_t> next(static_cast<size_t>(B), first);
    for (int64_t b = 0; b < B && B > 1; ++b) {
      forks.push_back(engine.fork(seq, std::min(info.context, seq.pos() + o.gen)));
      next[b] = next_random();  // each its own continuation: different routes
    }
    std::vector<StepRequest> reqs(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) reqs[b].seq = B > 1 ? &forks[b] : &seq;
    const MatmulCounters c0 = matmul_counters();
    const uint64_t sent0 = engine.bytes_sent();
    t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < o.gen; ++i) {
      for (int64_t b = 0; b < B; ++b) reqs[b].tokens.assign(1, next[b]);
      res = engine.step(reqs);
      for (int64_t b = 0; b < B; ++b) next[b] = argmax(res[b].logits.data());
    }
    const double s = seconds_since(t0);
    const MatmulCounters c1 = matmul_counters();
    BenchResult::BatchRow row;
    row.batch = B;
    row.step_s = s / static_cast<double>(o.gen);
    row.tok_s = static_cast<double>(B * o.gen) / s;
    row.bytes_per_step = static_cast<double>(c1.weight_bytes - c0.weight_bytes) / static_cast<double>(o.gen);
    if (profile) row.profile = take_profile(), row.stages = take_stages();
    r.batch_rows.push_back(row);
    if (B == 1 || r.decode_s == 0) {  // the batch-1 figures (or the first batch's, without one)
      r.decode_profile = row.profile, r.decode_stages = row.stages;
      r.decode_s = s;
      r.decode_tok_s = static_cast<double>(o.gen) / s;
      r.decode_bytes_per_token = row.bytes_per_step;
      r.decode_sent_per_token = static_cast<double>(engine.bytes_sent() - sent0) / static_cast<double>(o.gen);
    }
  }
  if (!o.drafts.empty()) measure_drafts(engine, o, prefill, first, r);
  r.kv_positions = seq.pos();
  r.kv_bytes = static_cast<double>(seq.cache_bytes());
  r.kv_bound_bytes = static_cast<double>(engine.sequence_bytes(seq.pos()));
  set_matmul_profiling(false);
  r.prefill_s = prefill_s;
  r.peak_rss_mb = peak_rss_mb();
  if (!cpu) {  // the counters saw no matmul and the host limits say nothing about the device
    r.decode_bytes_per_token = r.prefill_flops_per_token = 0;
    for (auto& row : r.batch_rows) row.bytes_per_step = 0;
    return r;
  }
  // This machine's bandwidth varies with what its neighbours do; the limit is the best seen,
  // so measure again after the run (the ratios use the larger figures: conservative).
  std::fprintf(stderr, "bench: measuring the limits again...\n");
  r.mem_bw_gb_s = std::max(r.mem_bw_gb_s, measure_read_bandwidth(size_t{1} << 30, 5));
  r.peak_gflop_s = std::max(r.peak_gflop_s, measure_peak_gflops(3));
  r.prefill_roofline_ratio = r.prefill_flops_per_token * r.prefill_tok_s / (r.peak_gflop_s * 1e9);
  r.decode_roofline_ratio = r.decode_bytes_per_token * r.decode_tok_s / (r.mem_bw_gb_s * 1e9);
  for (auto& row : r.batch_rows) row.bw_ratio = row.bytes_per_step / row.step_s / (r.mem_bw_gb_s * 1e9);
  return r;
}

namespace {

// Rows of a phase's profile and the time outside matmul ("other").
double matmul_seconds(const std::vector<BenchProfileRow>& rows) {
  double t = 0;
  for (const BenchProfileRow& p : rows) t += p.seconds;
  return t;
}

double stage_seconds(const std::vector<BenchStageRow>& rows) {
  double t = 0;
  for (const BenchStageRow& p : rows) t += p.seconds;
  return t;
}

std::string profile_json(const std::vector<BenchProfileRow>& rows, const std::vector<BenchStageRow>& stages, double total_s) {
  std::string out = "{\"matmul\": [";
  char buf[256];
  for (size_t i = 0; i < rows.size(); ++i) {
    const BenchProfileRow& p = rows[i];
    std::snprintf(buf, sizeof buf, "%s{\"what\": \"%s\", \"calls\": %lld, \"ms\": %.4g, \"gb_s\": %.4g, \"gflop_s\": %.4g}",
                  i ? ", " : "", p.what.c_str(), static_cast<long long>(p.calls), 1e3 * p.seconds,
                  static_cast<double>(p.weight_bytes) / p.seconds / 1e9, static_cast<double>(p.flops) / p.seconds / 1e9);
    out += buf;
  }
  out += "], \"stages\": [";
  for (size_t i = 0; i < stages.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s{\"what\": \"%s\", \"calls\": %lld, \"ms\": %.4g}", i ? ", " : "", stages[i].what.c_str(),
                  static_cast<long long>(stages[i].calls), 1e3 * stages[i].seconds);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "], \"other_ms\": %.4g}", 1e3 * (total_s - matmul_seconds(rows) - stage_seconds(stages)));
  return out + buf;
}

std::string profile_table(const char* phase, const std::vector<BenchProfileRow>& rows, const std::vector<BenchStageRow>& stages,
                          double total_s) {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: time by matmul weight, then by stage outside matmul (%.0f ms in all)\n  %-36s %6s %9s %6s %8s %9s\n", phase,
                1e3 * total_s, "weight", "calls", "ms", "share", "GB/s", "GFLOP/s");
  out += buf;
  for (const BenchProfileRow& p : rows) {
    std::snprintf(buf, sizeof buf, "  %-36s %6lld %9.1f %5.1f%% %8.2f %9.1f\n", p.what.c_str(), static_cast<long long>(p.calls),
                  1e3 * p.seconds, 100 * p.seconds / total_s, static_cast<double>(p.weight_bytes) / p.seconds / 1e9,
                  static_cast<double>(p.flops) / p.seconds / 1e9);
    out += buf;
  }
  for (const BenchStageRow& p : stages) {
    std::snprintf(buf, sizeof buf, "  %-36s %6lld %9.1f %5.1f%%\n", p.what.c_str(), static_cast<long long>(p.calls), 1e3 * p.seconds,
                  100 * p.seconds / total_s);
    out += buf;
  }
  const double other = total_s - matmul_seconds(rows) - stage_seconds(stages);
  std::snprintf(buf, sizeof buf, "  %-36s %6s %9.1f %5.1f%%\n", "other", "", 1e3 * other, 100 * other / total_s);
  return out + buf;
}

std::string drafts_json(const std::vector<BenchResult::DraftRow>& rows) {
  std::string out = "[";
  char buf[512];
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& d = rows[i];
    char be[32] = "null";  // no break-even: n + 1 tokens per step would not pay for the step
    if (d.break_even <= 1) std::snprintf(be, sizeof be, "%.4f", d.break_even);
    std::snprintf(buf, sizeof buf,
                  "%s{\"n\": %lld, \"step_ms\": %.4g, \"draft_ms\": %.4g, \"drafted\": %lld, \"accepted\": %lld, "
                  "\"tok_s\": %.4g, \"cost\": %.4f, \"break_even_acceptance\": %s}",
                  i ? ", " : "", static_cast<long long>(d.n), 1e3 * d.step_s, 1e3 * d.draft_s, static_cast<long long>(d.drafted),
                  static_cast<long long>(d.accepted), d.tok_s, d.cost, be);
    out += buf;
  }
  return out + "]";
}

std::string drafts_table(const std::vector<BenchResult::DraftRow>& rows) {
  std::string out =
      "speculative decode with the MTP block, greedy (cost: a step in plain batch-1 steps, the tokens it must yield to\n"
      "pay; break-even: the per-draft acceptance that yields them, each draft right with that probability after a right one)\n"
      "  drafts  ms/step  drafting   cost  accepted   tok/s  break-even\n";
  char buf[256];
  for (const auto& d : rows) {
    char be[16] = "never";
    if (d.break_even <= 1) std::snprintf(be, sizeof be, "%.2f", d.break_even);
    std::snprintf(buf, sizeof buf, "  %6lld %8.1f %9.1f %6.2f %4lld/%-4lld %7.2f  %10s\n", static_cast<long long>(d.n), 1e3 * d.step_s,
                  1e3 * d.draft_s, d.cost, static_cast<long long>(d.accepted), static_cast<long long>(d.drafted), d.tok_s, be);
    out += buf;
  }
  return out;
}

}  // namespace

std::string bench_json(const BenchResult& r) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "{\"prefill_tok_s\": %.4g, \"decode_tok_s\": %.4g, \"decode_bytes_per_token\": %.6g, "
                "\"mem_bw_gb_s\": %.4g, \"peak_gflop_s\": %.4g, \"decode_roofline_ratio\": %.4f, "
                "\"prefill_roofline_ratio\": %.4f, \"peak_rss_mb\": %.1f, \"mapped_weights_mb\": %.1f, \"threads\": %d, "
                "\"prompt_len\": %lld, \"gen\": %lld, \"prefill_flops_per_token\": %.6g, \"isa\": \"%s\", \"load\": \"%s\", "
                "\"device\": \"%s\", \"kv_positions\": %lld, \"kv_bytes\": %.6g, \"kv_bound_bytes\": %.6g}",
                r.prefill_tok_s, r.decode_tok_s, r.decode_bytes_per_token, r.mem_bw_gb_s, r.peak_gflop_s, r.decode_roofline_ratio,
                r.prefill_roofline_ratio, r.peak_rss_mb, r.mapped_weights_mb, r.threads, static_cast<long long>(r.prompt_len),
                static_cast<long long>(r.gen), r.prefill_flops_per_token, r.isa.c_str(), r.load.c_str(), r.device.c_str(),
                static_cast<long long>(r.kv_positions), r.kv_bytes, r.kv_bound_bytes);
  std::string out = buf;
  if (r.world > 1) {
    out.pop_back();
    std::snprintf(buf, sizeof buf, ", \"world\": %d, \"parallel\": \"%s\", \"decode_bytes_sent_per_token_rank0\": %.6g}", r.world,
                  r.parallel.c_str(), r.decode_sent_per_token);
    out += buf;
  }
  if (r.batch_rows.size() > 1 || (r.batch_rows.size() == 1 && r.batch_rows[0].batch != 1)) {
    out.pop_back();
    out += ", \"batches\": [";
    for (size_t i = 0; i < r.batch_rows.size(); ++i) {
      const auto& b = r.batch_rows[i];
      std::snprintf(buf, sizeof buf, "%s{\"batch\": %lld, \"tok_s\": %.4g, \"step_ms\": %.4g, \"bytes_per_step\": %.6g, \"bw_ratio\": %.4f}",
                    i ? ", " : "", static_cast<long long>(b.batch), b.tok_s, 1e3 * b.step_s, b.bytes_per_step, b.bw_ratio);
      out += buf;
      if (!b.profile.empty()) {
        out.pop_back();
        out += ", \"profile\": " + profile_json(b.profile, b.stages, b.step_s * static_cast<double>(r.gen)) + "}";
      }
    }
    out += "]}";
  }
  if (!r.draft_rows.empty()) {
    out.pop_back();
    out += ", \"drafts\": " + drafts_json(r.draft_rows) + "}";
  }
  if (!r.prefill_profile.empty() || !r.decode_profile.empty()) {
    out.pop_back();  // the closing brace
    out += ", \"profile\": {\"prefill\": " + profile_json(r.prefill_profile, r.prefill_stages, r.prefill_s) +
           ", \"decode\": " + profile_json(r.decode_profile, r.decode_stages, r.decode_s) + "}}";
  }
  return out;
}

std::string bench_table(const BenchResult& r) {
  char buf[2048];
  if (r.device != "cpu") {
    std::snprintf(buf, sizeof buf,
                  "device %s, weights loaded by %s (host limits and roofline ratios: not measured for this device)\n"
                  "prefill   %5lld tokens   %8.2f tok/s\n"
                  "decode    %5lld tokens   %8.2f tok/s\n"
                  "memory    host peak RSS %.0f MB, weights %.0f MB\n",
                  r.device.c_str(), r.load.c_str(), static_cast<long long>(r.prompt_len), r.prefill_tok_s,
                  static_cast<long long>(r.gen), r.decode_tok_s, r.peak_rss_mb, r.mapped_weights_mb);
    return buf + (r.draft_rows.empty() ? std::string() : drafts_table(r.draft_rows));
  }
  std::snprintf(buf, sizeof buf,
                "threads %d, isa %s, weights loaded by %s\n"
                "machine   read bandwidth %8.1f GB/s     FMA peak %8.1f GFLOP/s\n"
                "prefill   %5lld tokens   %8.2f tok/s   %8.1f GFLOP/s   %5.1f%% of FMA peak\n"
                "decode    %5lld tokens   %8.2f tok/s   %8.1f MB/token  %5.1f%% of bandwidth\n"
                "memory    peak RSS %.0f MB, weights %.0f MB\n",
                r.threads, r.isa.c_str(), r.load.c_str(), r.mem_bw_gb_s, r.peak_gflop_s, static_cast<long long>(r.prompt_len), r.prefill_tok_s,
                r.prefill_flops_per_token * r.prefill_tok_s / 1e9, 100 * r.prefill_roofline_ratio, static_cast<long long>(r.gen),
                r.decode_tok_s, r.decode_bytes_per_token / 1e6, 100 * r.decode_roofline_ratio, r.peak_rss_mb, r.mapped_weights_mb);
  std::string out = buf;
  if (r.world > 1) {
    std::snprintf(buf, sizeof buf, "parallel  %s over %d processes: rank 0 sent %.0f bytes per decoded token\n", r.parallel.c_str(),
                  r.world, r.decode_sent_per_token);
    out += buf;
  }
  if (r.kv_positions > 0) {
    std::snprintf(buf, sizeof buf, "cache     %lld positions: %.2f MB (%.1f bytes/position), reserved bound %.2f MB\n",
                  static_cast<long long>(r.kv_positions), r.kv_bytes / 1e6, r.kv_bytes / static_cast<double>(r.kv_positions),
                  r.kv_bound_bytes / 1e6);
    out += buf;
  }
  if (r.batch_rows.size() > 1 || (r.batch_rows.size() == 1 && r.batch_rows[0].batch != 1)) {
    out += "decode by batch size (B sequences per step; bytes: weights one step read, routed experts = the union touched)\n"
           "  batch    tok/s  ms/step  MB/step  GB/s  of bandwidth\n";
    for (const auto& b : r.batch_rows) {
      std::snprintf(buf, sizeof buf, "  %5lld %8.2f %8.1f %8.1f %5.1f  %5.1f%%\n", static_cast<long long>(b.batch), b.tok_s, 1e3 * b.step_s,
                    b.bytes_per_step / 1e6, b.bytes_per_step / b.step_s / 1e9, 100 * b.bw_ratio);
      out += buf;
    }
  }
  if (!r.draft_rows.empty()) out += drafts_table(r.draft_rows);
  if (!r.prefill_profile.empty()) out += profile_table("prefill", r.prefill_profile, r.prefill_stages, r.prefill_s);
  if (!r.decode_profile.empty()) out += profile_table("decode", r.decode_profile, r.decode_stages, r.decode_s);
  const bool has_batch1 = std::any_of(r.batch_rows.begin(), r.batch_rows.end(), [](const auto& b) { return b.batch == 1; });
  for (const auto& b : r.batch_rows) {
    const bool primary = b.batch == 1 || (!has_batch1 && &b == &r.batch_rows.front());  // printed above
    if (b.profile.empty() || primary) continue;
    const std::string phase = "decode at batch " + std::to_string(b.batch);
    out += profile_table(phase.c_str(), b.profile, b.stages, b.step_s * static_cast<double>(r.gen));
  }
  return out;
}

}  // namespace dsv4
