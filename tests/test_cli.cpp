// The CLI on good and bad input: bad input gives one line on stderr and a non-zero exit,
// never a crash, and never a partial output file.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.h"
#include "tools/logits.h"
#include "tools/npy.h"
#include "io/safetensors.h"
#include "engine/score.h"

using namespace dsv4;
using namespace dsv4::testing;
namespace fs = std::filesystem;

namespace {

struct CliRun {
  int status = -1;
  std::string err;
};

// Runs the dsv4 binary with `args`; captures stderr (stdout is discarded).
CliRun dsv4_run(const std::string& args) {
  CommandResult c = run_command(std::string(DSV4_BIN) + " " + args + " 2>&1 >/dev/null");
  return {c.status, c.output};
}

std::string tiny() { return golden_dir("tiny-native"); }
std::string tokens_arg() { return "--tokens 1,2,3,4,5,6,7,8"; }

// A writable copy of the tiny golden model.
std::string copy_model(const std::string& tag) {
  std::string dir = temp_dir(tag);
  fs::copy(tiny() + "/model", dir, fs::copy_options::recursive);
  for (auto& e : fs::directory_iterator(dir)) fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  return dir;
}

// Rewrites the copy's tensors through `edit` (which may drop or replace entries).
template <class F>
std::string rewrite_model(const std::string& tag, F edit) {
  std::string dir = copy_model(tag);
  SafeTensorsWriter w;
  {
    auto f = SafeTensorsFile::open(dir + "/model.safetensors");
    for (const auto& [name, t] : f->tensors()) {
      TensorInfo copy = t;
      std::vector<uint8_t> bytes(t.data, t.data + t.nbytes);
      if (edit(copy, bytes)) w.add(copy.name, copy.dtype, copy.shape, std::move(bytes));
    }
  }
  fs::remove(dir + "/model.safetensors");
  w.write(dir, 1);
  return dir;
}

void expect_one_line_error(const CliRun& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.status, 1) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("dsv4: error: ", 0), 0u) << r.err;
  for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "missing '" << n << "' in: " << r.err;
}

CliRun score(const std::string& model, const std::string& out, const std::string& extra = "") {
  return dsv4_run("score --model " + model + " " + tokens_arg() + " --out " + out + " " + extra);
}

void patch_header_len(const std::string& file, uint64_t v) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.write(reinterpret_cast<const char*>(&v), 8);
}

}  // namespace

TEST(Cli, HelpListsEveryCommand) {
  CommandResult help = run_command(std::string(DSV4_BIN) + " --help");
  EXPECT_EQ(help.status, 0);
  const std::string& out = help.output;
  for (const char* s : {"score", "make-tiny", "inspect", "--model", "--tokens", "--prefill", "--chunk", "--threads", "--out",
                        "--preset", "--format", "--seed", "--shards"})
    EXPECT_NE(out.find(s), std::string::npos) << s;
}

// `dsv4 CMD --help` prints CMD's part of the help and nothing of the other commands'.
TEST(Cli, CommandHelpShowsThatCommandOnly) {
  const std::vector<std::pair<std::string, std::string>> own = {
      {"score", "--mtp-out F.npy"}, {"make-tiny", "--preset NAME"}, {"generate", "--hide-reasoning"},
      {"chat", "--system TEXT"},    {"tokenize", "Print the token ids"}, {"detokenize", "Print the text"},
      {"chat-template", "--messages F.json"}, {"inspect", "Describe a checkpoint"}, {"bench", "--batch LIST"},
      {"serve", "--kv-budget MB"}};
  for (const auto& [cmd, mark] : own) {
    CommandResult r = run_command(std::string(DSV4_BIN) + " " + cmd + " --help");
    EXPECT_EQ(r.status, 0) << cmd;
    EXPECT_EQ(r.output.rfind("Usage: dsv4 " + cmd + " [options]", 0), 0u) << r.output;
    EXPECT_NE(r.output.find(mark), std::string::npos) << cmd << ": " << r.output;
    for (const auto& [other, other_mark] : own) {
      if (other != cmd) {
        EXPECT_EQ(r.output.find(other_mark), std::string::npos) << cmd << " shows " << other;
      }
    }
  }
  // serve points at score for the options it shares; an unknown command is a usage error.
  EXPECT_NE(run_command(std::string(DSV4_BIN) + " serve -h").output.find("`dsv4 score --help`"), std::string::npos);
  CommandResult unknown = run_command(std::string(DSV4_BIN) + " frobnicate --help 2>&1");
  EXPECT_EQ(unknown.status, 2);
  EXPECT_NE(unknown.output.find("unknown command 'frobnicate'"), std::string::npos) << unknown.output;
}

TEST(Cli, ScoreWritesLogitsThatMatchGolden) {
  std::string out = temp_dir("cli-ok") + "/l.npy";
  std::string dir = tiny();
  std::string toks = "--tokens " + [&] {
    std::ifstream f(dir + "/tokens.txt");
    std::string s;
    std::getline(f, s);
    return s;
  }();
  CliRun r = dsv4_run("score --model " + dir + "/model " + toks + " --prefill 40 --chunk 7 --threads 2 --out " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  NpyF32 got = read_npy_f32(out), want = read_npy_f32(dir + "/expected.npy");
  ASSERT_EQ(got.shape, want.shape);
  std::vector<double> e = rel_l2_rows(got.data.data(), want.data.data(), got.shape[0], got.shape[1]);
  EXPECT_LE(*std::max_element(e.begin(), e.end()), 1e-3);
}

// Several sequences in one run go through shared batched steps; each output equals the
// sequence scored alone, bit for bit. --mtp-out writes the MTP block's logits [T-1, vocab].
TEST(Cli, ScoreSeveralSequencesAndMtp) {
  const std::string d = temp_dir("cli-multi"), dir = tiny();
  std::ifstream f(dir + "/tokens.txt");
  std::string toks;
  std::getline(f, toks);
  const std::string m = " --model " + dir + "/model --prefill 10 --chunk 4";
  CliRun both = dsv4_run("score" + m + " --tokens " + toks + " --out " + d + "/a.npy --tokens 7,8,9,10,11,12,13,14,15,16,17,18 --out " + d + "/b.npy");
  ASSERT_EQ(both.status, 0) << both.err;
  ASSERT_EQ(dsv4_run("score" + m + " --tokens " + toks + " --out " + d + "/a1.npy --mtp-out " + d + "/am.npy").status, 0);
  ASSERT_EQ(dsv4_run("score" + m + " --tokens 7,8,9,10,11,12,13,14,15,16,17,18 --out " + d + "/b1.npy").status, 0);
  EXPECT_EQ(read_npy_f32(d + "/a.npy").data, read_npy_f32(d + "/a1.npy").data);
  EXPECT_EQ(read_npy_f32(d + "/b.npy").data, read_npy_f32(d + "/b1.npy").data);
  NpyF32 mtp = read_npy_f32(d + "/am.npy"), want = read_npy_f32(dir + "/expected-mtp.npy");
  ASSERT_EQ(mtp.shape, want.shape);
  std::vector<double> e = rel_l2_rows(mtp.data.data(), want.data.data(), mtp.shape[0], mtp.shape[1]);
  std::sort(e.begin(), e.end());
  // The plumbing check (rows shifted or from the main head would be off by ~1): the default ISA's
  // summation order can move the MTP rows by ~1e-4 past an fp8sim rounding flip; the golden
  // thresholds proper are EngineMtp.GoldenLogits'.
  EXPECT_LE(e[e.size() / 2], 1e-3);
  // One --out per --tokens; --mtp-out takes one sequence.
  EXPECT_EQ(dsv4_run("score" + m + " --tokens 1,2,3 --tokens 4,5,6 --out " + d + "/x.npy").status, 2);
  EXPECT_EQ(dsv4_run("score" + m + " --tokens 1,2,3 --out " + d + "/x.npy --tokens 4,5,6 --out " + d + "/y.npy --mtp-out " + d + "/z.npy").status, 2);
  fs::remove_all(d);
}

TEST(Cli, TokenIdOutsideVocab) {
  std::string out = temp_dir("cli-vocab") + "/l.npy";
  CliRun r = dsv4_run("score --model " + tiny() + "/model --tokens 1,2,1024 --out " + out);
  expect_one_line_error(r, {"1024", "vocab"});
  EXPECT_FALSE(fs::exists(out));
}

TEST(Cli, BadUsage) {
  std::string out = temp_dir("cli-usage") + "/l.npy";
  EXPECT_EQ(dsv4_run("score --model " + tiny() + "/model --out " + out).status, 2);                       // no --tokens
  EXPECT_EQ(dsv4_run("score --model " + tiny() + "/model --tokens 1,x --out " + out).status, 2);         // bad id
  EXPECT_EQ(dsv4_run("score --model " + tiny() + "/model --tokens 1,2 --prefill 3 --out " + out).status, 2);
  EXPECT_EQ(dsv4_run("score --model " + tiny() + "/model --tokens 1,2 --bogus 1 --out " + out).status, 2);
  EXPECT_EQ(dsv4_run("frobnicate").status, 2);
  CliRun load = dsv4_run("score --model " + tiny() + "/model --tokens 1,2 --load fast --out " + out);
  EXPECT_EQ(load.status, 2);
  EXPECT_NE(load.err.find("--load"), std::string::npos) << load.err;
  expect_one_line_error(dsv4_run("score --model /nonexistent/dir --tokens 1 --out " + out), {"/nonexistent/dir"});
  // The text commands look for the tokenizer in --model first: a wrong --model is named as such.
  for (const char* cmd : {"generate --prompt hi", "chat"})
    expect_one_line_error(dsv4_run(std::string(cmd) + " --model /nonexistent/dir </dev/null"), {"/nonexistent/dir", "no config.json"});
  // serve too, before it listens (it then loads while /health says "loading").
  expect_one_line_error(dsv4_run("serve --port 0 --model /nonexistent/dir"), {"/nonexistent/dir", "no config.json"});
  // bench names it before measuring the machine's limits (its one line is the only one).
  expect_one_line_error(dsv4_run("bench --model /nonexistent/dir"), {"/nonexistent/dir", "no config.json"});
  // A model directory without its tokenizer is told to pass one.
  expect_one_line_error(dsv4_run("generate --prompt hi --model " + tiny() + "/model"), {"no tokenizer.json", "--tokenizer"});
}

// generate and chat check every option before the model loads (minutes for a real checkpoint):
// a usage error comes first even when the weights would not load at all.
TEST(Cli, TextCommandsCheckOptionsBeforeLoading) {
  if (!fs::exists(tokenizer_dir() + "/tokenizer.json")) GTEST_SKIP() << "no tokenizer.json in " << tokenizer_dir();
  const std::string dir = copy_model("cli-early");
  fs::resize_file(dir + "/model.safetensors", 100);  // loading it fails (a header past the end)
  const std::string model = " --model " + dir + " --tokenizer " + tokenizer_dir() + " </dev/null";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"generate --prompt hi --bogus 1", "unknown option --bogus"},
      {"generate --prompt hi --mode poem", "--mode must be thinking, chat or raw"},
      {"generate --prompt hi --reasoning-effort low", "--reasoning-effort must be high or max"},
      {"chat --bogus 1", "unknown option --bogus"},
      {"chat --mode raw", "--mode must be thinking or chat"},
      {"chat --reasoning-effort low", "--reasoning-effort must be high or max"},
  };
  for (const auto& [args, needle] : cases) {
    const CliRun r = dsv4_run(args + model);
    EXPECT_EQ(r.status, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
  }
  // Without a usage error, the tokenizer is checked against config.json before the weights are
  // read: this one has 129280 tokens, the model 1024, and that is what is said, not that the
  // weights cannot load. So is a missing tokenizer. serve, which would have answered every
  // request with a 400, says so before it listens.
  expect_one_line_error(dsv4_run("generate --prompt hi" + model), {"129280 tokens", "vocab_size is 1024", "config.json"});
  expect_one_line_error(dsv4_run("chat --model " + dir + " </dev/null"), {"no tokenizer.json", "--tokenizer"});
  expect_one_line_error(dsv4_run("serve --port 0" + model), {"tokenizer ", "vocab_size is 1024"});
  expect_one_line_error(dsv4_run("serve --port 0 --model " + dir), {"no tokenizer.json", "--tokenizer"});
  // With a tokenizer that fits, the weights' load is what fails.
  std::ifstream in(dir + "/config.json");
  std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = cfg.find("\"vocab_size\": 1024");
  ASSERT_NE(at, std::string::npos);
  cfg.replace(at, 18, "\"vocab_size\": 129280");
  std::ofstream(dir + "/config.json") << cfg;
  expect_one_line_error(dsv4_run("generate --prompt hi" + model), {"model.safetensors"});
}

TEST(Cli, TruncatedFile) {
  std::string dir = copy_model("cli-trunc");
  fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") - 1000);
  expect_one_line_error(score(dir, dir + "/l.npy"), {"model.safetensors", "past the end"});
  EXPECT_FALSE(fs::exists(dir + "/l.npy"));
}

TEST(Cli, OversizedHeaderLength) {
  std::string dir = copy_model("cli-hdr");
  patch_header_len(dir + "/model.safetensors", 1ull << 40);
  expect_one_line_error(score(dir, dir + "/l.npy"), {"model.safetensors", "header length"});
}

TEST(Cli, OffsetsPastTheEnd) {
  std::string dir = copy_model("cli-off");
  // Grow the header's declared length into the data: the JSON then no longer parses or the
  // offsets shift; either way a one-line error. Then a precise case via a hand-made file.
  std::string f = dir + "/model.safetensors";
  fs::remove(f);
  std::string hdr = R"({"embed.weight":{"dtype":"BF16","shape":[1024,256],"data_offsets":[0,524288]}})";
  std::ofstream o(f, std::ios::binary);
  uint64_t n = hdr.size();
  o.write(reinterpret_cast<const char*>(&n), 8);
  o << hdr << std::string(1000, '\0');
  o.close();
  expect_one_line_error(score(dir, dir + "/l.npy"), {"model.safetensors", "embed.weight", "past the end"});
}

TEST(Cli, DtypeShapeMismatchInFile) {
  std::string dir = copy_model("cli-dtype");
  std::string f = dir + "/model.safetensors";
  fs::remove(f);
  std::string hdr = R"({"norm.weight":{"dtype":"F32","shape":[256],"data_offsets":[0,512]}})";
  std::ofstream o(f, std::ios::binary);
  uint64_t n = hdr.size();
  o.write(reinterpret_cast<const char*>(&n), 8);
  o << hdr << std::string(512, '\0');
  o.close();
  expect_one_line_error(score(dir, dir + "/l.npy"), {"norm.weight", "F32"});
}

TEST(Cli, MissingTensor) {
  std::string dir = rewrite_model("cli-missing", [](TensorInfo& t, std::vector<uint8_t>&) { return t.name != "layers.2.attn.wkv.weight"; });
  expect_one_line_error(score(dir, dir + "/l.npy"), {"missing tensor", "layers.2.attn.wkv.weight"});
}

TEST(Cli, WrongShapeForConfig) {
  // The tensor is self-consistent in the file but not with config.json.
  std::string dir = rewrite_model("cli-shape", [](TensorInfo& t, std::vector<uint8_t>& b) {
    if (t.name == "layers.1.attn.q_norm.weight") {
      t.shape = {64};
      b.resize(128);
    }
    return true;
  });
  expect_one_line_error(score(dir, dir + "/l.npy"), {"layers.1.attn.q_norm.weight", "[128]", "[64]"});
}

TEST(Cli, ConfigInconsistentWithTensors) {
  std::string dir = copy_model("cli-cfg");
  nlohmann::json j = read_json(dir + "/config.json");
  j["o_groups"] = 4;  // wo_a would be [4*128, 128]; the file holds [256, 256]
  std::ofstream(dir + "/config.json") << j.dump();
  expect_one_line_error(score(dir, dir + "/l.npy"), {"wo_a", "expected shape"});

  j["o_groups"] = 3;  // 4 heads not divisible by 3
  std::ofstream(dir + "/config.json") << j.dump();
  expect_one_line_error(score(dir, dir + "/l.npy"), {"config.json", "o_groups"});

  j["o_groups"] = 2;
  j["compress_ratios"] = {0, 4};
  std::ofstream(dir + "/config.json") << j.dump();
  expect_one_line_error(score(dir, dir + "/l.npy"), {"compress_ratios"});
}

TEST(Cli, InspectDescribesCheckpoint) {
  CommandResult r = run_command(std::string(DSV4_BIN) + " inspect --model " + golden_dir("tiny-nvfp4-sharded") + "/model");
  EXPECT_EQ(r.status, 0);
  const std::string& out = r.output;
  for (const char* s : {"NVFP4", "MXFP4", "FP8Block", "CSA(4)", "HCA(16)", "window", "hash-routed", "mtp", "F8_E4M3", "total"})
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
}

// `inspect --parallel ep|ep+tp --world N`: one line per rank, each holding the replicated part
// plus its share, so the ranks together hold the model plus (N - 1) copies of the replicated
// part; the rank with more experts (or groups) sends more per token.
struct InspectRank {
  int rank = -1;
  std::string experts, groups;
  double resident = 0, sent = 0;
};

static std::vector<InspectRank> inspect_parallel(const std::string& mode, int world, double* replicated, double* whole) {
  const std::string m = golden_dir("tiny-native") + "/model";
  CommandResult r = run_command(std::string(DSV4_BIN) + " inspect --model " + m + " --parallel " + mode + " --world " + std::to_string(world));
  EXPECT_EQ(r.status, 0) << r.output;
  const size_t at = r.output.find("--parallel " + mode + " over " + std::to_string(world) + " ranks");
  EXPECT_NE(at, std::string::npos) << r.output;
  if (at == std::string::npos) return {};
  std::istringstream in(r.output.substr(at));
  std::string line;
  std::getline(in, line);
  *replicated = std::stod(line.substr(line.find("part, ") + 6)) * 1024 * 1024;
  std::getline(in, line);  // header
  std::vector<InspectRank> out(static_cast<size_t>(world));
  for (InspectRank& x : out) {
    std::getline(in, line);
    std::istringstream f(line);
    f >> x.rank >> x.experts >> x.groups >> x.resident >> x.sent;
  }
  std::getline(in, line);
  *whole = std::stod(line.substr(line.find("one process: ") + 13));
  return out;
}

TEST(Cli, InspectParallelSplitsTheModel) {
  double replicated = 0, whole = 0;
  std::vector<InspectRank> ep = inspect_parallel("ep", 3, &replicated, &whole);
  ASSERT_EQ(ep.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(ep[r].rank, r);
  EXPECT_EQ(ep[0].experts + " " + ep[1].experts + " " + ep[2].experts, "0-1 2-4 5-7");  // 8 experts over 3 ranks
  EXPECT_NEAR(ep[0].resident + ep[1].resident + ep[2].resident, whole + 2 * replicated, 0.1 * 1024 * 1024);
  for (const InspectRank& x : ep) EXPECT_LT(x.resident, whole);
  EXPECT_EQ(ep[1].resident, ep[2].resident);
  EXPECT_LT(ep[0].resident, ep[1].resident);
  EXPECT_LT(ep[0].sent, ep[1].sent);  // fewer experts, fewer rows to send (plus the small request)

  // ep+tp: 2 output groups over 3 ranks: rank 0 holds none of them.
  std::vector<InspectRank> both = inspect_parallel("ep+tp", 3, &replicated, &whole);
  ASSERT_EQ(both.size(), 3u);
  EXPECT_EQ(both[0].groups + " " + both[1].groups + " " + both[2].groups, "none 0-0 1-1");
  EXPECT_NEAR(both[0].resident + both[1].resident + both[2].resident, whole + 2 * replicated, 0.1 * 1024 * 1024);
  for (int r = 0; r < 3; ++r) EXPECT_LT(both[r].resident, ep[r].resident);  // the head's rows split too

  const std::string m = golden_dir("tiny-native") + "/model";
  EXPECT_EQ(run_command(std::string(DSV4_BIN) + " inspect --model " + m + " --world 3").status, 2);  // --world needs --parallel
}

TEST(Cli, MakeTinyThenScore) {
  std::string dir = temp_dir("cli-tiny");
  for (const char* fmt : {"native", "nvfp4", "hf-bf16"}) {
    std::string m = dir + "/" + fmt;
    CliRun r = dsv4_run(std::string("make-tiny --out ") + m + " --preset tiny --format " + fmt + " --seed 4 --shards 2");
    ASSERT_EQ(r.status, 0) << r.err;
    r = score(m, m + "/l.npy", "--prefill 5 --chunk 2");
    ASSERT_EQ(r.status, 0) << r.err;
    NpyF32 l = read_npy_f32(m + "/l.npy");
    for (float v : l.data) ASSERT_TRUE(std::isfinite(v));
  }
  expect_one_line_error(dsv4_run("make-tiny --out " + dir + "/x --preset huge"), {"huge"});
  expect_one_line_error(dsv4_run("make-tiny --out " + dir + "/x --format gguf"), {"gguf"});
}

TEST(Cli, BenchJsonHasEveryField) {
  CommandResult r = run_command(std::string(DSV4_BIN) + " bench --model " + tiny() + "/model --prompt-len 16 --gen 4 --threads 2 --json 2>/dev/null");
  ASSERT_EQ(r.status, 0);
  nlohmann::json j = nlohmann::json::parse(r.output);
  for (const char* k : {"prefill_tok_s", "decode_tok_s", "decode_bytes_per_token", "mem_bw_gb_s", "peak_gflop_s",
                        "decode_roofline_ratio", "prefill_roofline_ratio", "peak_rss_mb"})
    EXPECT_GT(j.at(k).get<double>(), 0.0) << k;
  EXPECT_EQ(j.at("threads").get<int>(), 2);
  EXPECT_EQ(j.at("load").get<std::string>(), "read");  // auto reads a small model into memory
  // Every weight of the attention path and the head is read once per decode step, at least.
  EXPECT_GT(j.at("decode_bytes_per_token").get<double>(), 1e6);
}

// --batch: a row per batch size; a batched step reads each weight once, so B sequences read
// fewer than B times the bytes of one (the routed experts: the union the batch touched).
TEST(Cli, BenchBatchRows) {
  CommandResult r = run_command(std::string(DSV4_BIN) + " bench --model " + tiny() +
                                "/model --prompt-len 16 --gen 3 --threads 2 --batch 1,4 --json 2>/dev/null");
  ASSERT_EQ(r.status, 0);
  nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j.at("batches").size(), 2u);
  const nlohmann::json &b1 = j["batches"][0], &b4 = j["batches"][1];
  EXPECT_EQ(b1.at("batch").get<int>(), 1);
  EXPECT_EQ(b4.at("batch").get<int>(), 4);
  EXPECT_GT(b4.at("bytes_per_step").get<double>(), b1.at("bytes_per_step").get<double>());
  EXPECT_LT(b4.at("bytes_per_step").get<double>(), 4 * b1.at("bytes_per_step").get<double>());
  EXPECT_EQ(run_command(std::string(DSV4_BIN) + " bench --model " + tiny() + "/model --batch 0 2>/dev/null").status, 2);
}

// --draft: a row per draft count, measured the way `generate --draft` decodes. On a model whose
// MTP block often agrees with it, drafts are accepted; every step yields 1 + its accepted drafts.
TEST(Cli, BenchDraftRows) {
  const std::string agreeing = mtp_agreeing_model_dir();
  if (agreeing.empty()) GTEST_SKIP() << "golden tiny-native not found";
  constexpr int64_t gen = 6;
  const std::string err = temp_dir("bench-draft") + "/stderr";
  CommandResult r = run_command(std::string(DSV4_BIN) + " bench --model " + agreeing + " --prompt-len 16 --gen " +
                                std::to_string(gen) + " --threads 2 --draft 1,3 --json 2>" + err);
  std::stringstream progress;
  progress << std::ifstream(err).rdbuf();
  SCOPED_TRACE("bench output: " + r.output + "\nstderr: " + progress.str());
  ASSERT_EQ(r.status, 0);
  const nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j.at("drafts").size(), 2u);
  int64_t accepted = 0;
  for (size_t i = 0; i < 2; ++i) {
    const nlohmann::json& d = j["drafts"][i];
    const int64_t n = i == 0 ? 1 : 3;
    EXPECT_EQ(d.at("n").get<int64_t>(), n);
    EXPECT_EQ(d.at("drafted").get<int64_t>(), gen * n);
    const int64_t a = d.at("accepted").get<int64_t>();
    EXPECT_GE(a, 0);
    EXPECT_LE(a, gen * n);
    accepted += a;
    const double step_s = d.at("step_ms").get<double>() / 1e3, tok_s = d.at("tok_s").get<double>();
    EXPECT_GT(d.at("draft_ms").get<double>(), 0.0);
    EXPECT_LT(d.at("draft_ms").get<double>() / 1e3, step_s);
    EXPECT_NEAR(tok_s * step_s * gen, static_cast<double>(gen + a), 0.01 * (gen + a));
    // cost: the step in plain batch-1 steps (1 / decode_tok_s each).
    EXPECT_NEAR(d.at("cost").get<double>(), step_s * j.at("decode_tok_s").get<double>(), 0.01 * d.at("cost").get<double>());
    // null: even n + 1 tokens per step would not pay; 0 when the step costs no more than a plain
    // one (a timing artefact on a busy machine, or a tiny model).
    if (!d.at("break_even_acceptance").is_null()) {
      EXPECT_GE(d.at("break_even_acceptance").get<double>(), 0.0);
      EXPECT_LE(d.at("break_even_acceptance").get<double>(), 1.0);
    }
  }
  EXPECT_GT(accepted, 0);
  // Bad counts, no batch-1 baseline, a model without an MTP block.
  const std::string tiny_model = tiny() + "/model";
  EXPECT_EQ(run_command(std::string(DSV4_BIN) + " bench --model " + tiny_model + " --draft 0 2>/dev/null").status, 2);
  EXPECT_EQ(run_command(std::string(DSV4_BIN) + " bench --model " + tiny_model + " --draft 17 2>/dev/null").status, 2);
  EXPECT_EQ(run_command(std::string(DSV4_BIN) + " bench --model " + tiny_model + " --draft 1,x 2>/dev/null").status, 2);
  EXPECT_EQ(run_command(std::string(DSV4_BIN) + " bench --model " + tiny_model + " --draft 1 --batch 2 2>/dev/null").status, 2);
  const std::string nomtp = temp_dir("no-mtp");
  for (const auto& e : fs::directory_iterator(tiny_model)) fs::copy(e.path(), nomtp, fs::copy_options::overwrite_existing);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(nomtp + "/config.json"));
  cfg["num_nextn_predict_layers"] = 0;
  std::ofstream(nomtp + "/config.json") << cfg.dump();
  const CliRun none = dsv4_run("bench --model " + nomtp + " --prompt-len 4 --gen 1 --draft 1");
  EXPECT_EQ(none.status, 1);
  EXPECT_NE(none.err.find("has no MTP block"), std::string::npos) << none.err;
}

// --profile: per phase, the time inside matmul by weight and shape, and the rest; the rows
// account for every matmul (their weight bytes sum to the decode bytes per token).
TEST(Cli, BenchProfileAccountsForEveryMatmul) {
  CommandResult r = run_command(std::string(DSV4_BIN) + " bench --model " + tiny() +
                                "/model --prompt-len 16 --gen 4 --threads 2 --json --profile 2>/dev/null");
  ASSERT_EQ(r.status, 0);
  nlohmann::json j = nlohmann::json::parse(r.output);
  const nlohmann::json& p = j.at("profile");
  for (const char* phase : {"prefill", "decode"}) {
    const nlohmann::json& rows = p.at(phase).at("matmul");
    ASSERT_GT(rows.size(), 3u) << phase;
    double ms = 0;
    for (const auto& row : rows) {
      EXPECT_GT(row.at("calls").get<int64_t>(), 0);
      EXPECT_GT(row.at("gflop_s").get<double>(), 0.0);
      ms += row.at("ms").get<double>();
    }
    EXPECT_GT(ms, 0.0);
    EXPECT_GE(p.at(phase).at("other_ms").get<double>(), 0.0) << phase;
  }
  // Decode: GB/s x ms of every row = the weight bytes of all steps.
  double bytes = 0;
  for (const auto& row : p.at("decode").at("matmul")) bytes += row.at("gb_s").get<double>() * row.at("ms").get<double>() * 1e6;
  EXPECT_NEAR(bytes / 4, j.at("decode_bytes_per_token").get<double>(), 1e-2 * bytes / 4);  // 4 digits in JSON
  // The stages outside matmul that grow with the context are timed too (tiny-native has CSA,
  // HCA and window layers); the cache the sequence reached is within its reserved bound.
  std::set<std::string> stages;
  for (const auto& row : p.at("decode").at("stages")) stages.insert(row.at("what").get<std::string>());
  for (const char* s : {"indexer scan + top-k", "attend CSA", "attend HCA", "attend window", "compressor (entries)"})
    EXPECT_TRUE(stages.count(s)) << s;
  EXPECT_EQ(j.at("kv_positions").get<int64_t>(), 16 + 4);
  EXPECT_GT(j.at("kv_bytes").get<double>(), 0.0);
  EXPECT_LE(j.at("kv_bytes").get<double>(), j.at("kv_bound_bytes").get<double>());
  // Not with another device (usage error or, without one, the device's own error: never 0).
  EXPECT_NE(run_command(std::string(DSV4_BIN) + " bench --model " + tiny() + "/model --profile --device cuda 2>/dev/null").status, 0);
}

// --device: cpu (the default) runs as before; an unknown value is a usage error (exit 2); cuda
// without a usable device exits 1 with one line saying why — here forced by hiding every GPU
// (CUDA_VISIBLE_DEVICES=""), which also covers a build without CUDA (its own one-line reason).
TEST(Cli, DeviceOption) {
  const std::string dir = temp_dir("cli-device"), out = dir + "/l.npy";
  CliRun cpu = score(tiny() + "/model", out, "--device cpu --threads 2");
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  NpyF32 explicit_cpu = read_npy_f32(out);
  fs::remove(out);
  ASSERT_EQ(score(tiny() + "/model", out, "--threads 2").status, 0);
  EXPECT_EQ(read_npy_f32(out).data, explicit_cpu.data);
  fs::remove(out);

  for (const std::string& cmd : {"score --model " + tiny() + "/model " + tokens_arg() + " --out " + out,
                                "generate --model " + tiny() + "/model --prompt hi",
                                "bench --model " + tiny() + "/model --prompt-len 4 --gen 1"}) {
    CliRun bogus = dsv4_run(cmd + " --device bogus");
    EXPECT_EQ(bogus.status, 2) << cmd << ": " << bogus.err;
    EXPECT_NE(bogus.err.find("--device"), std::string::npos) << bogus.err;
    EXPECT_NE(bogus.err.find("bogus"), std::string::npos) << bogus.err;

    CommandResult c = run_command("CUDA_VISIBLE_DEVICES= " + std::string(DSV4_BIN) + " " + cmd + " --device cuda 2>&1 >/dev/null");
    SCOPED_TRACE(cmd);
    expect_one_line_error({c.status, c.output}, {"--device cuda"});
    const bool says_why = c.output.find("CUDA device") != std::string::npos || c.output.find("without CUDA") != std::string::npos;
    EXPECT_TRUE(says_why) << c.output;
  }
  EXPECT_FALSE(fs::exists(out));
  CommandResult help = run_command(std::string(DSV4_BIN) + " --help");
  EXPECT_NE(help.output.find("--device D"), std::string::npos);
  fs::remove_all(dir);
}

// Memory limits are refused before anything runs, with the sizes named; a checkpoint larger
// than the available memory is mapped and says so (DSV4_AVAILABLE_MEMORY plays a small machine).
TEST(Cli, MemoryLimitsRefusedUpFront) {
  const std::string m = " --model " + tiny() + "/model " + tokens_arg() + " --out " + temp_dir("cli-mem") + "/x.npy";
  expect_one_line_error(dsv4_run("score" + m + " --memory-budget 0.01"), {"positions", "reserves", "memory budget"});
  CliRun bad = dsv4_run("score" + m + " --memory-budget lots");
  EXPECT_EQ(bad.status, 2) << bad.err;
  const std::string small = "DSV4_AVAILABLE_MEMORY=100000 ";
  CliRun read = {};
  {
    CommandResult c = run_command(small + DSV4_BIN + " score" + m + " --load read 2>&1 >/dev/null");
    read = {c.status, c.output};
  }
  expect_one_line_error(read, {"--load read needs", "available", "--load mmap"});
  CommandResult mapped = run_command(small + DSV4_BIN + " score" + m + " --load mmap --memory-budget none 2>&1 >/dev/null");
  EXPECT_EQ(mapped.status, 0) << mapped.output;
  EXPECT_NE(mapped.output.find("exceed the available memory"), std::string::npos) << mapped.output;
}

// bench --chunk prefills in chunks (long prompts); the sequence reaches the same length.
TEST(Cli, BenchChunkedPrefill) {
  CommandResult r = run_command(std::string(DSV4_BIN) + " bench --model " + tiny() +
                                "/model --prompt-len 16 --chunk 5 --gen 2 --threads 2 --json 2>/dev/null");
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(nlohmann::json::parse(r.output).at("kv_positions").get<int64_t>(), 18);
  EXPECT_NE(run_command(std::string(DSV4_BIN) + " bench --model " + tiny() + "/model --chunk -1 2>/dev/null").status, 0);
}
