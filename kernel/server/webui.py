"""The web UI (DESIGN §10): static assets that ship inside the package, served at ``/``.

The UI is a page of JavaScript modules that calls only the public API under ``/api/v1`` and its
event stream, so anything it shows a script can get too. There is no build step: the files in
``static/`` are the source. One ``StaticFiles`` mount serves them (the way Burr ships its UI); it
is mounted last, so every API route is matched first.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

ASSETS = Path(__file__).resolve().parent / "static"

# The page may load and call nothing but this server: no CDN, no external font, no inline script.
# The browser enforces it (a violation is a console error, which the browser tests fail on).
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "
                           "frame-ancestors 'none'")


class UiFiles(StaticFiles):
    """``StaticFiles`` with the UI's security headers; ``index.html`` is revalidated on every load so a
    new version of flowkernel is picked up at once."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        if path == "api" or path.startswith("api/"):
            # Not the UI's: an endpoint the API does not have is a 404 problem, whatever the method.
            raise HTTPException(status_code=404)
        response = await super().get_response(path, scope)
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-cache"
        return response


def mount(app: FastAPI) -> None:
    """Serve the UI at ``/`` (after the API's routes: a mount at the root matches every path)."""
    app.mount("/", UiFiles(directory=ASSETS, html=True), name="ui")
