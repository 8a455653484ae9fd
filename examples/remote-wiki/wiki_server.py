#!/usr/bin/env python3
"""A reference tool server for countersign's remote tool protocol (docs/remote-tools.md).

A key-value wiki: pages are lists of lines. Tools:

- read_page    read_only             the page's lines
- set_page     idempotent_write      replace the whole text of a page (absolute: twice = once)
- append_line  non_idempotent_write  add one line at the end (relative: twice = two lines)

Standard library only. State (pages, idempotency keys with their answers, the highest fence
epoch seen per run, the changes held by a prepare) is one JSON file, rewritten atomically after
every change, so deduplication and held changes survive a restart. Pages under `private/` are
for admins only. A write that carries the preview its approver was shown (`shown_preview`) is
compared with the wiki's own preview under the same lock as the write, and refused as moved
when they differ: the comparison and the write are one step at the resource.

It speaks protocol version 2 (version 1 with --protocol 1). Version 2 writes in two phases:
POST /tools/NAME/prepare (the execute body, with "hold_secs") compares the preview and HOLDS the
change without making it visible; /commit {"idempotency_key", "fence_epoch"} applies what was held,
/abort {"idempotency_key", "fence_epoch"} drops it. While a change to a page is held, other writers
of that page (PUT /pages/NAME, an execute) wait, as for a row lock, until it is committed, aborted
or expired (after "hold_secs", at most --max-hold seconds; --hold-ttl when a prepare names none);
a prepare of another turn's call on that page answers "busy" and holds nothing. GET /calls/KEY
says what became of a key: answered (or moved), prepared, or unseen (--no-call-status: 404, as a
server that cannot say).

A turn is a sequence (version 2, "turn_sequence" in discovery; --no-turn-sequence leaves it out):
a preview, a prepare or an execute may carry "before", the calls of the same turn on this server
that come first and have not landed. The wiki previews and compares the call against the pages as
those calls would leave them, so the previews of two appends to one page compose (2 → 3, then
3 → 4), and a prepare of the second compares against the first one's held change.

Besides the protocol it serves the wiki's own editing surface, used by people (and tests):
GET /pages/NAME -> {"lines": [...]}, PUT /pages/NAME {"text": "..."}, GET /applied -> the
idempotency keys whose execute or commit did the work, in order. Every route but /healthz needs
the bearer secret. With --tls-cert and --tls-key it speaks https:// instead of http://.

    WIKI_SECRET=s3cret python3 wiki_server.py --port 8090 --state wiki.json
"""

import argparse
import hmac
import json
import os
import ssl
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

EXCERPT = 120
MAX_BODY = 1024 * 1024
MOVED = "The page changed since the approver saw this call; nothing was written."
REFUSAL = "The page does not exist or you may not edit it."
READ_REFUSAL = "The page does not exist or you may not read it."

PAGE_PARAMS = {"page": {"type": "string", "minLength": 1, "description": "The page name, e.g. home."}}

TOOLS = [
    {
        "name": "read_page",
        "description": "Read the lines of a wiki page.",
        "parameters": {"type": "object", "properties": dict(PAGE_PARAMS),
                       "required": ["page"], "additionalProperties": False},
        "group": "content", "effect": "read_only",
        "enabled_by_default": True, "requires_admin": False, "previews": False,
    },
    {
        "name": "set_page",
        "description": "Replace the whole text of a wiki page (creating it when missing).",
        "parameters": {"type": "object",
                       "properties": dict(PAGE_PARAMS, text={"type": "string", "description": "The new text; lines separated by newlines."}),
                       "required": ["page", "text"], "additionalProperties": False},
        "group": "editing", "effect": "idempotent_write",
        "enabled_by_default": False, "requires_admin": False, "previews": True,
    },
    {
        "name": "append_line",
        "description": "Append one line at the end of an existing wiki page.",
        "parameters": {"type": "object",
                       "properties": dict(PAGE_PARAMS, line={"type": "string", "minLength": 1}),
                       "required": ["page", "line"], "additionalProperties": False},
        "group": "editing", "effect": "non_idempotent_write",
        "enabled_by_default": False, "requires_admin": False, "previews": True,
    },
]
TOOL_NAMES = {t["name"]: t for t in TOOLS}
# What the tools of each group read and write: the wiki's pages are editors' content. A group
# left out would count as secret_adjacent, offered only to providers configured for it.
DATA_CLASSES = {"content": "editor_content", "editing": "editor_content"}


def collapse(value):
    return " ".join(value.split())


def quote(value):
    """A value as a preview shows it: (empty), or quoted and excerpted to 120 characters."""
    v = collapse(value)
    if not v:
        return "(empty)"
    if len(v) > EXCERPT:
        return '"' + v[:EXCERPT] + '…"'
    return '"' + v + '"'


def turn_of(key):
    """The turn a key belongs to: `run:suspension` of `run:suspension:call`."""
    return key.rsplit(":", 1)[0] if isinstance(key, str) else None


class Wiki:
    def __init__(self, path, hold_ttl=60.0, max_hold=3600.0):
        self.path = path
        self.hold_ttl = hold_ttl
        self.max_hold = max_hold
        self.lock = threading.Lock()
        # On the same lock: notified whenever a held change goes (committed, aborted, expired),
        # which the writers of its page wait for.
        self.changed = threading.Condition(self.lock)
        self.state = {"pages": {}, "keys": {}, "epochs": {}, "applied": [], "held": {}}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self.state.update(json.load(f))

    def save(self):
        directory = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".wiki-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self.state, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    # The record check shared by preview, may-view, execute and prepare.
    @staticmethod
    def may_access(user, page):
        return not page.startswith("private/") or bool(user.get("admin"))

    @staticmethod
    def parse(tool, args):
        """The arguments, or None: an unknown or missing argument refuses the whole call."""
        if not isinstance(args, dict):
            return None
        spec = TOOL_NAMES[tool]["parameters"]
        if set(args) - set(spec["properties"]) or set(spec["required"]) - set(args):
            return None
        if not all(isinstance(v, str) for v in args.values()):
            return None
        if not args["page"].strip() or ("line" in args and not args["line"].strip()):
            return None
        return args

    def after(self, user, before):
        """The pages as the calls `before` (of the same turn, as the same user) would leave them:
        a copy, the wiki's own pages untouched."""
        pages = {name: list(lines) for name, lines in self.state["pages"].items()}
        for call in before or ():
            if isinstance(call, dict) and call.get("tool") in TOOL_NAMES:
                self.apply_to(pages, call["tool"], user, call.get("arguments"))
        return pages

    def preview(self, tool, user, args, before=()):
        args = self.parse(tool, args)
        if args is None or not self.may_access(user, args["page"]):
            return [REFUSAL]
        page = args["page"]
        lines = self.after(user, before).get(page)
        if tool == "set_page":
            old = "(new page)" if lines is None else quote("\n".join(lines))
            return [f"page {quote(page)}", f"text: {old} → {quote(args['text'])}"]
        if tool == "append_line":
            if lines is None:
                return [REFUSAL]
            n = len(lines)
            return [f"page {quote(page)}",
                    f"lines: {n} line(s) → {n + 1}, appended last: {quote(args['line'])}"]
        return [REFUSAL]

    def may_view(self, tool, viewer, args):
        args = self.parse(tool, args) if tool in TOOL_NAMES else None
        return args is not None and self.may_access(viewer, args["page"])

    @staticmethod
    def normalise(lines):
        """Lines as countersign stores a preview: whitespace runs as one space, trimmed, no
        blank line."""
        out = (" ".join(str(line).split()) for line in lines)
        return [line for line in out if line]

    def moved(self, tool, user, args, shown, before=()):
        """Whether the preview the approver was shown no longer reads as the wiki's own, after
        the calls of the turn before it."""
        return isinstance(shown, list) and \
            self.normalise(self.preview(tool, user, args, before)) != self.normalise(shown)

    def fenced(self, key, epoch):
        """Whether `epoch` is older than one seen for the key's run; records the highest."""
        run = key.split(":", 1)[0]
        seen = self.state["epochs"].get(run)
        if isinstance(epoch, int) and seen is not None and epoch < seen:
            return True
        if isinstance(epoch, int):
            self.state["epochs"][run] = max(epoch, seen or 0)
        return False

    def record(self, key, tool, answer):
        """The key's final answer; a successful write also joins `applied`."""
        self.state["keys"][key] = answer
        if not answer["is_error"] and TOOL_NAMES[tool]["effect"] != "read_only":
            self.state["applied"].append(key)

    def execute(self, tool, user, args, key, epoch, shown=None, before=()):
        """(status, body). Deduplicated by key; a stale epoch of a run is fenced out (409); a
        write whose shown preview no longer reads the same is refused as moved."""
        if key is not None:
            if key in self.state["keys"]:
                return 200, self.state["keys"][key]
            if self.fenced(key, epoch):
                return 409, {"error": "fenced"}
        writes = TOOL_NAMES[tool]["effect"] != "read_only"
        if writes and self.moved(tool, user, args, shown, before):
            # Recorded under the key like any answer: a retry gets the same refusal.
            answer = {"content": MOVED, "is_error": True, "moved": True}
        else:
            answer = self.apply(tool, user, args)
        if key is not None:
            self.record(key, tool, answer)
        self.save()  # the write and its key record land in one file replacement
        return 200, answer

    def apply(self, tool, user, args):
        return self.apply_to(self.state["pages"], tool, user, args)

    def apply_to(self, pages, tool, user, args):
        """Carries the call out on `pages`; its answer."""
        args = self.parse(tool, args)
        if args is None or not self.may_access(user, args["page"]):
            return {"content": READ_REFUSAL if tool == "read_page" else REFUSAL, "is_error": True}
        page = args["page"]
        if tool == "read_page":
            if page not in pages:
                return {"content": READ_REFUSAL, "is_error": True}
            return {"content": "\n".join(pages[page]), "is_error": False}
        if tool == "set_page":
            pages[page] = args["text"].split("\n") if args["text"] else []
            return {"content": f"Page {quote(page)} now has {len(pages[page])} line(s).", "is_error": False}
        if tool == "append_line":
            if page not in pages:
                return {"content": REFUSAL, "is_error": True}
            pages[page].append(collapse(args["line"]))
            return {"content": f"Appended line {len(pages[page])} to page {quote(page)}.", "is_error": False}
        return {"content": REFUSAL, "is_error": True}

    # Protocol version 2: the two-phase write. Every method below runs under the lock.

    def refusal(self, tool, user, args):
        """The refusal line a write would answer with (what apply refuses), or None."""
        args = self.parse(tool, args)
        if args is None or not self.may_access(user, args["page"]):
            return REFUSAL
        if tool == "append_line" and args["page"] not in self.state["pages"]:
            return REFUSAL
        return None

    def until(self, held):
        """When a held change is dropped (a state written before holds named their end: its
        start and the hold TTL)."""
        return held.get("until", held.get("at", 0) + self.hold_ttl)

    def expire(self):
        """Drops, as an abort would, every held change past the time it was held for."""
        now = time.time()
        held = self.state["held"]
        gone = [key for key, h in held.items() if self.until(h) <= now]
        for key in gone:
            del held[key]
        if gone:
            self.save()
            self.changed.notify_all()

    def wait_unheld(self, page, key=None):
        """Blocks, the lock released meanwhile, while a change to `page` is held, as a writer
        waits on a row lock: until it is committed, aborted or expires. A key already answered
        does not wait (its answer comes from the record)."""
        while True:
            self.expire()
            if key in self.state["keys"]:
                return
            ends = [self.until(h) for h in self.state["held"].values() if h["page"] == page]
            if not ends:
                return
            self.changed.wait(max(0.01, min(ends) - time.time()))

    def status(self, key):
        """What became of a key, as GET /calls/KEY and a repeated prepare say it."""
        answer = self.state["keys"].get(key)
        if answer is not None:
            if answer.get("moved"):
                return {"status": "moved"}
            return {"status": "answered",
                    "content": answer["content"], "is_error": answer["is_error"]}
        if key in self.state["held"]:
            return {"status": "prepared"}
        return {"status": "unseen"}

    def call_status(self, key):
        self.expire()
        return self.status(key)

    def hold_for(self, hold_secs):
        """How long a prepare holds its change: what it asks for, at most --max-hold."""
        if isinstance(hold_secs, (int, float)) and not isinstance(hold_secs, bool) and hold_secs > 0:
            return min(float(hold_secs), self.max_hold)
        return self.hold_ttl

    def prepare(self, tool, user, args, key, epoch, shown, before=(), hold_secs=None):
        """(status, body). Compares, then holds the change under the key without making it
        visible; a refusal or a moved preview is the key's final answer at once. A prepare of a
        key held already holds it on, for as long again."""
        self.expire()
        if key in self.state["held"]:
            if not self.fenced(key, epoch):
                self.state["held"][key]["until"] = time.time() + self.hold_for(hold_secs)
                self.save()
            return 200, self.status(key)
        if key in self.state["keys"]:
            return 200, self.status(key)
        if self.fenced(key, epoch):
            return 409, {"error": "fenced"}
        refusal = self.refusal_after(tool, user, args, before)
        page = page_of(args)
        other_turn = any(h["page"] == page and turn_of(k) != turn_of(key)
                         for k, h in self.state["held"].items())
        if refusal is None and other_turn:
            # Another turn holds the page: nothing is held, and the caller tries again later.
            return 200, {"status": "busy"}
        if refusal is not None:
            self.record(key, tool, {"content": refusal, "is_error": True})
        elif self.moved(tool, user, args, shown, before):
            # Compared with the committed page after the calls of the turn before it, whose
            # changes this turn holds: a change held by another turn is not visible.
            self.record(key, tool, {"content": MOVED, "is_error": True, "moved": True})
        else:
            self.state["held"][key] = {"tool": tool, "acting_user": user, "arguments": args,
                                       "page": page,
                                       "until": time.time() + self.hold_for(hold_secs)}
        self.save()
        return 200, self.status(key)

    def refusal_after(self, tool, user, args, before):
        """The refusal line a write would answer with after the calls `before`, or None."""
        parsed = self.parse(tool, args)
        if parsed is None or not self.may_access(user, parsed["page"]):
            return REFUSAL
        if tool == "append_line" and parsed["page"] not in self.after(user, before):
            return REFUSAL
        return None

    def commit(self, key, epoch):
        """(status, body). Applies the change held under the key (compared at its prepare, and
        its page protected since), or answers again what the key recorded."""
        self.expire()
        if key in self.state["keys"]:
            return 200, self.state["keys"][key]
        if self.fenced(key, epoch):
            return 409, {"error": "fenced"}
        held = self.state["held"].pop(key, None)
        if held is None:
            return 410, {"error": "not_held"}
        answer = self.apply(held["tool"], held["acting_user"], held["arguments"])
        self.record(key, held["tool"], answer)
        self.save()  # the write, its key record and the hold's end in one file replacement
        self.changed.notify_all()
        return 200, answer

    def abort(self, key, epoch=None):
        """Drops what the key holds, if anything: an abort of nothing, or after the commit,
        changes nothing. A stale epoch of the run is fenced out (409): a zombie segment must not
        drop what the run's new owner holds under the same key."""
        if self.fenced(key, epoch):
            return 409, {"error": "fenced"}
        if self.state["held"].pop(key, None) is not None:
            self.save()
            self.changed.notify_all()
        return 200, {"status": "aborted"}


TWO_PHASE = ("prepare", "commit", "abort")
ACTIONS = ("preview", "may-view", "execute") + TWO_PHASE


def page_of(args):
    """The page a call's arguments name, for waiting on its held changes; None if none."""
    page = args.get("page") if isinstance(args, dict) else None
    return page if isinstance(page, str) else None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "remote-wiki/2"

    def log_message(self, fmt, *args):  # quiet unless asked
        if self.server.verbose:
            sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

    def reply(self, status, body):
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller is gone; what it asked for is recorded under its key

    def authorized(self):
        given = self.headers.get("Authorization", "")
        expected = "Bearer " + self.server.secret
        if hmac.compare_digest(given.encode(), expected.encode()):
            return True
        self.reply(401, {"error": "unauthorized"})
        return False

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return None
        try:
            value = json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def hold(self, hold):
        """While the file `hold` exists, a call waits, after adding a line to HOLD.waiting (a
        test's way to act while a call is in flight): an execute or a commit before it does
        anything with --hold-file, after its answer is recorded and before it answers with
        --hold-after-file; a prepare before it does anything with --hold-prepare-file; GET /calls/KEY before it answers
        with --hold-status-file. When the
        file holds a number N, the first N calls that find it pass (each adds a line to
        HOLD.passed) and the later ones wait."""
        if not hold or not os.path.exists(hold):
            return
        with self.server.wiki.lock:
            try:
                with open(hold, encoding="utf-8") as f:
                    let_through = int(f.read().strip() or 0)
            except (OSError, ValueError):
                let_through = 0
            try:
                with open(hold + ".passed", encoding="utf-8") as f:
                    passed = len(f.readlines())
            except OSError:
                passed = 0
            if passed < let_through:
                with open(hold + ".passed", "a", encoding="utf-8") as f:
                    f.write(self.path + "\n")
                return
            with open(hold + ".waiting", "a", encoding="utf-8") as f:
                f.write(self.path + "\n")
        while os.path.exists(hold):
            time.sleep(0.02)

    def do_GET(self):
        if self.path == "/healthz":
            return self.reply(200, {"ok": True})
        if not self.authorized():
            return
        wiki = self.server.wiki
        if self.path == "/tools":
            if self.server.protocol == 1:
                return self.reply(200, {"protocol": 1, "data_classes": DATA_CLASSES,
                                        "tools": TOOLS})
            return self.reply(200, {"protocol": 2, "two_phase": True,
                                    "turn_sequence": self.server.turn_sequence,
                                    "data_classes": DATA_CLASSES, "tools": TOOLS})
        if self.path == "/applied":
            with wiki.lock:
                return self.reply(200, {"applied": list(wiki.state["applied"])})
        if self.path.startswith("/pages/"):
            with wiki.lock:
                lines = wiki.state["pages"].get(self.path[len("/pages/"):])
            if lines is None:
                return self.reply(404, {"error": "no_such_page"})
            return self.reply(200, {"lines": lines})
        segment = self.path[len("/calls/"):]
        if self.path.startswith("/calls/") and segment and "/" not in segment \
                and self.server.call_status:
            self.hold(self.server.hold_status_file)
            with wiki.lock:
                return self.reply(200, wiki.call_status(unquote(segment)))
        self.reply(404, {"error": "not_found"})

    def do_PUT(self):
        if not self.authorized():
            return
        body = self.body()
        if not self.path.startswith("/pages/") or body is None or not isinstance(body.get("text"), str):
            return self.reply(400, {"error": "malformed_request"})
        wiki = self.server.wiki
        page = self.path[len("/pages/"):]
        with wiki.lock:
            wiki.wait_unheld(page)  # a change held by a prepare is committed or dropped first
            text = body["text"]
            wiki.state["pages"][page] = text.split("\n") if text else []
            wiki.save()
        self.reply(200, {"ok": True})

    def do_POST(self):
        if not self.authorized():
            return
        parts = self.path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "tools" or parts[1] not in TOOL_NAMES:
            return self.reply(404, {"error": "unknown_tool"})
        tool, action = parts[1], parts[2]
        if action in TWO_PHASE and self.server.protocol < 2:
            return self.reply(404, {"error": "not_found"})
        body = self.body()
        if body is None:
            return self.reply(400, {"error": "malformed_request"})
        hooked = action in ("execute", "commit")  # the calls the test hooks hold
        if hooked:
            self.hold(self.server.hold_file)
        if action == "prepare":
            self.hold(self.server.hold_prepare_file)
        with self.server.wiki.lock:
            answer = self.act(tool, action, body)
        if answer is None:
            return self.reply(404 if action not in ACTIONS else 400, {"error": "malformed_request"})
        status, message = answer
        if hooked and status != 400:
            self.hold(self.server.hold_after_file)
        self.reply(status, message)

    def act(self, tool, action, body):
        """(status, body) of one POST, under the wiki lock; None for a malformed request."""
        wiki = self.server.wiki
        user = body.get("acting_user")
        key = body.get("idempotency_key")
        writes = TOOL_NAMES[tool]["effect"] != "read_only"
        before = body.get("before") if self.server.turn_sequence else None
        if action == "preview" and isinstance(user, dict):
            return 200, {"lines": wiki.preview(tool, user, body.get("arguments"), before)}
        if action == "may-view" and isinstance(body.get("viewer"), dict):
            return 200, {"allowed": wiki.may_view(tool, body["viewer"], body.get("arguments"))}
        if action == "execute" and isinstance(user, dict):
            if writes and not isinstance(key, str):
                return 400, {"error": "idempotency_key_required"}
            if writes:
                wiki.wait_unheld(page_of(body.get("arguments")), key)
            return wiki.execute(tool, user, body.get("arguments"), key,
                                body.get("fence_epoch"), body.get("shown_preview"), before)
        if action in TWO_PHASE and not writes:
            return 400, {"error": "not_a_write"}  # a read has nothing to hold
        if action in TWO_PHASE and not isinstance(key, str):
            return 400, {"error": "idempotency_key_required"}
        if action == "prepare" and isinstance(user, dict):
            return wiki.prepare(tool, user, body.get("arguments"), key,
                                body.get("fence_epoch"), body.get("shown_preview"), before,
                                body.get("hold_secs"))
        if action == "commit":
            return wiki.commit(key, body.get("fence_epoch"))
        if action == "abort":
            return wiki.abort(key, body.get("fence_epoch"))
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090, help="0 picks a free port")
    parser.add_argument("--state", default="wiki.json", help="the JSON file holding the wiki")
    parser.add_argument("--secret-env", default="WIKI_SECRET",
                        help="the variable holding the bearer secret countersign sends")
    parser.add_argument("--protocol", type=int, choices=(1, 2), default=2,
                        help="the protocol version to speak: 1 has no prepare, commit or abort")
    parser.add_argument("--hold-ttl", type=float, default=60.0,
                        help="seconds after which a prepared change not committed is dropped, "
                             "when its prepare names no hold_secs")
    parser.add_argument("--max-hold", type=float, default=3600.0,
                        help="the longest a prepared change is held, whatever its prepare asks")
    parser.add_argument("--no-turn-sequence", action="store_true",
                        help="leave turn_sequence out of discovery and ignore before, as a "
                             "version 2 server that cannot preview a call after others")
    parser.add_argument("--no-call-status", action="store_true",
                        help="answer GET /calls/KEY 404, as a server that cannot say")
    parser.add_argument("--hold-file",
                        help="for tests: executes and commits wait while this file exists")
    parser.add_argument("--hold-after-file",
                        help="for tests: executes and commits wait, recorded but unanswered, "
                             "while this file exists")
    parser.add_argument("--hold-prepare-file",
                        help="for tests: prepares wait, before they do anything, while this file "
                             "exists")
    parser.add_argument("--hold-status-file",
                        help="for tests: GET /calls/KEY waits, before it answers, while this file "
                             "exists")
    parser.add_argument("--tls-cert", help="serve https:// with this PEM certificate (chain)")
    parser.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    secret = os.environ.get(args.secret_env, "")
    if not secret:
        sys.exit(f"set {args.secret_env} to the bearer secret")
    if bool(args.tls_cert) != bool(args.tls_key):
        sys.exit("--tls-cert and --tls-key go together")
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    scheme = "http"
    if args.tls_cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(args.tls_cert, args.tls_key)
        # The handshake happens in each request's thread, so a slow client holds up no other.
        server.socket = context.wrap_socket(server.socket, server_side=True,
                                            do_handshake_on_connect=False)
        scheme = "https"
    server.wiki = Wiki(args.state, args.hold_ttl, args.max_hold)
    server.turn_sequence = args.protocol >= 2 and not args.no_turn_sequence
    server.secret = secret
    server.verbose = args.verbose
    server.protocol = args.protocol
    server.call_status = not args.no_call_status
    server.hold_file = args.hold_file
    server.hold_after_file = args.hold_after_file
    server.hold_prepare_file = args.hold_prepare_file
    server.hold_status_file = args.hold_status_file
    host, port = server.server_address[:2]
    print(f"listening on {scheme}://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
