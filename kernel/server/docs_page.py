"""The API's document and its docs page: ``GET /api/v1/openapi.json`` and ``GET /api/v1/docs``.

The document needs the token like every other route (it says what the server can do). The docs page
is Swagger UI from files shipped in ``apidocs/`` (swagger-ui-dist, unchanged, with its license), so it
works with no network; the page and its files hold no data and are public, which is how a browser
can load them at all (it sends no ``Authorization`` header for a page, a script or a stylesheet).
The page's own script then fetches the document with the token, asking for it as the web UI does,
and adds it to every request made from the page. No inline script: a Content-Security-Policy
without ``'unsafe-inline'`` holds.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from flowkernel.server import document
from flowkernel.server.webui import CONTENT_SECURITY_POLICY
from starlette.staticfiles import StaticFiles

ASSETS = Path(__file__).resolve().parent / "apidocs"


def add_document(router: APIRouter) -> None:
    """``GET /openapi.json`` on ``router`` (the token-guarded one)."""

    @router.get("/openapi.json", include_in_schema=False)
    def openapi_document(request: Request) -> JSONResponse:
        return JSONResponse(document.document_of(request.app))


def mount(app: FastAPI, prefix: str) -> None:
    """The docs page at ``{prefix}/docs`` and its files under ``{prefix}/docs/``, open to all."""

    @app.get(f"{prefix}/docs", include_in_schema=False)
    def docs_page() -> FileResponse:
        return FileResponse(ASSETS / "index.html", media_type="text/html",
                            headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY, "Cache-Control": "no-cache",
                                     "Referrer-Policy": "no-referrer"})

    app.mount(f"{prefix}/docs", StaticFiles(directory=ASSETS), name="api-docs")
