#!/usr/bin/env bash
# Installs the PyPI package PACKAGE at VERSION, pinned, into the virtual environment VENV
# (under target/), for a test that runs a third-party Python tool. Needs python3 with venv and
# PyPI; fails loudly when either is missing. Does nothing when the pinned version is there.
#
#   scripts/pip-venv.sh VENV PACKAGE VERSION
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 3 ] || { echo "usage: scripts/pip-venv.sh VENV PACKAGE VERSION" >&2; exit 2; }
venv=$1 package=$2 version=$3
installed() {
  "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$package') != '$version')" 2>/dev/null
}
if [ -x "$venv/bin/python" ] && installed; then
  exit 0
fi
command -v python3 >/dev/null || { echo "pip-venv.sh: python3 is missing" >&2; exit 1; }
if ! python3 -m venv --help >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "$package==$version"
installed || { echo "pip-venv.sh: $package $version did not install" >&2; exit 1; }
echo "$package $version"
