"""No cross-site commands: a request that changes state must be JSON and come from the server's own
pages (or an origin the operator lists).

A page on another origin can make a browser send a POST without asking the server first (a "simple"
request: a form, or ``fetch`` with ``mode: "no-cors"``), but only with a ``text/plain``, form or
multipart body. Requiring ``Content-Type: application/json`` on every POST, PUT, PATCH and DELETE
under the API makes such a request one the browser must ask about first (a CORS preflight), which
this server answers only for the origins given with ``serve --cors-origin``. The ``Origin`` and
``Sec-Fetch-Site`` headers a browser adds say where a request comes from: a foreign origin is
refused outright, so nothing depends on the browser's preflight alone. Clients that are not
browsers (the CLI, curl, httpx) send neither header and are judged by the token, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from flowkernel.server.problems import problem
from starlette.datastructures import Headers
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Receive, Scope, Send

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORTS = {"http": ":80", "https": ":443"}


def cors_origin(value: str) -> str:
    """A ``--cors-origin`` value as browsers send ``Origin`` (``scheme://host[:port]``); ValueError if not one."""
    origin = value.strip().rstrip("/").lower()
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query or parts.fragment:
        raise ValueError("give an origin as a browser sends it: scheme://host[:port] (e.g. http://localhost:5173), "
                         "no path; each origin once (no wildcard)")
    return origin


def _authority(netloc: str, scheme: str) -> str:
    netloc = netloc.lower()
    default = _DEFAULT_PORTS.get(scheme)
    return netloc.removesuffix(default) if default else netloc


def same_origin(origin: str, host: str | None) -> bool:
    """Whether ``origin`` names the server the request was sent to (its ``Host``). The scheme is the
    origin's: behind a TLS proxy the server itself sees plain HTTP."""
    parts = urlsplit(origin)
    if host is None or parts.scheme not in _DEFAULT_PORTS or not parts.netloc:
        return False
    return _authority(parts.netloc, parts.scheme) == _authority(host.strip(), parts.scheme)


def is_json(content_type: str | None) -> bool:
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == "application/json"


def _routed(scope: Scope) -> bool:
    """Whether one of the app's routes takes this method at this path: a request none takes changes
    nothing, and is answered as unknown (404) or with the methods the path takes (405)."""
    app = scope.get("app")
    routes = getattr(app, "routes", None) or ()
    return any(not isinstance(route, Mount) and route.matches(scope)[0] is Match.FULL for route in routes)


class CrossSiteGuard:
    """ASGI middleware for the API's state-changing requests: 403 from a foreign origin, 415 without JSON."""

    def __init__(self, app: ASGIApp, prefix: str, origins: Iterable[str] = ()) -> None:
        self.app = app
        self.prefix = prefix
        self.origins = frozenset(origins)

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """Why the request is refused (status, detail, problem kind), or None."""
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is not None:
            if origin not in self.origins and not same_origin(origin, headers.get("host")):
                return (403, f"a request from another origin ({origin[:200]}) cannot change anything here; an "
                             "operator allows a site's pages with `flowkernel serve --cors-origin ORIGIN`",
                        "cross-origin-refused")
        elif headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
            return (403, "a request from another site cannot change anything here; an operator allows a site's "
                         "pages with `flowkernel serve --cors-origin ORIGIN`", "cross-origin-refused")
        if not is_json(headers.get("content-type")):
            return (415, "a request that changes state must send JSON with `Content-Type: application/json` "
                         "(an empty body as `{}`)", "json-required")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if (scope["type"] != "http" or scope["method"] not in STATE_CHANGING
                or not (path == self.prefix or path.startswith(self.prefix + "/"))):
            await self.app(scope, receive, send)
            return
        refused = self.refusal(scope) if _routed(scope) else None  # else routing answers 404 or 405
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, detail, kind = refused
        headers = {"Accept-Post": "application/json"} if status == 415 else None
        await problem(status, detail, kind=kind, headers=headers)(scope, receive, send)
