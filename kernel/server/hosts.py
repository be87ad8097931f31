"""The server answers only for its own names: a request whose ``Host`` is not one of them is 421.

A web page whose DNS name an attacker points at 127.0.0.1 (DNS rebinding) reaches a loopback
server from the victim's browser, with the attacker's name in ``Host``; refusing names the server
was not told about keeps such a page from reading or starting runs. The loopback names
(``localhost``, ``127.0.0.1`` and the rest of 127/8, ``::1``) are always the server's own; the
operator adds others with ``serve --allowed-host NAME``. With a token set (``FLOWKERNEL_API_TOKEN``)
and no ``--allowed-host``, any name is served: the token is what a browser cannot send on its own.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from flowkernel.server.problems import problem
from starlette.types import ASGIApp, Receive, Scope, Send


def host_name(header: str) -> str | None:
    """The name in a ``Host`` header, lower-cased, without its port or IPv6 brackets; None if malformed."""
    value = header.strip().lower()
    if value.startswith("["):  # an IPv6 address
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1:]
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit()):
        return None
    return name or None


def is_loopback(name: str) -> bool:
    """Whether ``name`` (a host name or address, brackets allowed) can only mean this machine."""
    name = name.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def allowed_host(value: str) -> str:
    """An ``--allowed-host`` value as the check compares it; ValueError saying what is wrong."""
    name = value.strip().lower()
    if not name or any(c in name for c in "/@ \t") or "://" in name:
        raise ValueError("give a host name or address as clients put it in `Host` (e.g. flowkernel.example.com), "
                         "without a scheme or path")
    if name.startswith("["):
        name = name.removesuffix("]").removeprefix("[")
    elif name.count(":") == 1:
        raise ValueError("give the name without a port: the check ignores ports")
    if name.count(":") > 1:
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            raise ValueError("not an IPv6 address (write one as ::1 or [::1], without a port)") from None
    return name


class HostCheck:
    """ASGI middleware: answers 421 (a problem+json) to a request whose ``Host`` names another server."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = frozenset(allowed)

    def serves(self, header: str | None) -> bool:
        name = host_name(header) if header is not None else None
        return name is not None and (is_loopback(name) or name in self.allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan (the API has no websockets)
            await self.app(scope, receive, send)
            return
        header = next((value.decode("latin-1") for name, value in scope["headers"] if name == b"host"), None)
        if self.serves(header):
            await self.app(scope, receive, send)
            return
        shown = "no Host header" if header is None else f"Host {header[:200]!r}"
        names = "localhost, 127.0.0.1, [::1]" + "".join(f", {n}" for n in sorted(self.allowed))
        refusal = problem(421, f"this server answers only for its own names ({names}), not {shown}; "
                               "an operator adds a name with `flowkernel serve --allowed-host NAME`",
                          kind="misdirected-request")
        await refusal(scope, receive, send)
