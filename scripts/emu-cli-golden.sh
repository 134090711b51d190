#!/usr/bin/env bash
# The CLI path on the CUDA emulator (issue 14 item 3): `dsv4-emu score --device cuda --mtp-out` on
# a golden case (weights upload, per-sequence device state, the engine's steps, every kernel, the
# MTP block) at the case's thresholds for the logits and, when the case has expected-mtp.npy, for
# the MTP logits (scripts/compare-logits.py). Usage: emu-cli-golden.sh DSV4_EMU CASE_DIR OUT_DIR
set -euo pipefail
bin="$1" case="$2" out="$3"
mkdir -p "$out"
name="$(basename "$case")"
prefill="$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['prefill'])" "$case/case.json")"
mtp=()
[ -f "$case/expected-mtp.npy" ] && mtp=(--mtp-out "$out/$name-mtp.npy")
"$bin" score --model "$case/model" --tokens "$(cat "$case/tokens.txt")" --prefill "$prefill" --device cuda \
  --out "$out/$name.npy" "${mtp[@]}"
python3 "$(dirname "$0")/compare-logits.py" "$out/$name.npy" "$case/expected.npy" --case "$case/case.json" --label "emu cli $name"
if [ ${#mtp[@]} -gt 0 ]; then
  python3 "$(dirname "$0")/compare-logits.py" "$out/$name-mtp.npy" "$case/expected-mtp.npy" --case "$case/case.json" --mtp \
    --label "emu cli $name mtp"
fi
