"""Errors as ``application/problem+json`` (RFC 9457): ``{type, title, status, detail, errors?}``.

Every error a route can meet becomes one of these, with the JSON path of each problem in the
request where there is one; nothing else reaches the client, never a stack trace.
"""

from __future__ import annotations

import logging
import os
import re
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from flowkernel.errors import (
    CommandRejectedError,
    FlowkernelError,
    FlowUpdateError,
    FlowValidationError,
    InvalidInputError,
    NotPooledError,
    RunBusyError,
    RunInputError,
    StoreError,
    UnknownRunError,
)
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

MEDIA_TYPE = "application/problem+json"
log = logging.getLogger("flowkernel.server")

_TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           409: "Conflict", 413: "Content Too Large", 415: "Unsupported Media Type", 421: "Misdirected Request",
           422: "Unprocessable Content", 500: "Internal Server Error", 503: "Service Unavailable"}


class ApiProblem(Exception):
    """Raised by routes for an error the client can act on."""

    def __init__(self, status: int, detail: str, *, errors: Sequence[tuple[str, str]] = (),
                 kind: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.errors = list(errors)
        self.kind = kind
        self.headers = headers


def problem(status: int, detail: str, *, errors: Sequence[tuple[str, str]] = (), kind: str | None = None,
            headers: dict[str, str] | None = None, request: Request | None = None) -> JSONResponse:
    """The problem response; with ``request``, the server's own paths are kept out of its text."""
    paths: PrivatePaths | None = getattr(request.app.state, "private_paths", None) if request is not None else None
    if paths is not None:
        detail = paths.hide(detail)
        errors = [(path, paths.hide(message)) for path, message in errors]
    title = _TITLES.get(status, "Error")
    body: dict[str, Any] = {"type": f"https://flowkernel.dev/problems/{kind or title.lower().replace(' ', '-')}",
                            "title": title, "status": status, "detail": detail}
    if errors:
        body["errors"] = [{"path": path, "message": message} for path, message in errors]
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def body_path(loc: Sequence[Any]) -> str:
    """``('body', 'input', 0, 'name')`` -> ``$.input[0].name``: a JSON path into the request body."""
    out = "$"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


class PrivatePaths:
    """Where the server keeps things on its machine, as error messages may name them (a flow file under a
    ``--flows`` folder, the store's file): a client is shown a flow file by its path in its folder and
    the store as "the store", never the server's own paths."""

    def __init__(self, flow_folders: Sequence[Path], store_location: str) -> None:
        folders: set[str] = set()
        for folder in flow_folders:
            folders.update({str(folder), str(folder.resolve()), os.path.abspath(folder)})
        stores = set() if store_location == "memory" else (
            {store_location} if "://" in store_location else {store_location, os.path.abspath(store_location)})
        # Longest first, and only where a path starts (not "flows/" inside "/api/v1/flows/x").
        self._patterns = [(re.compile(r"(?<![\w./-])" + re.escape(text)), by) for text, by in sorted(
            [(s, "the store") for s in stores] + [(f.rstrip(os.sep) + os.sep, "") for f in folders if f],
            key=lambda pair: len(pair[0]), reverse=True)]

    def hide(self, text: str) -> str:
        for pattern, by in self._patterns:
            text = pattern.sub(by, text)
        return text


def _from_flowkernel(exc: FlowkernelError, request: Request) -> JSONResponse:
    if isinstance(exc, UnknownRunError):
        return problem(404, f"no run {exc.run_id!r}; GET /api/v1/runs lists the runs", kind="unknown-run",
                       request=request)
    if isinstance(exc, FlowValidationError):
        return problem(422, f"the flow has {len(exc.problems)} problem{'s' if len(exc.problems) != 1 else ''}",
                       errors=[(p.path, p.message) for p in exc.problems], kind="invalid-flow", request=request)
    if isinstance(exc, FlowUpdateError):
        return problem(422, str(exc).splitlines()[0], errors=[("$.flowDocument", p) for p in exc.problems],
                       kind="incompatible-flow", request=request)
    if isinstance(exc, RunInputError):
        return problem(422, str(exc), errors=[("$.input" + path.removeprefix("input"), message)
                                              for path, message in exc.problems], kind="invalid-input",
                       request=request)
    if isinstance(exc, NotPooledError):
        return problem(409, str(exc), kind="not-pooled", request=request)
    if isinstance(exc, CommandRejectedError):
        status = 422 if exc.invalid else 409
        return problem(status, str(exc), kind="command-refused", request=request)
    if isinstance(exc, RunBusyError):
        return problem(409, str(exc), kind="run-busy", request=request)
    if isinstance(exc, StoreError):
        log.error("store error: %s", exc)
        return problem(503, f"the store cannot serve this request: {exc}", kind="store-unavailable", request=request)
    if isinstance(exc, InvalidInputError):
        return problem(422, str(exc), kind="invalid-request", request=request)
    log.error("flowkernel error in a request: %s", exc)
    return problem(500, "the server could not complete this request; its log says why", kind="internal")


def _body_message(request: Request, error: Any) -> str:
    """Pydantic's message, except for a field the body may not have: that one names the fields it may."""
    if error.get("type") != "extra_forbidden":
        return str(error["msg"])
    name = str(tuple(error["loc"])[-1])
    route = request.scope.get("route")
    fields = _body_fields(route)
    if not fields:
        return f"unknown field {name!r}"
    path = str(getattr(route, "path", request.url.path))
    # The commands are named as the API names them (the last part of their path); POST /runs by its path.
    what = path.rsplit("/", 1)[-1] if "{runId}/" in path else f"{request.method} {request.url.path}"
    quoted = [repr(f) for f in fields]
    listed = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]
    return f"unknown field {name!r}; {what} takes {listed}"


def _body_fields(route: Any) -> list[str]:
    """The fields of ``route``'s body model, in order (none if it has no model body)."""
    field = getattr(route, "body_field", None)
    annotation = getattr(getattr(field, "field_info", None), "annotation", None)
    for candidate in (*typing.get_args(annotation), annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return list(candidate.model_fields)
    return []


def install(app: FastAPI) -> None:
    """Route every error through ``problem``."""

    @app.exception_handler(ApiProblem)
    async def _api(request: Request, exc: ApiProblem) -> JSONResponse:
        return problem(exc.status, exc.detail, errors=exc.errors, kind=exc.kind, headers=exc.headers, request=request)

    @app.exception_handler(FlowkernelError)
    async def _flowkernel(request: Request, exc: FlowkernelError) -> JSONResponse:
        return _from_flowkernel(exc, request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            where = next(e for e in errors if e.get("type") == "json_invalid")
            reason = (where.get("ctx") or {}).get("error", "not valid JSON")
            return problem(400, f"the request body is not valid JSON: {reason}", errors=[("$", str(reason))],
                           kind="malformed-body")
        body = [e for e in errors if e.get("loc", ("",))[0] == "body"]
        if body:
            found = [(body_path(tuple(e["loc"])[1:]), _body_message(request, e)) for e in body]
            detail = (f"{found[0][0]}: {found[0][1]}" if len(found) == 1
                      else f"the request body has {len(found)} problems: " + "; ".join(f"{p}: {m}" for p, m in found))
            return problem(422, detail, errors=found, kind="invalid-body")
        # Query, path and header parameters: a malformed request, named by the parameter.
        return problem(400, "; ".join(f"{e['loc'][-1]}: {e['msg']}" for e in errors),
                       errors=[(str(e["loc"][-1]), str(e["msg"])) for e in errors], kind="invalid-parameter")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else _TITLES.get(exc.status_code, "error")
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no such endpoint: {request.method} {request.url.path}"
        return problem(exc.status_code, detail, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The traceback goes to the server's log, never to the client.
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return problem(500, "the server could not complete this request; its log says why", kind="internal")
