#!/usr/bin/env bash
# Installs schemathesis, pinned, into a virtual environment under target/ (where the API's
# generated-request test, tests/e2e/schemathesis.rs, looks for it). Needs python3 with venv and
# PyPI; fails loudly when either is missing. Does nothing when the pinned version is there.
set -euo pipefail
cd "$(dirname "$0")/.."
version=4.32.5
venv=target/schemathesis
if [ -x "$venv/bin/schemathesis" ] && "$venv/bin/schemathesis" --version | grep -qx "schemathesis, version $version"; then
  exit 0
fi
command -v python3 >/dev/null || { echo "schemathesis.sh: python3 is missing" >&2; exit 1; }
if ! python3 -m venv --help >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$version"
"$venv/bin/schemathesis" --version
