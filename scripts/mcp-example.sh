#!/usr/bin/env bash
# Installs the official MCP SDK for Python, pinned, into a virtual environment under target/
# (where the MCP tests, tests/e2e/mcp.rs, run the example server, examples/mcp/notes_server.py).
# Needs python3 with venv and PyPI; fails loudly when either is missing. Does nothing when the
# pinned version is there.
set -euo pipefail
cd "$(dirname "$0")/.."
version=2.3.0
venv=target/mcp-example
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import importlib.metadata as m; assert m.version('mcp') == '$version'" 2>/dev/null; then
  exit 0
fi
command -v python3 >/dev/null || { echo "mcp-example.sh: python3 is missing" >&2; exit 1; }
if ! python3 -m venv --help >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "mcp==$version"
"$venv/bin/python" -c "import importlib.metadata as m; print('mcp', m.version('mcp'))"
