#!/usr/bin/env bash
# Sampling inside the step on the CUDA emulator through the CLI: `dsv4-emu generate --device cuda
# --temperature 0.8 --top-k 50 --seed N` (each decode step's pick runs on the device, only the id
# comes back) prints the text of `dsv4 generate` on the CPU with the same arguments (the pick from
# the logits on the host), for three seeds, on the demo model (real tokenizer). The seeds must not
# all give the same text (else the sampling would not show). Exit 77 (skipped) without the tokenizer.
# usage: emu-cli-sample.sh DSV4_EMU DSV4 TOKENIZER_DIR WORKDIR
set -euo pipefail
emu=$1 bin=$2 tok=${DSV4_TOKENIZER_DIR:-$3} work=$4
[ -f "$tok/tokenizer.json" ] || { echo "no tokenizer at $tok (scripts/fetch-tokenizer.sh)"; exit 77; }
mkdir -p "$work"
[ -f "$work/m/config.json" ] || "$bin" make-tiny --out "$work/m" --preset demo --seed 3 --tokenizer "$tok" 2>/dev/null
for seed in 1 2 3; do
  args=(generate --model "$work/m" --prompt 'hello world' --mode raw -n 8 --temperature 0.8 --top-k 50 --seed "$seed" --threads 1)
  "$bin" "${args[@]}" >"$work/cpu-$seed.txt" 2>/dev/null
  "$emu" "${args[@]}" --device cuda --context 32 >"$work/cuda-$seed.txt" 2>"$work/cuda.err" || { cat "$work/cuda.err"; exit 1; }
  [ -s "$work/cpu-$seed.txt" ] || { echo "FAIL: no text generated (seed $seed)"; exit 1; }
  cmp "$work/cpu-$seed.txt" "$work/cuda-$seed.txt" || {
    echo "FAIL: cuda sampling differs from the CPU (seed $seed):"; cat "$work/cpu-$seed.txt"; echo; cat "$work/cuda-$seed.txt"; exit 1; }
  echo "seed $seed: $(cat "$work/cuda-$seed.txt")"
done
if cmp -s "$work/cpu-1.txt" "$work/cpu-2.txt" && cmp -s "$work/cpu-1.txt" "$work/cpu-3.txt"; then
  echo "FAIL: three seeds gave the same text: nothing was sampled"; exit 1
fi
echo "cuda --temperature 0.8 --top-k 50: the CPU's text for every seed"
