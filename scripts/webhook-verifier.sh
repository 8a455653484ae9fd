#!/usr/bin/env bash
# The Standard Webhooks reference library for Python, pinned, in target/webhook-verifier: the
# webhook test (tests/e2e/webhooks.rs) runs its receiver, tests/e2e/webhook_receiver.py, with it.
exec "$(dirname "$0")/pip-venv.sh" target/webhook-verifier standardwebhooks 1.1.0
