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
# Only the kernel library and its unit tests exist so far (issue 5; docs/cuda.md). The steps
# that need the backend wiring are listed below and deliberately NOT run by this script,
# because the commands do not exist yet (no --device option in the CLI):
#   1. Golden logits, GPU vs CPU:  dsv4 score --device cuda <model> <golden case>  compared with
#      the float64 golden logits at the CPU's thresholds (tests/test_golden.cpp), for the tiny
#      cases in tests/data/golden and small-native from ../shared.
#   2. Chunk invariance on the GPU: prefill in chunks 1/3/7/all == one-shot, as test_golden.cpp.
#   3. Speed:  dsv4 bench --device cuda  (decode tok/s vs HBM bandwidth, prefill vs FP32 peak),
#      figures into docs/perf.md.
# When they exist, add them after the ctest step below and to the summary table.
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
if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDSV4_CUDA=ON ${gen_args[@]+"${gen_args[@]}"} \
  ${prefix_args[@]+"${prefix_args[@]}"} >"$BUILD/gpu-configure.log" 2>&1; then
  cat "$BUILD/gpu-configure.log" >&2
  echo "gpu-check: configure failed (missing GTest / nlohmann_json? see --pack-deps above)" >&2
  exit 1
fi
grep -E "^-- dsv4:" "$BUILD/gpu-configure.log" || true
grep -q "building dsv4cuda" "$BUILD/gpu-configure.log" || { echo "gpu-check: CMake found no CUDA compiler" >&2; exit 1; }

echo "== build (gpu tests and what they need)"
targets=()
for f in tests/test_cuda_*.cpp; do targets+=("$(basename "$f" .cpp)"); done
cmake --build "$BUILD" -j"$JOBS" --target "${targets[@]}"

echo "== ctest -L gpu"
LOG="$BUILD/gpu-ctest.log"
set +e
(cd "$BUILD" && ctest -L gpu --output-on-failure) 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
set -e

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
[ -n "${OUT:-}" ] && [ -d "${OUT:-}" ] && cp "$LOG" "$OUT/" || true

skipped=$(grep -cE "Test +#[0-9]+: .*Skipped" "$LOG" || true)
if [ "$status" -eq 0 ] && [ "${skipped:-0}" -gt 0 ] && nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: $skipped tests skipped although nvidia-smi sees a GPU (see the skip reason above)" >&2
  exit 1
fi
exit "$status"
