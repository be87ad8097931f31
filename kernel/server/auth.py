"""Bearer-token auth: with ``FLOWKERNEL_API_TOKEN`` set, every ``/api/v1`` route but ``health`` needs it."""

from __future__ import annotations

import secrets
from collections.abc import Callable

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from flowkernel.server.problems import ApiProblem

_bearer = HTTPBearer(auto_error=False, description="the server's FLOWKERNEL_API_TOKEN")


def token_check(token: str | None) -> Callable[[HTTPAuthorizationCredentials | None], None]:
    """A dependency that refuses requests without ``Authorization: Bearer <token>`` (none if no token)."""
    expected = token.encode() if token else None

    def check(credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
        if expected is None:
            return
        given = credentials.credentials.encode() if credentials is not None else b""
        # Constant-time: how much of a guess matches must not show in how long the answer takes.
        if credentials is None or not secrets.compare_digest(given, expected):
            raise ApiProblem(401, "this server needs `Authorization: Bearer <token>` with its FLOWKERNEL_API_TOKEN",
                             kind="unauthorized", headers={"WWW-Authenticate": "Bearer"})

    return check
