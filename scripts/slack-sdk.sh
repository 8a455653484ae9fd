#!/usr/bin/env bash
# Slack's official SDK for Python, pinned, in target/slack-sdk: the Slack test (tests/e2e/team.rs)
# signs its interactions and builds its Block Kit checks with it (tests/e2e/slack_client.py).
exec "$(dirname "$0")/pip-venv.sh" target/slack-sdk slack_sdk 3.47.0
