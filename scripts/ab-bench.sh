#!/usr/bin/env bash
# Two builds of a benchmark, alternating: A, B, A, B, ... PAIRS times, then the per-pair ratios
# B / A sorted, with their median. On a machine whose memory speed moves 20-40% from minute to
# minute (docs/perf.md), a ratio within a pair is readable where single runs are not.
#
# Usage: scripts/ab-bench.sh BIN_A BIN_B PAIRS PICK -- ARGS...
#   BIN_A, BIN_B  the two binaries (e.g. qmatmul_bench of two commits, copied aside first)
#   PAIRS         how many A, B pairs
#   PICK          the figure to compare, from each run's output: "LINE_REGEX:FIELD" takes field
#                 FIELD (awk numbering) of the last line matching LINE_REGEX
#   ARGS          the benchmark's arguments, the same for both
# Example (the GEMV at 2 tokens, best GB/s of the last table row):
#   scripts/ab-bench.sh /tmp/qb-old build/qmatmul_bench 6 'MXFP4:4' -- --only gemv --tokens 2 \
#     --shape 2048x4096 --format MXFP4 --gib 0.5 --reps 3 --no-probe
# Environment: A_ENV / B_ENV, variables set for A's / B's runs only (e.g. B_ENV="DSV4_ISA=avx2").
#   PINNED=1: run A and B at the same time, one per core (taskset; cores 0 and 1, swapped every
#   pair), for single-threaded benchmarks (--threads 1) whose data stay in the core's L2: both
#   runs then see the same minute of the host (on session 37's Ice Lake VM, the best values of
#   pinned pairs repeated to 1% for a while when back-to-back runs moved 30%; later in the
#   same session they too moved 20%: still read the median of several pairs).
set -euo pipefail
if [[ $# -lt 5 || "$5" != "--" ]]; then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
A=$1 B=$2 PAIRS=$3 PICK=$4
shift 5
REGEX=${PICK%:*} FIELD=${PICK##*:}
[[ "$FIELD" =~ ^[0-9]+$ && "$PAIRS" =~ ^[1-9][0-9]*$ ]] || { echo "ab-bench: bad PAIRS '$PAIRS' or PICK '$PICK'" >&2; exit 2; }

pick() {  # env-assignments binary args... -> the picked figure
  local envs=$1 bin=$2 out v
  shift 2
  # shellcheck disable=SC2086  # envs is a list of assignments
  out=$(env $envs "$bin" "$@" 2>&1) || { echo "ab-bench: $bin failed:" >&2; echo "$out" | tail -5 >&2; exit 1; }
  v=$(awk -v re="$REGEX" -v f="$FIELD" '$0 ~ re { v = $f } END { print v }' <<<"$out")
  [[ "$v" =~ ^[0-9.eE+-]+$ ]] || { echo "ab-bench: no number at '$PICK' in $bin's output:" >&2; echo "$out" | tail -5 >&2; exit 1; }
  echo "$v"
}

echo "A = $A${A_ENV:+ ($A_ENV)}, B = $B${B_ENV:+ ($B_ENV)}$([[ "${PINNED:-0}" == 1 ]] && echo ", pinned side by side"), $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(date -u '+%Y-%m-%d %H:%M UTC')"
ratios=()
if [[ "${PINNED:-0}" == 1 ]]; then
  command -v taskset >/dev/null || { echo "ab-bench: PINNED=1 needs taskset (util-linux)" >&2; exit 2; }
  [[ $(nproc) -ge 2 ]] || { echo "ab-bench: PINNED=1 needs two cores" >&2; exit 2; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
fi
for ((i = 1; i <= PAIRS; ++i)); do
  if [[ "${PINNED:-0}" == 1 ]]; then
    ca=$(((i + 1) % 2)) cb=$((i % 2))  # A on core 0 in odd pairs, core 1 in even ones
    pick "${A_ENV:-}" taskset -c "$ca" "$A" "$@" >"$tmp/a" &
    pa=$!
    pick "${B_ENV:-}" taskset -c "$cb" "$B" "$@" >"$tmp/b" || { wait "$pa" || true; exit 1; }
    wait "$pa" || exit 1
    a=$(cat "$tmp/a") b=$(cat "$tmp/b")
  else
    a=$(pick "${A_ENV:-}" "$A" "$@")
    b=$(pick "${B_ENV:-}" "$B" "$@")
  fi
  r=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')
  ratios+=("$r")
  echo "pair $i: A $a  B $b  B/A $r"
done
printf '%s\n' "${ratios[@]}" | sort -g | awk '{ v[NR] = $1 } END {
  printf "B/A sorted:"; for (i = 1; i <= NR; ++i) printf " %s", v[i]
  printf "   median %s\n", v[int(NR / 2) + 1] }'
