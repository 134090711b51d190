// dsv4 command-line interface: dispatch and help.
#include <cstdio>
#include <cstring>
#include <string>

#include "args.h"

using namespace dsv4;
using namespace dsv4::cli;

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
