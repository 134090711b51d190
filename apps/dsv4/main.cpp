// dsv4 command-line interface: dispatch and help.
#include <malloc.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "args.h"
#include "engine/cluster.h"

using namespace dsv4;
using namespace dsv4::cli;

namespace {

const char* kHelp = R"(dsv4 - DeepSeek-V4 inference engine (CPU reference backend; an experimental CUDA
backend behind --device cuda, not yet validated on a GPU)

Usage: dsv4 <command> [options]

Commands:
  score       Run the model over token sequences and write the logits of every position.
      --model DIR        checkpoint directory (config.json + *.safetensors [+ index])
      --tokens LIST      comma-separated token ids, e.g. 5,17,42; give it several times to score
                         several sequences through shared batched steps (one --out each)
      --prefill P        the first P tokens go in as prefill (default: all); the rest are
                         fed one at a time as decode steps
      --chunk C          prefill chunk size (default: all of the prefill in one chunk)
      --threads N        worker threads (default: all cores)
      --load M           auto | mmap | read: map the checkpoint files, or read them into
                         memory (faster decode, costs a copy at start: several reads at once,
                         a progress line every 10 s when over 1 GiB); auto reads when the
                         weights take at most half of the available memory (default auto);
                         read refuses weights larger than the available memory; mmap of such
                         a checkpoint works (decode then runs at disk speed) and says so
      --memory-budget M  MB the sequences' caches may reserve together, auto (90% of the memory
                         available after loading; default) or none; a sequence that would not
                         fit at its longest is refused before anything runs
      --out F.npy        output: float32 NumPy array [T, vocab] (once per --tokens, in order)
      --mtp-out F.npy    (one sequence) also the MTP block's logits [T-1, vocab]: row t is the
                         block at position t given token t+1, predicting token t+2
      --device D         cpu | cuda (default cpu). cuda needs a dsv4 built with CUDA and a
                         usable GPU, else exits 1 saying which is missing; its caches are
                         sized for the longest sequence given; --mtp-out works on both
      --parallel P       ep | tp | ep+tp, under `mpirun -np N` (score, generate, chat,
                         bench): ep splits the routed experts by id across the N processes,
                         tp the attention heads (by output group) and the head's vocabulary
                         rows; the rest is on each; rank 0 runs the command, the others follow
                         it; logits bit-identical to one process (docs/parallel.md). Every
                         rank needs the same arguments and the checkpoint at the same path

  make-tiny   Write a random checkpoint at small dimensions that exercises every layer kind
              (window-only, CSA, HCA, hash-routed MoE, MTP).
      --out DIR          output directory (created)
      --preset NAME      tiny | small | demo | flash-proxy (default tiny); demo has the real
                         129280-token vocabulary so it can be paired with the real tokenizer;
                         flash-proxy has V4-Flash layer dimensions (4 layers, 32 experts,
                         an MTP block, ~5 GB)
      --format F         native | nvfp4 | hf-bf16 (default native)
      --seed S           random seed (default 0)
      --shards N         number of safetensors shards (default 1)
      --tokenizer DIR    copy DIR/tokenizer.json (or a tokenizer.json file) into the model

  generate    Render a one-user-turn chat, generate, and stream the answer to stdout.
      --model DIR        model directory (holds tokenizer.json unless --tokenizer is given)
      --prompt TEXT      the user message (raw mode: the whole prompt text)
      --mode M           thinking | chat | raw (default thinking; raw applies no template)
      -n N               max new tokens (default 256)
      --temperature T    0 = greedy (default 0)
      --top-k K          keep the K most likely tokens (default 0 = off)
      --top-p P          nucleus sampling mass (default 1 = off)
      --min-p P          drop tokens below P x the best token's probability (default 0 = off)
      --repetition-penalty R, --presence-penalty P   penalties on tokens already seen
      --seed S           sampling seed (default 0); same seed, same output
      --stop STR         stop before this text (may be given several times); EOS always stops
      --hide-reasoning   do not print the reasoning (thinking mode); by default it streams to
                         stderr as it comes, dimmed on a terminal, else between [reasoning]
                         and [/reasoning] lines
      --draft N          speculative decoding: the MTP block drafts N tokens (1..16) that
                         the model verifies in one step, keeping each while the sampler picks
                         it; output identical to the same options without --draft (greedy or
                         seeded); acceptance is reported on stderr; what a draft costs on
                         this machine: `dsv4 bench --draft 1,2`
      --reasoning-effort E   high (the default) | max: max adds the official encoder's
                         maximum-effort instruction
      --json-object      the answer (after the reasoning in thinking mode) is one JSON object:
                         tokens that cannot continue it are masked (drafts, too, are
                         checked through the mask: the same answer)
      --json-schema F    the same, an object of the JSON schema in file F (the subset
                         docs/server.md lists; other keywords are an error naming them), also
                         shown to the model in the system message
      --tokenizer DIR    tokenizer.json location (default: the model directory)
      --context N        context limit in tokens (default: the model's max positions)
      --chunk C, --threads N   prefill chunk size, worker threads
      --load M, --memory-budget M   (see score); the conversation reserves cache for
                         --context positions up front
      --device D         cpu | cuda (see score); on cuda the caches are sized for --context,
                         which defaults to min(max positions, 8192) there
      A timing summary (prompt tokens, prefill and decode tok/s) goes to stderr.

  chat        Interactive multi-turn chat on stdin/stdout through the chat encoding.
              Same options as generate except --prompt (and --mode: thinking | chat);
              also --system TEXT.
              Each turn reuses the conversation's state and prefills only what is new.
              Commands: /reset clears the conversation, /exit quits.

  tokenize    Print the token ids of a text (no BOS is added).
      --tokenizer DIR    directory holding tokenizer.json (or the file itself)
      --text T | --file F
      --json             print a JSON array instead of comma-separated ids

  detokenize  Print the text of token ids.
      --tokenizer DIR, --ids 1,2,3

  chat-template  Render messages with the DeepSeek-V4 chat encoding.
      --messages F.json  a list of OpenAI-style messages (or a request body with "messages"
                         and "tools")
      --mode M           thinking | chat (default thinking)
      --reasoning-effort E   high | max (see generate)
      --ids --tokenizer DIR   print the prompt's token ids instead of its text

  inspect     Describe a checkpoint: layout and formats, config summary, layer kinds, bytes
              per dtype.
      --model DIR
      --parallel P --world N   (P: ep | tp | ep+tp) also each rank's share, resident
                         weight bytes and bytes sent per decoded token for N processes

  bench       Measure prefill and decode speed against this machine's limits, measured in the
              same run (streaming-read bandwidth, FMA peak).
      --model DIR
      --prompt-len N     prefill length (default 512)
      --gen N            decode steps (default 16)
      --chunk C          prefill in chunks of C tokens (default 0: one step); long prompts
                         need it, a step's activations grow with its tokens
      --batch LIST       decode batch sizes, e.g. 1,2,4,8 (default 1): B sequences forked
                         from the prefilled one decode together; a table of aggregate tok/s,
                         weight bytes per step and their share of the bandwidth
      --draft LIST       also speculative decode with the MTP block, e.g. 1,2,3 drafts per
                         step (1..16; needs 1 in --batch): per count, the time of a step
                         (drafting, checking, rewinding) in plain steps, the drafts accepted
                         and the acceptance rate at which drafting breaks even. Random
                         weights accept no drafts: on them only the cost is real
      --threads N        worker threads (default: all cores)
      --load M, --memory-budget M   (see score)
      --device D         cpu | cuda (see score; --batch forks there too). On cuda only
                         prefill and decode tok/s are measured: the host limits, byte/FLOP
                         counts and roofline ratios are 0
      --json             one JSON object: prefill_tok_s, decode_tok_s, decode_bytes_per_token,
                         mem_bw_gb_s, peak_gflop_s, decode_roofline_ratio,
                         prefill_roofline_ratio, peak_rss_mb, threads, load, device, ...
      --profile          (cpu) also time every matmul: a table per phase of time, GB/s and
                         GFLOP/s by weight format and shape, and the time outside matmul
                         (JSON: "profile"). Two clock reads per call; the figures barely move

  serve       OpenAI- and Anthropic-compatible HTTP server with continuous batching and a
              prefix cache (docs/server.md): POST /v1/chat/completions, /v1/completions,
              /v1/responses (+ GET/DELETE /v1/responses/ID, POST /v1/responses/input_tokens),
              /v1/messages (+ /v1/messages/count_tokens); GET /v1/models, /health, /metrics,
              / (what is served).
      --model DIR        model directory with tokenizer.json (or --tokenizer DIR)
      --host H           address to listen on (default 127.0.0.1: this machine only)
      --port P           port (default 8080; 0 = any free port, printed when ready)
      --api-key KEY      require "Authorization: Bearer KEY" (or "x-api-key: KEY")
      --model-name NAME  the model id /v1/models lists (default: the directory's name)
      --ctx-size N       positions a sequence may hold (default: the model's max positions)
      --max-batch N      sequences decoding together (default 16)
      --step-tokens N    tokens per engine step: decode tokens + prefill chunks (default 256)
      --step-tokens-decoding N   the same while some sequence is decoding (default 64): a
                         smaller budget bounds each stream's time per token while prompts are
                         read (at least 32 prompt tokens per step either way)
      --max-queue N      requests waiting for memory or a batch slot before 503 (default 64)
      --kv-budget MB     cache bytes the running sequences may reserve (each reserves prompt +
                         max_tokens positions; default: --memory-budget's auto); a request
                         that does not fit waits, one that never can gets a 400
      --cache-budget MB  prefix-cache snapshots (default 1024; 0 = off)
      --cache-dir DIR    also keep the snapshots at the end of prompts and answers, and of
                         prefixes prompts shared, as files in DIR (made if missing), so a
                         restarted server does not read its long prompts again; files of
                         another model or build of dsv4 are left alone, never read (cpu, one
                         process)
      --cache-dir-budget MB   bytes of those files, least recently used deleted first
                         (default 10240)
      --max-tokens N     max_tokens when a request gives none (default 4096)
      --timeout S        cancel a request running longer than S seconds (default 600)
      --stall-timeout S  drop a client that takes no byte of its answer for S seconds
                         (default 30); a stream whose client stops reading is paused once
                         the socket buffers are full, then dropped after S seconds
      --read-timeout S   close a connection that sends no complete request within S seconds
                         of opening (or of its previous answer; default 60), so clients that
                         trickle requests cannot hold the server's threads
      --draft N          speculative decoding: the MTP block drafts N tokens (1..16) per
                         decoding stream and step, which the model verifies in the same step;
                         answers are identical to those without it (greedy or seeded); the
                         model needs its MTP block. Pays when the drafts are often right and
                         the step is memory-bound (few streams); each draft is one pass of the
                         MTP block and the output head (V4: ~1 GB read), so 1-2 on a CPU
                         (`dsv4 bench --draft 1,2` measures the cost); /metrics counts drafts
      --threads N, --load M, --memory-budget M   (see score)
      --quiet            no log line per request
      SIGINT / SIGTERM stop it; requests in flight end with an error.

  help, --help, -h       this text; `dsv4 COMMAND --help` shows COMMAND's part of it

Errors print one line to stderr and exit with status 1 (2 for bad usage).
)";

int run(int argc, char** argv);

// `dsv4 CMD --help`: the usage line and CMD's own section of kHelp (from its line "  CMD  ..." to
// the next command's), or "" when kHelp has no such command. One text, so the two never differ.
std::string command_help(const std::string& cmd) {
  const std::string all = kHelp;
  const std::string head = "\n  " + cmd + " ";
  const size_t start = all.find(head);
  if (cmd.empty() || start == std::string::npos) return "";
  size_t end = start + 1;
  // The next line indented by exactly two spaces starts the next command (options sit deeper).
  for (size_t nl = all.find('\n', end); nl != std::string::npos; nl = all.find('\n', nl + 1)) {
    if (all.compare(nl + 1, 2, "  ") == 0 && nl + 3 < all.size() && all[nl + 3] != ' ') {
      end = nl + 1;
      break;
    }
  }
  std::string out = "Usage: dsv4 " + cmd + " [options]\n\n" + all.substr(start + 1, end - start - 1);
  while (out.size() > 1 && out[out.size() - 1] == '\n' && out[out.size() - 2] == '\n') out.pop_back();
  // Sections that point at another command's options say where to read them.
  for (const std::string other : {"score", "generate"})
    if (cmd != other && (out.find("(see " + other) != std::string::npos || out.find("as " + other) != std::string::npos))
      out += "\nOptions described under " + other + ": `dsv4 " + other + " --help`.\n";
  return out + "\nErrors print one line to stderr and exit with status 1 (2 for bad usage).\n";
}

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun every rank starts here with the same arguments: rank 0 runs the command, the
  // others follow its engine (engine/cluster.h) and exit with its status.
  std::unique_ptr<Cluster> cluster;
  try {
    cluster = std::make_unique<Cluster>(&argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
    return 1;
  }
  if (!cluster->argument_mismatch().empty()) {
    if (cluster->leader()) std::fprintf(stderr, "dsv4: error: %s\n", cluster->argument_mismatch().c_str());
    return 2;
  }
  if (!cluster->leader()) return cluster->follow();
  const int status = run(argc, argv);
  cluster->finish(status);
  return status;
}

namespace {

int run(int argc, char** argv) {
  // Per-step buffers outside the forward's arena (logits, attention scratch) would otherwise be
  // fresh mmaps, zeroed by the kernel on every decode step; keep them in the reusable heap.
  // 32 MiB is the largest threshold glibc accepts (a larger value is ignored).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
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
        const std::string own = command_help(cmd);
        if (own.empty()) throw Usage("unknown command '" + cmd + "' (try dsv4 --help)");
        std::fputs(own.c_str(), stdout);
        return 0;
      }
    // Options that take no value, per command ("--ids" is a value for detokenize).
    std::set<std::string> flags = {"hide-reasoning", "json", "json-object", "profile", "quiet"};
    if (cmd == "chat-template") flags.insert("ids");
    Args args(argc, argv, 2, flags);
    if (cmd == "score") return cmd_score(args);
    if (cmd == "make-tiny") return cmd_make_tiny(args);
    if (cmd == "inspect") return cmd_inspect(args);
    if (cmd == "bench") return cmd_bench(args);
    if (cmd == "generate") return cmd_generate(args);
    if (cmd == "chat") return cmd_chat(args);
    if (cmd == "tokenize") return cmd_tokenize(args);
    if (cmd == "detokenize") return cmd_detokenize(args);
    if (cmd == "chat-template") return cmd_chat_template(args);
    if (cmd == "serve") return cmd_serve(args);
    throw Usage("unknown command '" + cmd + "' (try dsv4 --help)");
  } catch (const Usage& e) {
    std::fprintf(stderr, "dsv4: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace
