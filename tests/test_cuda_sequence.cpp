// The CUDA backend's sequence operations (backends/cuda/cuda_backend.cpp): fork (device copies of
// the caches), truncate (a rewind of up to kRewind positions, which the rings' slack makes exact)
// and the MTP block, each against a fresh sequence on the same backend bit for bit and against the
// CPU backend (and the golden MTP logits) within the golden case's bounds. Decode steps run as
// CUDA graphs (step_graphs.h), so each test also checks that a forked, truncated or MTP step never
// replays a graph of something else: a fork replaying its source's graph would write the source's
// caches, an MTP step replaying the main model's graph would run the wrong layers. Short
// sequences on tiny-native (window 16, CSA ratio 4, HCA ratio 16; the MTP block is a window
// layer): the emulator runs each test in a few seconds. Skipped without a CUDA device (label gpu).
#include <algorithm>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "core/error.h"
#include "model/forward.h"
#include "test_cuda_model.h"
#include "test_cuda_util.h"
#include "test_util.h"
#include "tools/logits.h"
#include "tools/npy.h"

using namespace dsv4;
using namespace dsv4::testing;

namespace {

class CudaSequence : public GpuTest {};

std::string tiny_dir() { return golden_dir("tiny-native"); }


std::vector<int32_t> random_tokens(uint32_t seed, int64_t n, int64_t vocab) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> d(2, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& v : t) v = d(g);
  return t;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Feeds tokens [from, to) of `toks` one decode step each (Rows::Last), appending the logits.
void decode(const Model& m, SequenceState& st, const std::vector<int32_t>& toks, int64_t from, int64_t to,
            std::vector<float>& out) {
  const int64_t V = m.config().vocab;
  for (int64_t p = from; p < to; ++p) {
    out.resize(out.size() + static_cast<size_t>(V));
    m.step(Stack::Main, {{&st, toks.data() + p, 1, Rows::Last, out.data() + out.size() - V, nullptr, nullptr}});
  }
}

// A fresh sequence: the first `prefill` tokens in one step, the rest decoded one by one; the
// decode steps' logits.
std::vector<float> fresh(const Model& m, const std::vector<int32_t>& toks, int64_t prefill) {
  std::vector<float> scratch(static_cast<size_t>(m.config().vocab)), out;
  SequenceState st = m.new_sequence();
  m.step(Stack::Main, {{&st, toks.data(), prefill, Rows::Last, scratch.data(), nullptr, nullptr}});
  decode(m, st, toks, prefill, static_cast<int64_t>(toks.size()), out);
  return out;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b, int64_t V) {
  EXPECT_EQ(a.size(), b.size());
  const int64_t T = static_cast<int64_t>(std::min(a.size(), b.size())) / V;
  if (T == 0) return 0;
  std::vector<double> e = rel_l2_rows(a.data(), b.data(), T, V);
  return *std::max_element(e.begin(), e.end());
}

// The golden case's bound between two backends: each is within the case's max of a float64
// reference, so within twice that of each other.
double cpu_bound(const char* which) {
  const nlohmann::json cs = read_json(tiny_dir() + "/case.json");
  return 2 * (std::string(which) == "mtp" ? cs["mtp"]["pass"] : cs["pass"])["max_rel_l2"].get<double>();
}

std::vector<float> slice_rows(const std::vector<float>& v, int64_t V, int64_t r0, int64_t r1) {
  return {v.begin() + r0 * V, v.begin() + r1 * V};
}

}  // namespace

// A fork continues from its source: after the fork, source and copy decode different tokens (the
// source's decode graph was captured before the fork; the copy captures its own; the last step
// runs both in one batch) and each equals a fresh sequence fed its tokens with the same steps,
// bit for bit, and the CPU backend within the golden bound.
TEST_F(CudaSequence, ForkThenDecodeEqualsFresh) {
  const Model m = cuda_model({.context = 64});
  const int64_t V = m.config().vocab, prefill = 5, before = 1, after = 3;
  const std::vector<int32_t> prefix = random_tokens(1, prefill + before, V);
  const std::vector<int32_t> ta = cat(prefix, random_tokens(2, after, V)), tb = cat(prefix, random_tokens(3, after, V));
  const int64_t P = prefill + before;

  std::vector<float> scratch(static_cast<size_t>(V)), la, lb;
  SequenceState a = m.new_sequence();
  m.step(Stack::Main, {{&a, ta.data(), prefill, Rows::Last, scratch.data(), nullptr, nullptr}});
  decode(m, a, ta, prefill, P, scratch);
  SequenceState b = m.fork(a);
  EXPECT_EQ(b.pos, P);
  for (int64_t p = P; p < P + after - 1; ++p) {  // alternating batch-1 steps
    decode(m, a, ta, p, p + 1, la);
    decode(m, b, tb, p, p + 1, lb);
  }
  la.resize(la.size() + V);
  lb.resize(lb.size() + V);
  const int64_t last = P + after - 1;
  m.step(Stack::Main, {{&a, ta.data() + last, 1, Rows::Last, la.data() + la.size() - V, nullptr, nullptr},
                       {&b, tb.data() + last, 1, Rows::Last, lb.data() + lb.size() - V, nullptr, nullptr}});

  // The fresh sequences take the same steps up to the fork (prefill, `before` decode steps).
  const std::vector<float> fa = fresh(m, ta, prefill), fb = fresh(m, tb, prefill);
  EXPECT_TRUE(la == slice_rows(fa, V, before, before + after)) << "source after the fork (max rel "
                                                               << max_rel(la, slice_rows(fa, V, before, before + after), V) << ")";
  EXPECT_TRUE(lb == slice_rows(fb, V, before, before + after)) << "fork (max rel "
                                                               << max_rel(lb, slice_rows(fb, V, before, before + after), V) << ")";
  const Model cpu = cpu_model();
  const double ea = max_rel(la, slice_rows(fresh(cpu, ta, prefill), V, before, before + after), V);
  const double eb = max_rel(lb, slice_rows(fresh(cpu, tb, prefill), V, before, before + after), V);
  std::printf("[cuda fork] max rel L2 vs CPU: source %.3g, fork %.3g\n", ea, eb);
  EXPECT_LE(ea, cpu_bound("main"));
  EXPECT_LE(eb, cpu_bound("main"));
}

// truncate + refeed == fresh, bit for bit: 13 tokens, then 16 more in one chunk (past the
// window's 16 slots, closing ratio-4 blocks at 15, 19, 23, 27 and the ratio-16 block at 15), a
// rewind of all 16 (kRewind, the most a truncate takes), 6 other tokens decoded, a rewind of 3
// across the block boundary at 15 again, 3 more. Without the rings' kRewind slack the window keys
// 0..12 and the compressor rows of blocks 2-3 (ratio 4) and 0 (ratio 16) would be overwritten.
// The decode steps after each rewind replay the sequence's graph (its buffers, new positions).
TEST_F(CudaSequence, TruncateAndRefeedEqualsFresh) {
  const Model m = cuda_model({.context = 64});
  const int64_t V = m.config().vocab, P = 13;
  const std::vector<int32_t> prefix = random_tokens(4, P, V), doomed = random_tokens(5, kRewind, V);
  const std::vector<int32_t> first = random_tokens(6, 6, V), second = random_tokens(7, 3, V);

  std::vector<float> scratch(static_cast<size_t>(V)), got;
  SequenceState s = m.new_sequence();
  m.step(Stack::Main, {{&s, prefix.data(), P, Rows::Last, scratch.data(), nullptr, nullptr}});
  m.step(Stack::Main, {{&s, doomed.data(), kRewind, Rows::Last, scratch.data(), nullptr, nullptr}});
  m.truncate(s, P, Stack::Main);
  EXPECT_EQ(s.pos, P);
  const std::vector<int32_t> t1 = cat(prefix, first);
  decode(m, s, t1, P, P + 6, got);
  m.truncate(s, P + 3, Stack::Main);
  const std::vector<int32_t> t2 = cat(cat(prefix, {first.begin(), first.begin() + 3}), second);
  decode(m, s, t2, P + 3, P + 6, got);
  ASSERT_EQ(got.size(), static_cast<size_t>(9 * V));

  // Fresh sequences: the prefix in one step, then t1's / t2's tokens decoded. Rows of `got`: the
  // 6 decoded after the first rewind (t1), then the 3 after the second (t2's last 3).
  const std::vector<float> want1 = fresh(m, t1, P), want2 = fresh(m, t2, P);
  const std::vector<float> got1 = slice_rows(got, V, 0, 6), got2 = slice_rows(got, V, 6, 9);
  EXPECT_TRUE(got1 == want1) << "after the rewind of 16 (max rel " << max_rel(got1, want1, V) << ")";
  EXPECT_TRUE(got2 == slice_rows(want2, V, 3, 6)) << "after the rewind of 3 (max rel " << max_rel(got2, slice_rows(want2, V, 3, 6), V)
                                                  << ")";
  const Model cpu = cpu_model();
  const double e1 = max_rel(got1, fresh(cpu, t1, P), V), e2 = max_rel(got2, slice_rows(fresh(cpu, t2, P), V, 3, 6), V);
  std::printf("[cuda truncate] max rel L2 vs CPU %.3g, %.3g\n", e1, e2);
  EXPECT_LE(e1, cpu_bound("main"));
  EXPECT_LE(e2, cpu_bound("main"));
}

namespace {

// The engine's MTP schedule (engine/engine.cpp run_step) on a Model: the main model over the
// sequence's next n tokens, their final states kept, then the MTP block over the positions whose
// next token is now known, [mtp_pos, pos - 1) (position t given token t + 1 and the main model's
// state at t). Logits of every row: main [T, V], MTP [T - 1, V].
struct MtpRun {
  std::vector<float> main, mtp, hidden;  // hidden: [T, hc * D]
  MtpRun(const Model& m, int64_t T)
      : main(static_cast<size_t>(T * m.config().vocab)),
        mtp(static_cast<size_t>((T - 1) * m.config().vocab)),
        hidden(static_cast<size_t>(T * m.hidden_size())) {}
};

void mtp_feed(const Model& m, SequenceState& st, const std::vector<int32_t>& toks, int64_t n, MtpRun& r) {
  const int64_t V = m.config().vocab, Hs = m.hidden_size(), p = st.pos;
  m.step(Stack::Main, {{&st, toks.data() + p, n, Rows::All, r.main.data() + p * V, r.hidden.data() + p * Hs, nullptr}});
  const int64_t first = st.mtp_pos, end = st.pos - 1;
  if (end > first)
    m.step(Stack::Mtp, {{&st, toks.data() + first + 1, end - first, Rows::All, r.mtp.data() + first * V, nullptr,
                         r.hidden.data() + first * Hs}});
}

}  // namespace

// The MTP block on the GPU: its logits against the golden expected-mtp.npy at the case's MTP
// thresholds and against the CPU backend's within the golden bound, the prompt's rows from one
// MTP step, the rest from decode steps (graphs: the main model's and the block's steps of one
// sequence differ only by their stack). Then a fork, two draft steps on the source (the block
// running ahead on its own outputs, as Engine::draft) and the MTP rewind the engine makes before
// the next step: source and fork then give the same logits, bit for bit.
TEST_F(CudaSequence, MtpLogitsMatchCpuAndGolden) {
  const std::string dir = tiny_dir();
  const nlohmann::json pass = read_json(dir + "/case.json")["mtp"]["pass"];
  std::vector<int32_t> toks = read_tokens(dir + "/tokens.txt");
  toks.resize(24);
  const int64_t T = static_cast<int64_t>(toks.size()), P = 16, forked = 21;
  const Model m = cuda_model({.context = 64}), cpu = cpu_model();
  ASSERT_TRUE(m.has_mtp());
  const int64_t V = m.config().vocab, Hs = m.hidden_size();

  MtpRun ra(m, T);
  SequenceState a = m.new_sequence();
  mtp_feed(m, a, toks, P, ra);
  while (a.pos < forked) mtp_feed(m, a, toks, 1, ra);
  EXPECT_EQ(a.mtp_pos, forked - 1);
  MtpRun rb = ra;
  SequenceState b = m.fork(a);
  EXPECT_EQ(b.mtp_pos, forked - 1);
  {  // drafts: the block at pos - 1 given a guessed token, then at pos on its own output state
    std::vector<float> h(ra.hidden.begin() + (a.pos - 1) * Hs, ra.hidden.begin() + a.pos * Hs), hn(h.size()),
        lg(static_cast<size_t>(V));
    int32_t tok = 7;
    for (int k = 0; k < 2; ++k) {
      m.step(Stack::Mtp, {{&a, &tok, 1, Rows::Last, lg.data(), hn.data(), h.data()}});
      tok = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
      std::swap(h, hn);
    }
    EXPECT_EQ(a.mtp_pos, forked + 1);
    m.truncate(a, forked - 1, Stack::Mtp);
  }
  while (a.pos < T) {
    mtp_feed(m, a, toks, 1, ra);
    mtp_feed(m, b, toks, 1, rb);
  }
  EXPECT_TRUE(ra.main == rb.main) << "main logits: source (drafted, rewound) vs fork (max rel " << max_rel(ra.main, rb.main, V) << ")";
  EXPECT_TRUE(ra.mtp == rb.mtp) << "MTP logits: source (drafted, rewound) vs fork (max rel " << max_rel(ra.mtp, rb.mtp, V) << ")";

  MtpRun rc(cpu, T);
  SequenceState c = cpu.new_sequence();
  mtp_feed(cpu, c, toks, P, rc);
  while (c.pos < T) mtp_feed(cpu, c, toks, 1, rc);
  const double em = max_rel(ra.main, rc.main, V), et = max_rel(ra.mtp, rc.mtp, V);

  // Golden rows 0 .. T - 2 (row t depends on tokens up to t + 1 only), exclusions left out.
  const NpyF32 want = read_npy_f32(dir + "/expected-mtp.npy");
  const std::vector<int64_t> excluded = pass["exclude_positions"].get<std::vector<int64_t>>();
  const std::vector<double> err = rel_l2_rows(ra.mtp.data(), want.data.data(), T - 1, V);
  std::vector<double> kept;
  int64_t agree = 0;
  for (int64_t t = 0; t < T - 1; ++t) {
    if (std::find(excluded.begin(), excluded.end(), t) != excluded.end()) continue;
    kept.push_back(err[t]);
    const float* g = ra.mtp.data() + t * V;
    const float* w = want.data.data() + t * V;
    agree += (std::max_element(g, g + V) - g) == (std::max_element(w, w + V) - w);
  }
  std::sort(kept.begin(), kept.end());
  const double median = kept[kept.size() / 2], max = kept.back(), pct = 100.0 * static_cast<double>(agree) / kept.size();
  std::printf("[cuda mtp] vs golden: median rel L2 %.3g, max %.3g, argmax %.1f%%; vs CPU: main %.3g, MTP %.3g\n", median, max, pct,
              em, et);
  EXPECT_LE(median, pass["median_rel_l2"].get<double>());
  EXPECT_LE(max, pass["max_rel_l2"].get<double>());
  EXPECT_GE(pct, pass["argmax_pct"].get<double>());
  EXPECT_LE(em, cpu_bound("main"));
  EXPECT_LE(et, cpu_bound("mtp"));
}
