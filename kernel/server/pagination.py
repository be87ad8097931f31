"""Opaque keyset cursors: ``{"items": [...], "nextCursor": "…" | null}``.

A cursor is the key of the last item of a page (a run number, a seq, a row id) with the list it
belongs to and a check, base64url-encoded: a client cannot mistake one list's cursor for another's,
and an edited cursor is refused (400) rather than silently read as another position.
"""

from __future__ import annotations

import base64
import hashlib

from flowkernel.server.problems import ApiProblem

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
_KEY = b"flowkernel cursor v1"


def _check(payload: str) -> str:
    return hashlib.blake2b(payload.encode(), key=_KEY, digest_size=6).hexdigest()


def encode_cursor(kind: str, key: int | None) -> str | None:
    if key is None:
        return None
    payload = f"{kind}:{key}"
    return base64.urlsafe_b64encode(f"{payload}:{_check(payload)}".encode()).decode().rstrip("=")


def decode_cursor(kind: str, cursor: str | None) -> int | None:
    """The key in ``cursor`` (None for the first page); 400 if it is not a cursor of this list."""
    if cursor is None:
        return None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        got_kind, key, check = text.split(":")
        if got_kind != kind or check != _check(f"{got_kind}:{key}") or not key.isdigit():
            raise ValueError
        return int(key)
    except ValueError:
        raise ApiProblem(400, "cursor: not a cursor of this list; pass back the `nextCursor` of the previous page "
                         "unchanged", errors=[("cursor", "not a cursor of this list")], kind="invalid-cursor") from None
