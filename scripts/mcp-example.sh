#!/usr/bin/env bash
# The official MCP SDK for Python, pinned, in target/mcp-example: the MCP tests
# (tests/e2e/mcp.rs) run the example server, examples/mcp/notes_server.py, with it.
exec "$(dirname "$0")/pip-venv.sh" target/mcp-example mcp 2.3.0
