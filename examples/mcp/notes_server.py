"""An MCP tool server behind countersign's countersign: notes, kept in one JSON file.

Run over stdio (countersign starts it: `python notes_server.py`) or streamable HTTP
(`python notes_server.py --http 127.0.0.1:8765`, the endpoint `/mcp`; port 0 picks a free
one). Over HTTP it prints `listening on http://HOST:PORT` once it listens, and when NOTES_TOKEN
is set it answers 401 to every request without `Authorization: Bearer $NOTES_TOKEN` (the
secret countersign sends from COUNTERSIGN_TOOL_SECRET_<NAME>). NOTES_FILE names the file
(default notes.json beside this script). Its annotations say what each tool is; countersign
takes them only from a server whose entry says `"trust_annotations": true` (or the operator
names each tool's effect under `tools`) — otherwise every tool is a disabled non-idempotent
write. Tools, as the trusted annotations make them:

- read_note: a read (readOnlyHint), never gated;
- set_note: an idempotent write (idempotentHint) whose preview is preview_set_note; it
  applies each countersign idempotency key once and answers a repeated key with the answer it
  recorded, and it refuses, writing nothing, when the preview the approver was shown is no longer
  what preview_set_note reads;
- append_to_note: a non-idempotent write (no idempotentHint) with the preview
  preview_append_to_note; a repeated call appends again, so countersign treats a lost answer
  as an unknown outcome;
- count_visit: a tool without annotations, which countersign therefore treats as a
  non-idempotent write (fail closed), decided without a preview.

countersign passes in each call's `_meta`: `countersign/acting_user` (previews and writes), and
for writes `countersign/run_id`, `countersign/idempotency_key`, `countersign/lease_epoch` and,
when it can be compared, `countersign/shown_preview` (the lines the approver saw).
"""

import hmac
import json
import os
import socket
import sys
import time

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

NOTES_FILE = os.environ.get("NOTES_FILE", os.path.join(os.path.dirname(__file__), "notes.json"))
# When this file exists, a write sleeps after it is applied and before it answers: the window
# in which a test kills the server to lose the answer of a write that landed.
SLOW_FILE = os.environ.get("NOTES_SLOW_FILE", "")

server = MCPServer("notes")


def load():
    try:
        with open(NOTES_FILE) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"notes": {}, "applied": {}}


def save(data):
    tmp = NOTES_FILE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, NOTES_FILE)


def meta(ctx: Context) -> dict:
    m = ctx.request_context.meta
    if m is None:
        return {}
    return m if isinstance(m, dict) else m.model_dump(by_alias=True)


def excerpt(text: str) -> str:
    text = " ".join(text.split())
    return json.dumps(text if len(text) <= 120 else text[:119] + "…", ensure_ascii=False)


def set_lines(notes: dict, name: str, text: str) -> list[str]:
    if name in notes:
        return [f"note {name}: {excerpt(notes[name])} → {excerpt(text)}"]
    return [f"new note {name}: {excerpt(text)}"]


def appended_lines(notes: dict, name: str, line: str) -> list[str]:
    count = len(notes.get(name, "").splitlines())
    return [f"note {name}: {count} line(s) → {count + 1}, appended last: {excerpt(line)}"]


def moved(shown, lines) -> bool:
    return shown is not None and list(shown) != lines


def finish(data, key, answer: str) -> str:
    if key:
        data["applied"][key] = answer
    save(data)
    if SLOW_FILE and os.path.exists(SLOW_FILE):
        time.sleep(30)
    return answer


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def read_note(name: str) -> str:
    """Reads the note called name."""
    notes = load()["notes"]
    return notes[name] if name in notes else f"There is no note {name}."


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def preview_set_note(name: str, text: str) -> str:
    """What set_note would change."""
    return "\n".join(set_lines(load()["notes"], name, text))


@server.tool(
    annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=True, destructiveHint=True),
    meta={"countersign/preview": "preview_set_note"},
)
def set_note(name: str, text: str, ctx: Context) -> CallToolResult:
    """Replaces the note called name with text."""
    m = meta(ctx)
    data = load()
    key = m.get("countersign/idempotency_key")
    if key and key in data["applied"]:
        return CallToolResult(content=[TextContent(type="text", text=data["applied"][key])])
    if moved(m.get("countersign/shown_preview"), set_lines(data["notes"], name, text)):
        return CallToolResult(
            content=[TextContent(type="text", text="The note changed since it was approved; nothing was written.")],
            isError=True,
            _meta={"countersign/moved": True},
        )
    data["notes"][name] = text
    answer = finish(data, key, f"Note {name} is set.")
    return CallToolResult(content=[TextContent(type="text", text=answer)])


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def preview_append_to_note(name: str, line: str) -> str:
    """What append_to_note would change."""
    return "\n".join(appended_lines(load()["notes"], name, line))


@server.tool(
    annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=False, destructiveHint=False),
    meta={"countersign/preview": "preview_append_to_note"},
)
def append_to_note(name: str, line: str, ctx: Context) -> str:
    """Appends line to the note called name."""
    data = load()
    current = data["notes"].get(name, "")
    data["notes"][name] = (current + "\n" if current else "") + line
    return finish(data, None, f"Appended to note {name}.")


@server.tool()
def count_visit(name: str) -> str:
    """Counts a visit to the note called name."""
    data = load()
    visits = data.setdefault("visits", {})
    visits[name] = visits.get(name, 0) + 1
    return finish(data, None, f"Note {name} has {visits[name]} visit(s).")


def require_bearer(app, token: str):
    """The ASGI app `app`, refusing every HTTP request that does not carry the bearer token."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope, receive, send):
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                await send({
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")],
                })
                await send({"type": "http.response.body", "body": b"a bearer token is required\n"})
                return
        await app(scope, receive, send)

    return guarded


def serve_http(address: str) -> None:
    """Streamable HTTP on HOST:PORT. The socket is bound here, with SO_REUSEADDR so that a server
    started again takes the same port at once, and the port it got is printed before serving."""
    import uvicorn

    host, port = address.rsplit(":", 1)
    app = server.streamable_http_app(host=host)
    token = os.environ.get("NOTES_TOKEN")
    if token:
        app = require_bearer(app, token)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen(128)
    print(f"listening on http://{host}:{sock.getsockname()[1]}", flush=True)
    # Nothing more on stdout (no access log): whoever read the line may have stopped reading.
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        serve_http(sys.argv[2])
    else:
        server.run()
