#!/usr/bin/env bash
# The quick-start demo: builds dsv4, writes a tiny random checkpoint and scores a token
# sequence with it (prefill + decode), then prints the argmax token of each position.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
mkdir -p tmp
build/dsv4 make-tiny --out tmp/demo-model --preset tiny --format native --seed 1
build/dsv4 inspect --model tmp/demo-model
build/dsv4 score --model tmp/demo-model --tokens 0,17,254,3,99,512,7,81,640,2,33,1000,5,6,7,8,9,10,11,12 \
  --prefill 12 --chunk 5 --out tmp/demo-logits.npy
python3 - <<'PY' 2>/dev/null || echo "logits written to tmp/demo-logits.npy"
import struct
b = open("tmp/demo-logits.npy", "rb").read()
hl = struct.unpack("<H", b[8:10])[0]
import re
T, V = map(int, re.findall(r"\d+", re.search(r"'shape': \(([^)]*)\)", b[10:10 + hl].decode()).group(1)))
x = struct.unpack("<%df" % (T * V), b[10 + hl:10 + hl + 4 * T * V])
print("argmax per position:", [max(range(V), key=lambda i: x[t * V + i]) for t in range(T)])
PY
