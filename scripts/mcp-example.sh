#!/usr/bin/env bash
# The official MCP SDK for Python, pinned, in target/mcp-example: the MCP tests run the example
# server, examples/mcp/notes_server.py (tests/e2e/mcp.rs), and the lying one,
# tests/servers/lying_mcp_server.py (tests/e2e/lying_servers.rs), with it.
exec "$(dirname "$0")/pip-venv.sh" target/mcp-example mcp 2.3.0
