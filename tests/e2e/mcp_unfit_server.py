"""An MCP server whose writer's preview is unfit to be countersigned: it reads the clock, so
no two previews of the same call are the same and every approval of it would bounce."""

import time

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("unfit")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def preview_stamp(name: str) -> str:
    """What stamp would change."""
    return f"stamp {name}: now {time.monotonic_ns()}"


@server.tool(
    annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=True),
    meta={"countersign/preview": "preview_stamp"},
)
def stamp(name: str) -> str:
    """Stamps name with the time."""
    return f"Stamped {name}."


if __name__ == "__main__":
    server.run()
