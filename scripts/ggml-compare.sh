#!/usr/bin/env bash
# Batch-1 GEMV, ours (bench/qmatmul_bench) against ggml's CPU backend (bench/ggml_gemv.cpp), on
# the shapes of issue 17, interleaved in the same minutes, with a streaming-read bandwidth probe
# per round; prints one markdown table (GB/s of stored weight bytes, min / median / max over the
# rounds). Not run by CI.
#
# Usage: scripts/ggml-compare.sh GGML_SRC_DIR [ROUNDS]
#   GGML_SRC_DIR  a ggml source tree (github.com/ggml-org/ggml; never commit it into this repo)
#   ROUNDS        rounds of (probe, then every shape: ours and ggml), default 3
# Environment:
#   THREADS=2          threads on both sides
#   REPS=5             passes per measurement; a round's figure is the best pass
#   GIB=1              weights per shape and side, cycled (one matrix if one is larger). A comma
#                      list (e.g. 1,0.7,0.45) is taken in turn, round by round, the same for both
#                      sides: each size puts the weights in other physical pages. On session 46's
#                      VM (AMD Zen 5) a GEMV's speed depended on that placement by up to 50% on
#                      either side (steady within one run, different at another size; docs/perf.md
#                      "Session 46"), so a single size measures one placement.
#   JOBS=$(nproc)      build parallelism
#   DSV4_BUILD_DIR     our build (default build/; configured and qmatmul_bench built if needed)
#   GGML_BUILD_DIR     ggml's build (default build-ggml/, git-ignored); ggml is configured with its
#                      default options plus GGML_CMAKE_ARGS (default empty), libraries ggml + ggml-cpu
#   GGML_CMAKE_ARGS    extra ggml CMake options, e.g. "-DGGML_LLAMAFILE=ON" (llama.cpp's default)
#   ISA=native         native: both sides use what the CPU has (ggml's default GGML_NATIVE build);
#                      avx2: both sides limited to AVX2 + FMA + F16C, a stand-in for CPUs without
#                      AVX-512 (AMD Zen 2/3, Intel client cores): ours with --isa avx2, ggml built
#                      with GGML_NATIVE=OFF and its AVX2 options (default build dir build-ggml-avx2/)
#   OMP_WAIT_POLICY    passed through to ggml (its default build runs its threads under OpenMP, whose
#                      default spin-waiting collapses ggml's GEMV when another process takes a core;
#                      "passive" sleeps instead); printed in the table's header when set
#
# Each round: `qmatmul_bench --only bw` (streaming read of 1 GiB on THREADS threads), then for each
# shape ours and ggml's one after the other, the order swapped every round. Ours: `qmatmul_bench
# --only gemv --shape RxC --format F --no-probe`; ggml: `ggml_gemv --type T --shape RxC`, which
# places the weights as llama.cpp does (the first CPU extra buffer type that takes the mul_mat,
# e.g. CPU_REPACK: repacked at load) and computes one graph of one mul_mat per matrix per pass.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

if [[ $# -lt 1 || $# -gt 2 || ! -f "${1:-}/include/ggml.h" ]]; then
  echo "usage: $0 GGML_SRC_DIR [ROUNDS]   (GGML_SRC_DIR: a ggml source tree, with include/ggml.h)" >&2
  exit 2
fi
GGML_SRC=$(cd "$1" && pwd)
ROUNDS=${2:-3}
THREADS=${THREADS:-2}
REPS=${REPS:-5}
GIB=${GIB:-1}
IFS=, read -r -a GIBS <<<"$GIB"
for g in "${GIBS[@]}"; do
  [[ "$g" =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "GIB must be a number or a comma list of numbers, not '$GIB'" >&2; exit 2; }
done
JOBS=${JOBS:-$(nproc)}
DSV4_BUILD_DIR=${DSV4_BUILD_DIR:-$REPO/build}
GGML_BUILD_DIR_SET=${GGML_BUILD_DIR:-}
GGML_BUILD_DIR=${GGML_BUILD_DIR:-$REPO/build-ggml}
GGML_CMAKE_ARGS=${GGML_CMAKE_ARGS:-}
ISA=${ISA:-native}
OUR_ISA=()
case "$ISA" in
  native) ;;
  avx2)
    OUR_ISA=(--isa avx2)
    GGML_BUILD_DIR=${GGML_BUILD_DIR_SET:-$REPO/build-ggml-avx2}
    GGML_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF $GGML_CMAKE_ARGS"
    ;;
  *) echo "ISA must be native or avx2, not '$ISA'" >&2; exit 2 ;;
esac

# ---------------------------------------------------------------- builds
if [[ ! -f "$DSV4_BUILD_DIR/CMakeCache.txt" ]]; then
  echo "configuring dsv4 in $DSV4_BUILD_DIR (scripts/deps.sh installs what it needs)" >&2
  cmake -S "$REPO" -B "$DSV4_BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$DSV4_BUILD_DIR" -j"$JOBS" --target qmatmul_bench >/dev/null
OURS=$DSV4_BUILD_DIR/qmatmul_bench

if [[ ! -f "$GGML_BUILD_DIR/CMakeCache.txt" ]]; then
  echo "configuring ggml ($GGML_SRC) in $GGML_BUILD_DIR, default options ${GGML_CMAKE_ARGS}" >&2
  # shellcheck disable=SC2086
  cmake -S "$GGML_SRC" -B "$GGML_BUILD_DIR" $GGML_CMAKE_ARGS >/dev/null
fi
echo "building ggml (ggml, ggml-cpu) in $GGML_BUILD_DIR" >&2
cmake --build "$GGML_BUILD_DIR" -j"$JOBS" --target ggml ggml-cpu >/dev/null
# The libraries' directory: src/ in ggml's own layout (shared by default, static if configured so).
GGML_LIBDIR=$(dirname "$(find "$GGML_BUILD_DIR" -name 'libggml-base.*' -print -quit)")
DRIVER=$GGML_BUILD_DIR/ggml_gemv
# ggml trees from before its NVFP4 type (2026) lack GGML_TYPE_NVFP4: the NVFP4 row is left out.
HAVE_NVFP4=1
grep -q GGML_TYPE_NVFP4 "$GGML_SRC/include/ggml.h" || HAVE_NVFP4=0
if [[ ! -x "$DRIVER" || "$REPO/bench/ggml_gemv.cpp" -nt "$DRIVER" || "$GGML_LIBDIR/libggml-cpu.so" -nt "$DRIVER" ]]; then
  echo "building $DRIVER" >&2
  ${CXX:-c++} -O2 -std=c++17 -DDSV4_GGML_NVFP4=$HAVE_NVFP4 -I"$GGML_SRC/include" "$REPO/bench/ggml_gemv.cpp" -o "$DRIVER" \
    -L"$GGML_LIBDIR" -lggml -lggml-cpu -lggml-base -Wl,-rpath,"$GGML_LIBDIR" -fopenmp -lpthread
fi

# ---------------------------------------------------------------- runs
# shape, our format, ggml type
SHAPES=(
  "4096x2048 MXFP4 mxfp4"
  "2048x4096 MXFP4 mxfp4"
  "2048x4096 NVFP4 nvfp4"
  "4096x4096 FP8Block q8_0"
  "1024x4096 FP8Block q8_0"
  "129280x4096 BF16 bf16"
)
if ((!HAVE_NVFP4)); then
  for i in "${!SHAPES[@]}"; do
    if [[ "${SHAPES[$i]}" == *" nvfp4" ]]; then unset 'SHAPES[i]'; fi
  done
  SHAPES=("${SHAPES[@]}")
  echo "this ggml has no NVFP4 type: the NVFP4 row is left out" >&2
fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
LOG=$GGML_BUILD_DIR/ggml-compare.log
: >"$LOG"

ours() {  # shape format -> GB/s (best pass)
  local line
  line=$("$OURS" "${OUR_ISA[@]}" --only gemv --shape "$1" --format "$2" --no-probe --threads "$THREADS" --reps "$REPS" --gib "$RGIB" |
    tee -a "$LOG" | awk -v f="$2" '$1 == f { print $4 }')
  [[ -n "$line" ]] || { echo "qmatmul_bench gave no $2 row (see $LOG)" >&2; exit 1; }
  echo "$line"
}
theirs() {  # shape type -> "GB/s buffer-type" (best pass)
  local line
  line=$("$DRIVER" --type "$2" --shape "$1" --threads "$THREADS" --reps "$REPS" --gib "$RGIB" | tee -a "$LOG")
  awk '{ for (i = 1; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] } print v["best"], v["buft"] }' <<<"$line"
}

GGML_REV=""
[[ -e "$GGML_SRC/.git" ]] && GGML_REV=" ($(git -C "$GGML_SRC" rev-parse --short HEAD 2>/dev/null || echo '?'))"
CPU=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
START=$(date -u '+%Y-%m-%d %H:%M UTC')
LOAD0=$(uptime | sed 's/.*load average: //')
echo "$START, CPU \"$CPU\", $THREADS threads, $ROUNDS rounds, load average $LOAD0" >&2
for ((r = 1; r <= ROUNDS; ++r)); do
  bw=$("$OURS" --only bw --threads "$THREADS" --reps "$REPS" | tee -a "$LOG" | awk '/read bandwidth/ { print $(NF-1) }')
  echo "$bw" >>"$OUT/bw"
  RGIB=${GIBS[$(((r - 1) % ${#GIBS[@]}))]}
  echo "round $r: read bandwidth $bw GB/s; $RGIB GiB per shape and side" >&2
  for i in "${!SHAPES[@]}"; do
    read -r shape fmt type <<<"${SHAPES[$i]}"
    if ((r % 2)); then
      a=$(ours "$shape" "$fmt"); b=$(theirs "$shape" "$type")
    else
      b=$(theirs "$shape" "$type"); a=$(ours "$shape" "$fmt")
    fi
    read -r bgb buft <<<"$b"
    echo "$a" >>"$OUT/ours.$i"
    echo "$bgb" >>"$OUT/ggml.$i"
    echo "$buft" >"$OUT/buft.$i"
    awk -v a="$a" -v b="$bgb" 'BEGIN { printf "%.3f\n", b / a }' >>"$OUT/ratio.$i"
    echo "  $shape: ours $fmt $a GB/s, ggml $type ($buft) $bgb GB/s" >&2
  done
done
LOAD1=$(uptime | sed 's/.*load average: //')

# min / median / max of a file of numbers (median: the middle one, the upper middle if even).
mmm() { sort -g "$1" | awk -v d="${2:-2}" '{ v[NR] = $1 } END { printf "%.*f / %.*f / %.*f", d, v[1], d, v[int(NR / 2) + 1], d, v[NR] }'; }

echo
echo "ggml-compare: $START, CPU \"$CPU\", $THREADS threads, $ROUNDS rounds (best of $REPS passes each),"
echo "~$GIB GiB of weights per shape and side (a list: by round); load average before: $LOAD0; after: $LOAD1"
echo "ISA: $ISA; ggml: $GGML_SRC$GGML_REV, default CMake options${GGML_CMAKE_ARGS:+ + $GGML_CMAKE_ARGS}${OMP_WAIT_POLICY:+, OMP_WAIT_POLICY=$OMP_WAIT_POLICY}; GB/s of stored weight bytes"
echo
echo "| shape (rows x cols) | ours / ggml format | ours GB/s min / median / max | ggml GB/s min / median / max | ggml / ours per round, min / median / max |"
echo "|---|---|---|---|---|"
for i in "${!SHAPES[@]}"; do
  read -r shape fmt type <<<"${SHAPES[$i]}"
  echo "| $shape | $fmt / $type ($(cat "$OUT/buft.$i")) | $(mmm "$OUT/ours.$i") | $(mmm "$OUT/ggml.$i") | $(mmm "$OUT/ratio.$i") |"
done
echo "| streaming-read probe | | $(mmm "$OUT/bw") | | |"
