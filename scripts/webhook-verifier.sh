#!/usr/bin/env bash
# Installs the Standard Webhooks reference library for Python, pinned, into a virtual
# environment under target/ (where the webhook test, tests/e2e/webhooks.rs, runs its receiver,
# tests/e2e/webhook_receiver.py). Needs python3 with venv and PyPI; fails loudly when either is
# missing. Does nothing when the pinned version is there.
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.1.0
venv=target/webhook-verifier
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import importlib.metadata as m; assert m.version('standardwebhooks') == '$version'" 2>/dev/null; then
  exit 0
fi
command -v python3 >/dev/null || { echo "webhook-verifier.sh: python3 is missing" >&2; exit 1; }
if ! python3 -m venv --help >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "standardwebhooks==$version"
"$venv/bin/python" -c "import importlib.metadata as m; print('standardwebhooks', m.version('standardwebhooks'))"
