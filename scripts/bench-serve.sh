#!/usr/bin/env bash
# Serving benchmark (issue 13): starts dsv4 serve on MODEL, runs C concurrent streams (greedy) for
# each C in LIST (bench/serve_bench.cjs: aggregate generated tok/s, TTFT, time per output token),
# then `dsv4 bench --batch LIST` on the same model in the same run for the bytes a batched decode
# step reads and the streaming-read bandwidth measured now (docs/perf.md "Serving").
# Usage: scripts/bench-serve.sh MODEL_DIR [LIST=1,2,4,8,16] [GEN=32] [PROMPT_WORDS=64]
# MODEL_DIR needs tokenizer.json (make-tiny --preset flash-proxy --tokenizer build/deps/tokenizer).
# DSV4_SERVE_ARGS: more options for dsv4 serve (e.g. "--step-tokens-decoding 256" to compare
# scheduling settings); DSV4_BENCH_ENGINE=0 skips the engine-API run (alternating series);
# DSV4_BIN: the dsv4 binary to run (default build/dsv4; alternating runs of two builds);
# DSV4_BENCH_TEMPERATURE: sampled streams at that temperature instead of greedy ones;
# DSV4_BENCH_BODY: a JSON object merged into every request (e.g. '{"presence_penalty": 0.5}').
# (bench/serve_bench.cjs reads both.)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: $0 MODEL_DIR [LIST] [GEN] [PROMPT_WORDS]}
list=${2:-1,2,4,8,16}
gen=${3:-32}
words=${4:-64}
bin=${DSV4_BIN:-build/dsv4}
max=$(tr ',' '\n' <<<"$list" | sort -n | tail -1)
log=$(mktemp)
grep -m1 'model name' /proc/cpuinfo | sed 's/.*: /cpu: /'
# shellcheck disable=SC2086  # DSV4_SERVE_ARGS is a list of options
"$bin" serve --model "$model" --port 0 --max-batch "$max" --quiet ${DSV4_SERVE_ARGS:-} 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -f "$log"' EXIT  # the server may be gone already; errexit applies here too
for _ in $(seq 600); do grep -q 'ready at' "$log" && break; kill -0 $pid 2>/dev/null || { cat "$log"; exit 1; }; sleep 0.5; done
url=$(grep -o 'http://[^ ]*' "$log" | head -1 | sed 's#/v1$##')
node bench/serve_bench.cjs "$url" "$list" "$gen" "$words"
kill $pid; wait $pid 2>/dev/null || true
[ "${DSV4_BENCH_ENGINE:-1}" = 0 ] && exit 0
echo "decode steps of the same batch sizes through the engine API (dsv4 bench, same run):"
"$bin" bench --model "$model" --prompt-len "$words" --gen 8 --batch "$list" | sed -n '/batch/,$p'
