#!/usr/bin/env bash
# What the compiler made of each fused GEMV tile (qmatmul_kernels.inc fused_tile<D, R, TT, Defer>):
# per instantiation and ISA, its FMAs, how many of them take an operand from memory, and its
# vector accesses to the stack (spills). Session 20 found g++ folding every x load into each row's
# FMA this way (docs/perf.md "Session 20"); rerun after a compiler or kernel change. Not run by CI.
#
# Usage: scripts/tile-asm.sh [BINARY] [REGEX]
#   BINARY  a binary with the CPU kernels linked in (default build/qmatmul_bench)
#   REGEX   only tiles whose "decoder R TT defer" line matches, e.g. 'DecMX 3 8' (default: all)
# Output columns: isa decoder R TT defer fmas fmas-with-memory-operand stack-vector-accesses
set -euo pipefail
BIN=${1:-build/qmatmul_bench}
REGEX=${2:-.}
[[ -f "$BIN" ]] || { echo "tile-asm: no binary '$BIN' (build it first: scripts/build.sh)" >&2; exit 2; }
command -v objdump >/dev/null || { echo "tile-asm: objdump not found (apt-get install binutils)" >&2; exit 2; }

# Symbols sorted by address, so each function ends where the next symbol starts.
syms=$(nm -n "$BIN")
grep -q 'fused_tileINS1_' <<<"$syms" || {
  echo "tile-asm: no fused_tile symbols in $BIN (stripped?)" >&2
  exit 2
}
printf '%-6s %-8s %2s %2s %5s %5s %8s %6s\n' isa decoder R TT defer fmas from-mem spills
awk '{ print $1, $3 }' <<<"$syms" | awk 'prev != "" { print prev, $1 } { prev = ($2 ~ /fused_tileINS1_/) ? $1 " " $2 : "" }' |
  while read -r start name end; do
    # _ZN...fused_tileINS1_5DecMXELi3ELi8ELb1EEEv... -> DecMX 3 8 1
    desc=$(sed -E 's/.*fused_tileINS1_[0-9]+(Dec[A-Za-z0-9]+)ELi([0-9]+)ELi([0-9]+)ELb([01]).*/\1 \2 \3 \4/' <<<"$name")
    grep -Eq -- "$REGEX" <<<"$desc" || continue
    objdump -d --no-show-raw-insn --start-address="0x$start" --stop-address="0x$end" "$BIN" |
      awk -v desc="$desc" '
        /zmm/ { z = 1 }
        /vfmadd/ { f++; if ($0 ~ /\(/) m++ }
        /[xyz]mm.*\(%r[sb]p\)|\(%r[sb]p\).*[xyz]mm/ { s++ }
        END { split(desc, d, " "); printf "%-6s %-8s %2s %2s %5s %5d %8d %6d\n", z ? "avx512" : "avx2", d[1], d[2], d[3], d[4], f, m, s }'
  done | sort -u -k1,1 -k2,2 -k3,3n -k4,4n -k5,5n
