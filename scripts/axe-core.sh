#!/usr/bin/env bash
# Installs axe-core (the accessibility rules engine, from npm), pinned, under target/ — the
# inbox's browser tests (tests/e2e/inbox.rs) inject it into Chromium and fail on any serious
# or critical violation. Needs npm and its registry; fails loudly when either is missing. Does
# nothing when the pinned version is there.
set -euo pipefail
cd "$(dirname "$0")/.."
version=4.14.1
dir=target/axe-core
file="$dir/node_modules/axe-core/axe.min.js"
if [ -f "$file" ] && grep -q "\"version\": \"$version\"" "$dir/node_modules/axe-core/package.json" 2>/dev/null; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  apt-get update -qq && apt-get install -y -qq npm >/dev/null
fi
command -v npm >/dev/null || { echo "axe-core.sh: npm is missing" >&2; exit 1; }
rm -rf "$dir"
mkdir -p "$dir"
npm install --silent --no-audit --no-fund --prefix "$dir" "axe-core@$version" >/dev/null
[ -f "$file" ] || { echo "axe-core.sh: axe-core $version did not install" >&2; exit 1; }
echo "axe-core $version"
