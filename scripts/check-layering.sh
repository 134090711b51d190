#!/usr/bin/env bash
# Checks that every source includes only headers of its own layer or of the layers below it
# (README "Layout"). Run by ctest (Layering.IncludesPointDown); prints each violation.
set -euo pipefail
cd "$(dirname "$0")/.."
# folder -> the folders its sources may include from ("" = its own only)
declare -A allowed=(
  [src/core]="core"
  [src/io]="core io"
  [src/kernels/cpu]="core kernels/cpu"
  [src/kernels/cuda]="core kernels/cuda"
  [src/kernels/cuda_emu]="kernels/cuda_emu"
  [src/kv]="core io kv"
  [src/parallel]="core parallel"
  [src/model]="core io kv parallel model"
  [src/backends/cpu]="core io kv model kernels/cpu backends/cpu"
  [src/backends/cuda]="core io kv model kernels/cuda backends/cuda"
  [src/text]="core text"
  [src/engine]="core io kv parallel model kernels/cpu kernels/cuda backends/cpu backends/cuda text engine"
  [src/tools]="core io kv parallel model kernels/cpu backends/cpu text engine tools"
  # The server is an app of the engine: the engine API and the text layer only.
  [src/server]="core text engine server"
  # Apps see the engine's public headers only: no tensors, weights, backends or kernels.
  [apps/dsv4]="engine text tools server"
)
bad=0
for dir in "${!allowed[@]}"; do
  [ -d "$dir" ] || continue
  while IFS= read -r line; do
    file=${line%%:*}
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$line")
    case "$inc" in */*) ;; *) continue ;; esac  # same-folder headers ("args.h")
    ok=0
    for a in ${allowed[$dir]}; do
      [[ "$inc" == "$a/"* ]] && ok=1 && break
    done
    # A public engine header may name the row selector of the model layer (model/rows.h).
    [ "$dir" = apps/dsv4 ] && [ "$inc" = model/rows.h ] && ok=1
    if [ $ok = 0 ]; then
      echo "layering: $file includes \"$inc\" (allowed from $dir: ${allowed[$dir]})"
      bad=1
    fi
  done < <(grep -rHn '#include "' "$dir" || true)
done
# The public headers apps see (engine/, tools/, text/) must not bring tensors, weights,
# backends or kernels in with them.
while IFS= read -r line; do
  inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$line")
  case "$inc" in
    engine/*|tools/*|text/*|core/error.h|model/rows.h|io/config.h) ;;
    *) echo "layering: public header ${line%%:*} includes \"$inc\" (apps would see it)"; bad=1 ;;
  esac
done < <(grep -Hn '#include "' src/engine/*.h src/tools/*.h src/text/*.h || true)
# The server's headers (what the CLI includes) likewise.
while IFS= read -r line; do
  inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$line")
  case "$inc" in
    engine/*|text/*|server/*|core/error.h|model/rows.h) ;;
    *) echo "layering: server header ${line%%:*} includes \"$inc\" (apps would see it)"; bad=1 ;;
  esac
done < <(grep -Hn '#include "' src/server/*.h || true)
[ $bad = 0 ] && echo "layering: every include points down"
exit $bad
