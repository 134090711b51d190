#!/usr/bin/env bash
# Usage: scripts/seed-ctest-costs.sh RECORD BUILD_DIR
# Gives a build directory that has no test timings yet the committed record RECORD (format of
# ctest's Testing/Temporary/CTestCostData.txt), so that ctest -jN starts the longest tests first.
# A directory with its own timings keeps them. Refresh a record by copying that file from a build
# that ran the whole tier (tests/ctest-costs.txt: build/, tests/ctest-costs-asan.txt: build-asan/, tests/ctest-costs-tsan.txt: build-tsan/).
set -euo pipefail
record="$1" dir="$2/Testing/Temporary"
[ -f "$dir/CTestCostData.txt" ] && exit 0
mkdir -p "$dir"
cp "$record" "$dir/CTestCostData.txt"
