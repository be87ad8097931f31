"""The web UI (DESIGN §10): static assets that ship inside the package, served at ``/``.

The UI is a page of JavaScript modules that calls only the public API under ``/api/v1`` and its
event stream, so anything it shows a script can get too. There is no build step: the files in
``static/`` are the source. One ``StaticFiles`` mount serves them (the way Burr ships its UI); it
is mounted last, so every API route is matched first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from flowkernel.server.document import document_of
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Mount
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

ASSETS = Path(__file__).resolve().parent / "static"

# The page may load and call nothing but this server: no CDN, no external font, no inline script.
# The browser enforces it (a violation is a console error, which the browser tests fail on).
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "
                           "frame-ancestors 'none'")


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


class UiFiles(StaticFiles):
    """``StaticFiles`` with the UI's security headers; ``index.html`` is revalidated on every load so a
    new version of flowkernel is picked up at once."""

    def __init__(self, *, routes: Sequence[BaseRoute], **kw: Any) -> None:
        super().__init__(**kw)
        self.routes = routes

    async def get_response(self, path: str, scope: Scope) -> Response:
        if path == "api" or path.startswith("api/"):
            # Not the UI's. A path the API has, asked with a method it does not take, is a 405 saying
            # which it takes (the document lists no other); any other is a 404 problem.
            allowed = self._allowed({**scope, "path": "/" + path})
            if allowed:
                raise HTTPException(status_code=405, detail=f"{scope['method']} is not a method of /{path}; "
                                    f"it takes {', '.join(allowed)}", headers={"Allow": ", ".join(allowed)})
            raise HTTPException(status_code=404)
        response = await super().get_response(path, scope)
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-cache"
        return response


    def _allowed(self, scope: Scope) -> list[str]:
        """The methods the API's routes take at ``scope``'s path (none if no route has it). A path the
        document names as it is (``/api/v1/flows/validate``) takes its own methods, not those of a
        templated path it also fits (``/api/v1/flows/{name}``), as OpenAPI matches paths. Otherwise each
        route is asked (``matches``), so routers included in routers are asked too."""
        concrete = document_of(scope["app"])["paths"].get(scope["path"])
        if concrete is not None:
            return sorted(method.upper() for method in concrete)
        return [method for method in _METHODS if any(
            not isinstance(route, Mount) and route.matches({**scope, "method": method})[0] is Match.FULL
            for route in self.routes)]


def mount(app: FastAPI) -> None:
    """Serve the UI at ``/`` (after the API's routes: a mount at the root matches every path)."""
    app.mount("/", UiFiles(directory=ASSETS, html=True, routes=app.routes), name="ui")
