#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang + ASan + UBSan into build-fuzz/ and runs
# each for a bounded time (DSV4_FUZZ_SECONDS, default 30) from the committed corpus, as many at
# once as there are cores. A crash, sanitizer report, leak or timeout fails the run; the input is
# kept in build-fuzz/artifacts/ and belongs in tests/fuzz/corpus/<target>/ once fixed
# (docs/fuzzing.md).
# Usage: scripts/fuzz.sh [target ...]   (default: checkpoint tokenizer tokenizer_json chat server_request json_grammar)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${DSV4_FUZZ_SECONDS:-30}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(checkpoint tokenizer tokenizer_json chat server_request json_grammar)
CXX_FUZZ="$(command -v clang++ || command -v clang++-14 || true)"
[ -n "$CXX_FUZZ" ] || { echo "fuzz: clang++ not found (apt-get install clang)" >&2; exit 1; }
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$CXX_FUZZ" \
  -DDSV4_FUZZ=ON -DDSV4_CUDA=OFF -DDSV4_CUDA_EMU=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}") >/dev/null
mkdir -p build-fuzz/artifacts
export DSV4_TOKENIZER="${DSV4_TOKENIZER:-$PWD/build/deps/tokenizer/tokenizer.json}"

# One target: its run's summary line in build-fuzz/result-$t, "FAILED" in build-fuzz/failed-$t.
fuzz_one() {
  local t=$1 work="build-fuzz/corpus-$1" log="build-fuzz/fuzz-$1.log" dict=() runs rate cov
  rm -rf "$work" && mkdir -p "$work"
  cp tests/fuzz/corpus/"$t"/* "$work"/
  [ -f tests/fuzz/"$t".dict ] && dict=(-dict=tests/fuzz/"$t".dict)  # tokens of structured inputs
  if build-fuzz/tests/fuzz_"$t" "$work" ${dict[@]+"${dict[@]}"} -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
       -artifact_prefix=build-fuzz/artifacts/"$t"- >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz $t: ${runs:-?} executions in ${secs}s (${rate:-?}/s), $cov, corpus $(ls "$work" | wc -l) inputs, no failure" >"build-fuzz/result-$t"
  else
    echo "fuzz $t: FAILED (see $log; input in build-fuzz/artifacts/)" >"build-fuzz/result-$t"
    touch "build-fuzz/failed-$t"
  fi
}

# One fuzzer per core at a time (each is single-threaded and gets its full time).
rm -f build-fuzz/result-* build-fuzz/failed-*
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
  fuzz_one "$t" &
done
wait
status=0
for t in "${targets[@]}"; do
  if [ -f "build-fuzz/failed-$t" ] || [ ! -f "build-fuzz/result-$t" ]; then
    cat "build-fuzz/result-$t" >&2 2>/dev/null || echo "fuzz $t: FAILED before its run (see above)" >&2
    tail -30 "build-fuzz/fuzz-$t.log" >&2 2>/dev/null || true
    status=1
  else
    cat "build-fuzz/result-$t"
  fi
done
exit $status
