#!/usr/bin/env bash
# Installs the official OpenAI and Anthropic client libraries (npm: openai, @anthropic-ai/sdk, at
# the versions pinned in tests/server/package.json + package-lock.json) into DEST_DIR, for the
# server tests (tests/server). Idempotent.
#
# Usage: scripts/fetch-node-clients.sh DEST_DIR      (e.g. build/deps/clients)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: $0 DEST_DIR" >&2; exit 2; }
dest="$1"
if [ -f "$dest/node_modules/openai/package.json" ] && [ -f "$dest/node_modules/@anthropic-ai/sdk/package.json" ] &&
   cmp -s tests/server/package-lock.json "$dest/package-lock.json"; then
  exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "fetch-node-clients: npm not found (apt-get install nodejs npm)" >&2; exit 1; }
mkdir -p "$dest"
cp tests/server/package.json tests/server/package-lock.json "$dest/"
(cd "$dest" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
echo "fetch-node-clients: openai and @anthropic-ai/sdk installed in $dest" >&2
