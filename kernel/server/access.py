"""The access log of ``flowkernel serve``: one line per request on ``flowkernel.server.access``.

``127.0.0.1 GET /api/v1/runs?limit=…&status=… 200 3 ms``: the client, the method, the path with the
names of its query parameters (their values may carry a secret: left out), the status and the time
until the response was sent (for an event stream: until it ended). Never a header (the token is one)
nor a body.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

log = logging.getLogger("flowkernel.server.access")

Scope = dict[str, Any]
Message = dict[str, Any]


class AccessLog:
    """ASGI middleware: logs each HTTP request once its response is done (or the client went away)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 0  # no response started: the client went away, or the server failed before answering

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            ms = (time.perf_counter() - began) * 1000
            log.info("%s %s %s %s %.0f ms", _client(scope), scope.get("method", "?"), _target(scope),
                     status or "-", ms)


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "-"


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,23}")  # what the API's own parameters look like
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]")
MAX_PATH = 300  # characters of a path shown


def _target(scope: Scope) -> str:
    """The path (on one line, bounded), and the query's parameter names without their values; a name
    that does not look like one of the API's (it may be a secret itself) is left out too."""
    path = _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group(0)):02x}", str(scope.get("path", "")))
    if len(path) > MAX_PATH:
        path = path[:MAX_PATH] + "…"
    query = scope.get("query_string", b"").decode("latin-1")
    if not query:
        return path
    names = [part.split("=", 1)[0] for part in query.split("&") if part]
    return path + "?" + "&".join(f"{name if _NAME.fullmatch(name) else '…'}=…" for name in names)
