#!/usr/bin/env bash
# `mpirun -np N dsv4 generate|chat --parallel ep` prints the same text as one process: greedy
# with speculative drafts (MTP block, draft / truncate requests), seeded sampling, and a
# three-turn chat (each turn restores the conversation's snapshot or extends it: snapshot /
# restore / drop requests); and plain greedy under --parallel tp (ids-only steps). On the demo
# model (real tokenizer). Exit 77 (skipped) without the tokenizer.
# usage: generate.sh MPIEXEC DSV4 TOKENIZER_DIR NP WORKDIR
set -euo pipefail
mpiexec=$1 bin=$2 tok=${DSV4_TOKENIZER_DIR:-$3} np=$4 work=$5  # the sanitizer tier names the tokenizer
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
# Plain greedy under TP: the leader's decode steps ask for ids only, and it must still take part in
# the head's gather the followers run (Model::run picks on the host under TP).
args=(generate --model "$work/m" --prompt 'Hello there, how are you' --mode chat -n 12 --threads 1 --temperature 0)
"$bin" "${args[@]}" >"$work/one.txt" 2>/dev/null
timeout 300 "$mpiexec" --oversubscribe --allow-run-as-root -np "$np" "$bin" "${args[@]}" --parallel tp >"$work/par.txt" 2>/dev/null
cmp "$work/one.txt" "$work/par.txt" || { echo "FAIL (greedy, tp):"; cat "$work/one.txt"; echo; cat "$work/par.txt"; exit 1; }
echo "np $np generate --temperature 0 --parallel tp: same text as one process"
# Chat: stdin goes to rank 0 (mpirun forwards it there).
chat=(chat --model "$work/m" --mode chat -n 8 --threads 1 --temperature 0)
printf 'Hello there\nAnd again?\n/reset\nOnce more\n' | "$bin" "${chat[@]}" >"$work/one.txt" 2>/dev/null
printf 'Hello there\nAnd again?\n/reset\nOnce more\n' |
  timeout 300 "$mpiexec" --oversubscribe --allow-run-as-root -np "$np" "$bin" "${chat[@]}" --parallel ep >"$work/par.txt" 2>/dev/null
[ "$(tr -d " \n" <"$work/one.txt" | wc -c)" -gt 0 ] || { echo "FAIL: chat printed no text"; exit 1; }
cmp "$work/one.txt" "$work/par.txt" || { echo "FAIL (chat):"; cat "$work/one.txt"; echo; cat "$work/par.txt"; exit 1; }
echo "np $np chat (3 turns, a reset): same text as one process"
