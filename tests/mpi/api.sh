#!/usr/bin/env bash
# The engine API under mpirun (tests/mpi/api_check.cpp): every request kind a parallel run
# forwards gives the same bytes as one process. usage: api.sh MPIEXEC CHECK_BIN MODEL NP MODE WORKDIR
set -euo pipefail
mpiexec=$1 bin=$2 model=$3 np=$4 mode=$5 work=$6
mkdir -p "$work"
rm -f "$work/one.bin" "$work/par.bin"
"$bin" "$model" none "$work/one.bin"
timeout 300 "$mpiexec" --oversubscribe --allow-run-as-root -np "$np" "$bin" "$model" "$mode" "$work/par.bin"
[ -s "$work/one.bin" ] || { echo "FAIL: nothing written"; exit 1; }
cmp "$work/one.bin" "$work/par.bin"
echo "np $np $mode: $(stat -c %s "$work/one.bin") bytes of logits and drafts, bit-identical to one process"
