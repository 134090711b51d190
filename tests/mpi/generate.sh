#!/usr/bin/env bash
# `mpirun -np N dsv4 generate --parallel ep` prints the same text as one process: greedy with
# speculative drafts (MTP block, draft / truncate requests), then seeded sampling, on the demo
# model (real tokenizer). Exit 77 (skipped) without the tokenizer.
# usage: generate.sh MPIEXEC DSV4 TOKENIZER_DIR NP WORKDIR
set -euo pipefail
mpiexec=$1 bin=$2 tok=$3 np=$4 work=$5
[ -f "$tok/tokenizer.json" ] || { echo "no tokenizer at $tok (scripts/fetch-tokenizer.sh)"; exit 77; }
mkdir -p "$work"
[ -f "$work/m/config.json" ] || "$bin" make-tiny --out "$work/m" --preset demo --seed 2 --tokenizer "$tok" 2>/dev/null
for opts in "--temperature 0 --draft 3" "--temperature 0.8 --top-p 0.9 --seed 7"; do
  # shellcheck disable=SC2086
  args=(generate --model "$work/m" --prompt 'Hello there, how are you' --mode chat -n 12 --threads 1 $opts)
  "$bin" "${args[@]}" >"$work/one.txt" 2>/dev/null
  timeout 300 "$mpiexec" --oversubscribe --allow-run-as-root -np "$np" "$bin" "${args[@]}" --parallel ep >"$work/par.txt" 2>/dev/null
  [ -s "$work/one.txt" ] || { echo "FAIL: no text generated"; exit 1; }
  cmp "$work/one.txt" "$work/par.txt" || { echo "FAIL ($opts):"; cat "$work/one.txt"; echo; cat "$work/par.txt"; exit 1; }
  echo "np $np generate $opts: same text as one process"
done
