"""Opaque keyset cursors: ``{"items": [...], "nextCursor": "…" | null}``.

A cursor is the key of the last item of a page (a run number, a seq, a row id, a flow's name) with the
list it belongs to, signed with a secret of the store (``Store.secret``, made on first use and the
same for every server on the store): a client cannot mistake one list's cursor for another's nor make
one up, and an edited cursor is refused (400) rather than read as another position. The OpenAPI
document gives each list's cursor a format of its own (``runs-cursor``, ``events-cursor``, …).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from typing import Annotated

from fastapi import Query, Request
from flowkernel.server.problems import ApiProblem

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
# Every integer the API reads (seqs, row ids, the keys in cursors) is at most this: the largest a
# JSON client reads exactly, and far below what the stores' 64-bit keys overflow at.
MAX_INT = 2**53 - 1
MAX_CURSOR_CHARS = 1000
CURSOR_PATTERN = f"^[A-Za-z0-9_-]{{1,{MAX_CURSOR_CHARS}}}$"
SECRET_NAME = "api-cursors"
_DIGITS = re.compile(r"[0-9]{1,16}")


def cursor_query(kind: str) -> object:
    """The ``cursor`` query parameter of list ``kind``, as the document declares it."""
    return Query(pattern=CURSOR_PATTERN, max_length=MAX_CURSOR_CHARS, json_schema_extra={"format": f"{kind}-cursor"},
                 description="the `nextCursor` of the previous page of this list, unchanged (absent: the first page)")


RunsCursor = Annotated[str | None, cursor_query("runs")]
EventsCursor = Annotated[str | None, cursor_query("events")]
AgentRunsCursor = Annotated[str | None, cursor_query("agent-runs")]
MessagesCursor = Annotated[str | None, cursor_query("messages")]
ToolCallsCursor = Annotated[str | None, cursor_query("tool-calls")]
FlowsCursor = Annotated[str | None, cursor_query("flows")]


class Cursors:
    """Makes and reads the cursors of one store, signed with its secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _check(self, payload: str) -> str:
        return hmac.new(self._secret, payload.encode(), hashlib.sha256).hexdigest()[:24]

    def encode(self, kind: str, key: int | str | None) -> str | None:
        """The cursor after ``key`` in list ``kind`` (None at the end of the list)."""
        if key is None:
            return None
        payload = f"{kind}:{key}"
        return base64.urlsafe_b64encode(f"{payload}:{self._check(payload)}".encode()).decode().rstrip("=")

    def _payload(self, kind: str, cursor: str) -> str:
        try:
            text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
            payload, check = text.rsplit(":", 1)
            got_kind, key = payload.split(":", 1)
        except ValueError:  # not base64, not UTF-8, or not kind:key:check
            raise _refused() from None
        if got_kind != kind or not hmac.compare_digest(check, self._check(payload)):
            raise _refused()
        return key

    def decode(self, kind: str, cursor: str | None) -> int | None:
        """The integer key in ``cursor`` (None for the first page); 400 if it is not a cursor of this list."""
        if cursor is None:
            return None
        key = self._payload(kind, cursor)
        if _DIGITS.fullmatch(key) is None or int(key) > MAX_INT:
            raise _refused()
        return int(key)

    def decode_name(self, kind: str, cursor: str | None) -> str | None:
        """The name in ``cursor`` (None for the first page); 400 if it is not a cursor of this list."""
        return None if cursor is None else self._payload(kind, cursor)


def _refused() -> ApiProblem:
    return ApiProblem(400, "cursor: not a cursor of this list; pass back the `nextCursor` of the previous page "
                      "unchanged", errors=[("cursor", "not a cursor of this list")], kind="invalid-cursor")


def cursors_of(request: Request) -> Cursors:
    """The cursors of the server's store (its secret is read, or made, on the first list asked for)."""
    state = request.app.state
    cursors: Cursors | None = getattr(state, "cursors", None)
    if cursors is None:
        cursors = state.cursors = Cursors(state.kernel.store.secret(SECRET_NAME))
    return cursors
