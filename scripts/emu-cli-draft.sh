#!/usr/bin/env bash
# The engine's sequence operations on the CUDA emulator through the CLI: `dsv4-emu generate
# --device cuda --draft 2` (the prompt-end snapshot is a fork; the MTP block drafts, rejected
# drafts rewind the main model and the block) prints the text of `dsv4 generate` on the CPU
# (plain greedy), on the demo model (real tokenizer). Exit 77 (skipped) without the tokenizer.
# usage: emu-cli-draft.sh DSV4_EMU DSV4 TOKENIZER_DIR WORKDIR
set -euo pipefail
emu=$1 bin=$2 tok=${DSV4_TOKENIZER_DIR:-$3} work=$4
[ -f "$tok/tokenizer.json" ] || { echo "no tokenizer at $tok (scripts/fetch-tokenizer.sh)"; exit 77; }
mkdir -p "$work"
[ -f "$work/m/config.json" ] || "$bin" make-tiny --out "$work/m" --preset demo --seed 3 --tokenizer "$tok" 2>/dev/null
args=(generate --model "$work/m" --prompt 'hello world' --mode raw -n 3 --temperature 0 --threads 1)
"$bin" "${args[@]}" >"$work/cpu.txt" 2>/dev/null
"$emu" "${args[@]}" --device cuda --context 32 --draft 2 >"$work/cuda.txt" 2>"$work/cuda.err" || { cat "$work/cuda.err"; exit 1; }
[ -s "$work/cpu.txt" ] || { echo "FAIL: no text generated"; exit 1; }
cmp "$work/cpu.txt" "$work/cuda.txt" || { echo "FAIL: cuda --draft 2 differs from CPU greedy:"; cat "$work/cpu.txt"; echo; cat "$work/cuda.txt"; exit 1; }
grep speculative "$work/cuda.err" || true
echo "cuda --draft 2: the CPU's greedy text"
