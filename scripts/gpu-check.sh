#!/usr/bin/env bash
# GPU check for the device machine: configure + build the CUDA kernel library and its tests
# (Release, own build dir build-gpu/), run `ctest -L gpu --output-on-failure`, print a summary
# table. Exit status: ctest's, or 1 when tests were skipped although nvidia-smi sees a GPU (a
# driver/runtime mismatch would otherwise pass silently).
#
#   scripts/gpu-check.sh              # on the device machine (device tool: run it as the command)
#   scripts/gpu-check.sh --pack-deps  # here, once: copies googletest's sources and nlohmann_json
#                                     # into build-gpu-deps/ (git-ignored) for machines that lack
#                                     # them and cannot fetch: name build-gpu-deps in the run's carry
#
# After `ctest -L gpu` (the kernels' unit tests and the CUDA backend's end-to-end tests,
# tests/test_cuda_forward.cpp), when the built dsv4 has --device (docs/backend.md):
#   1. Golden logits through the CLI: `dsv4 score --device cuda` on every golden case
#      (tests/data/golden, ../shared/golden/small-native) against the float64 golden logits at
#      the case's thresholds, and against `dsv4 score --device cpu` (scripts/compare-logits.py,
#      needs python3, no numpy); with --mtp-out, the MTP logits against expected-mtp.npy too.
#   2. Chunk invariance through the CLI: --chunk 7 and all-decode == one-shot prefill (<= 1e-5).
#   3. Speed: `dsv4 bench --device cuda` on the tiny and small models ($DSV4_GPU_BENCH_MODEL adds
#      one more, e.g. a flash-proxy made with `dsv4 make-tiny --preset flash-proxy`); the
#      figures go into the log, not yet into docs/perf.md.
# Each step's result is in the summary; a failed step makes the exit status 1.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=${DSV4_GPU_DEPS_DIR:-build-gpu-deps}  # overridable for trying the script elsewhere
BUILD=${DSV4_GPU_BUILD_DIR:-build-gpu}

if [ "${1:-}" = "--pack-deps" ]; then
  rm -rf "$DEPS"
  mkdir -p "$DEPS/src" "$DEPS/prefix/include" "$DEPS/prefix/share/cmake"
  cp -r /usr/src/googletest "$DEPS/src/googletest"
  cp -r /usr/include/nlohmann "$DEPS/prefix/include/"
  cp -r /usr/share/cmake/nlohmann_json "$DEPS/prefix/share/cmake/"
  du -sh "$DEPS"
  exit 0
fi

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
command -v nvcc >/dev/null 2>&1 || { echo "gpu-check: nvcc not found" >&2; exit 1; }
command -v cmake >/dev/null 2>&1 || { echo "gpu-check: cmake not found" >&2; exit 1; }
JOBS=$(nproc)

echo "== device"
nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not available)"
nvcc --version | tail -1

# Dependencies carried from the development machine (see --pack-deps): googletest is built from
# source here so its library matches this machine's compiler and C library.
prefix_args=()
if [ -d "$DEPS" ]; then
  DEPS=$(cd "$DEPS" && pwd)
  if [ ! -f "$DEPS/prefix/lib/cmake/GTest/GTestConfig.cmake" ] && [ -d "$DEPS/src/googletest" ]; then
    echo "== building googletest from $DEPS/src/googletest"
    cmake -S "$DEPS/src/googletest" -B "$DEPS/gtest-build" -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
      -DINSTALL_GTEST=ON -DCMAKE_INSTALL_PREFIX="$DEPS/prefix" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
    cmake --build "$DEPS/gtest-build" -j"$JOBS" >/dev/null
    cmake --install "$DEPS/gtest-build" >/dev/null
  fi
  prefix_args=(-DCMAKE_PREFIX_PATH="$DEPS/prefix")
fi

echo "== configure ($BUILD, Release)"
gen_args=()
command -v ninja >/dev/null 2>&1 && [ ! -f "$BUILD/CMakeCache.txt" ] && gen_args=(-G Ninja)
mkdir -p "$BUILD"
if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDSV4_CUDA=ON -DDSV4_GPU_TESTS=ON ${gen_args[@]+"${gen_args[@]}"} \
  ${prefix_args[@]+"${prefix_args[@]}"} >"$BUILD/gpu-configure.log" 2>&1; then
  cat "$BUILD/gpu-configure.log" >&2
  echo "gpu-check: configure failed (missing GTest / nlohmann_json? see --pack-deps above)" >&2
  exit 1
fi
grep -E "^-- dsv4:" "$BUILD/gpu-configure.log" || true
grep -q "building dsv4cuda" "$BUILD/gpu-configure.log" || { echo "gpu-check: CMake found no CUDA compiler" >&2; exit 1; }

echo "== build (gpu tests, dsv4 and what they need)"
targets=(dsv4)
for f in tests/test_cuda_*.cpp; do targets+=("$(basename "$f" .cpp)"); done
cmake --build "$BUILD" -j"$JOBS" --target "${targets[@]}"

echo "== ctest -L gpu"
LOG="$BUILD/gpu-ctest.log"
set +e
(cd "$BUILD" && ctest -L gpu --output-on-failure) 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
set -e

# The CLI steps (see the header). Results as "name result" lines for the summary.
steps=()
step_failed=0
record() {  # record NAME COMMAND...: runs it, notes Passed/Failed
  local name=$1
  shift
  if "$@"; then steps+=("$name Passed"); else steps+=("$name Failed"); step_failed=1; fi
}
DSV4="$BUILD/dsv4"
if "$DSV4" --help 2>/dev/null | grep -- "--device" >/dev/null; then  # grep reads it all: no SIGPIPE
  if command -v python3 >/dev/null 2>&1; then
    echo "== golden logits and chunk invariance: dsv4 score --device cuda"
    for case in tests/data/golden/* ../shared/golden/small-native; do
      [ -f "$case/case.json" ] || continue
      name=$(basename "$case")
      toks=$(tr -d ' \n' < "$case/tokens.txt")
      ntok=$(echo "$toks" | tr ',' '\n' | wc -l)
      prefill=$(sed -n 's/.*"prefill": *\([0-9]*\).*/\1/p' "$case/case.json")
      o="$BUILD/gpu-logits-$name"
      score() { "$DSV4" score --model "$case/model" --tokens "$toks" --out "$@"; }
      mtp=()
      [ -f "$case/expected-mtp.npy" ] && mtp=(--mtp-out "$o-cuda-mtp.npy")
      record "cli.golden.$name.cuda" score "$o-cuda.npy" --device cuda --prefill "$prefill" "${mtp[@]}"
      record "cli.golden.$name.cpu" score "$o-cpu.npy" --device cpu --prefill "$prefill"
      record "cli.golden.$name.cuda_vs_golden" python3 scripts/compare-logits.py "$o-cuda.npy" "$case/expected.npy" \
        --case "$case/case.json" --label "$name cuda vs golden"
      if [ ${#mtp[@]} -gt 0 ]; then
        record "cli.golden.$name.cuda_mtp_vs_golden" python3 scripts/compare-logits.py "$o-cuda-mtp.npy" \
          "$case/expected-mtp.npy" --case "$case/case.json" --mtp --label "$name cuda MTP vs golden"
      fi
      record "cli.golden.$name.cuda_vs_cpu" python3 scripts/compare-logits.py "$o-cuda.npy" "$o-cpu.npy" --max-rel 2e-3 \
        --label "$name cuda vs cpu"
      record "cli.chunks.$name.oneshot" score "$o-all.npy" --device cuda --prefill "$ntok"
      record "cli.chunks.$name.chunk7" score "$o-c7.npy" --device cuda --prefill "$ntok" --chunk 7
      record "cli.chunks.$name.decode" score "$o-dec.npy" --device cuda --prefill 0
      record "cli.chunks.$name.chunk7_eq" python3 scripts/compare-logits.py "$o-c7.npy" "$o-all.npy" --max-rel 1e-5 \
        --label "$name cuda chunk 7 vs one-shot"
      record "cli.chunks.$name.decode_eq" python3 scripts/compare-logits.py "$o-dec.npy" "$o-all.npy" --max-rel 1e-5 \
        --label "$name cuda all-decode vs one-shot"
    done
  else
    echo "gpu-check: python3 not found: CLI golden comparison skipped" >&2
    steps+=("cli.golden NotRun")
    step_failed=1
  fi
  # Issue 5 asks for a clean compute-sanitizer memcheck of one full score run.
  san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [ -n "$san" ]; then
    echo "== compute-sanitizer memcheck: dsv4 score --device cuda (tiny-native)"
    case=tests/data/golden/tiny-native
    toks=$(tr -d ' \n' < "$case/tokens.txt")
    record "memcheck.score.tiny-native" "$san" --tool memcheck --error-exitcode 1 --leak-check full \
      "$DSV4" score --device cuda --model "$case/model" --tokens "$toks" --prefill 16 --chunk 7 \
      --out "$BUILD/gpu-memcheck.npy"
  else
    echo "gpu-check: compute-sanitizer not found: memcheck skipped" >&2
    steps+=("memcheck NotRun")
    step_failed=1
  fi
  echo "== bench --device cuda"
  for m in tests/data/golden/tiny-native/model ../shared/golden/small-native/model ${DSV4_GPU_BENCH_MODEL:-}; do
    [ -f "$m/config.json" ] || continue
    record "bench.cuda.$(basename "$(dirname "$m")")" "$DSV4" bench --device cuda --model "$m" --prompt-len 128 --gen 32
  done
else
  echo "gpu-check: $DSV4 has no --device option: CLI steps skipped"
fi

echo
echo "== summary"
awk '/Test +#[0-9]+: / {
       name = $0; sub(/.*Test +#[0-9]+: /, "", name); sub(/ .*/, "", name)
       res = "Failed"
       if ($0 ~ /Passed/) res = "Passed"; else if ($0 ~ /Skipped/) res = "Skipped"; else if ($0 ~ /Not Run/) res = "NotRun"
       tm = $0; if (match(tm, /[0-9.]+ sec/)) tm = substr(tm, RSTART, RLENGTH); else tm = "-"
       printf "  %-60s %-8s %s\n", name, res, tm
       n[res]++; total++
     }
     END {
       printf "  %-60s %s\n", "total", total
       for (r in n) printf "  %-60s %d\n", r, n[r]
     }' "$LOG"
if [ ${#steps[@]} -gt 0 ]; then
  printf '%s\n' "${steps[@]}" | awk '{ printf "  %-60s %s\n", $1, $2 }'
fi
[ -n "${OUT:-}" ] && [ -d "${OUT:-}" ] && cp "$LOG" "$OUT/" || true
[ "$step_failed" -ne 0 ] && [ "$status" -eq 0 ] && status=1

skipped=$(grep -cE "Test +#[0-9]+: .*Skipped" "$LOG" || true)
if [ "$status" -eq 0 ] && [ "${skipped:-0}" -gt 0 ] && nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: $skipped tests skipped although nvidia-smi sees a GPU (see the skip reason above)" >&2
  exit 1
fi
exit "$status"
