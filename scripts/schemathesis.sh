#!/usr/bin/env bash
# schemathesis, pinned, in target/schemathesis, where the API's generated-request test
# (tests/e2e/schemathesis.rs) looks for it.
exec "$(dirname "$0")/pip-venv.sh" target/schemathesis schemathesis 4.32.5
