#!/usr/bin/env bash
# `mpirun -np N dsv4 score --parallel MODE` against the one-process score of a golden case:
# the logits (and the MTP block's) must be the same bytes. Chunked prefill then one-by-one
# decode, so both the batched and the one-row paths of the exchange are compared.
# usage: golden.sh MPIEXEC DSV4 CASE_DIR NP MODE WORKDIR
set -euo pipefail
mpiexec=$1 bin=$2 case=$3 np=$4 mode=$5 work=$6
mkdir -p "$work"
toks=$(tr -d ' \n' <"$case/tokens.txt")
common=(score --model "$case/model" --chunk 7 --threads 1)
"$bin" "${common[@]}" --prefill 40 --tokens "$toks" --out "$work/one.npy" --mtp-out "$work/one-mtp.npy" 2>/dev/null
rm -f "$work/par.npy" "$work/par-mtp.npy"
# --oversubscribe: more ranks than cores on CI; --allow-run-as-root: CI runs as root.
timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np "$np" \
  "$bin" "${common[@]}" --prefill 40 --tokens "$toks" --parallel "$mode" --out "$work/par.npy" --mtp-out "$work/par-mtp.npy"
cmp "$work/one.npy" "$work/par.npy"
cmp "$work/one-mtp.npy" "$work/par-mtp.npy"
# Two sequences through shared batched steps (one still prefilling while the other decodes).
two=(--prefill 10 --tokens "$toks" --out "$work/a.npy" --tokens 7,8,9,10,11,12,13,14,15,16,17,18 --out "$work/b.npy")
"$bin" "${common[@]}" "${two[@]}" 2>/dev/null
mv "$work/a.npy" "$work/a1.npy" && mv "$work/b.npy" "$work/b1.npy"
timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np "$np" "$bin" "${common[@]}" "${two[@]}" --parallel "$mode"
cmp "$work/a1.npy" "$work/a.npy"
cmp "$work/b1.npy" "$work/b.npy"
echo "np $np $mode: logits (one and two sequences) and MTP logits bit-identical to one process"
