"""The OpenAPI document (``GET /api/v1/openapi.json``), exactly as this server answers (DESIGN §10).

FastAPI writes it from the routes and their pydantic models; this module makes it say what FastAPI
cannot know: which problems (``application/problem+json``) each route can answer with, declared on
the route with ``problems(...)``; that this server needs the bearer token (a security scheme, only
when it has one: ``FLOWKERNEL_API_TOKEN``), so 401 on every route but ``health``; 413 on every
request body and 503 wherever the store is read; and it drops FastAPI's own ``422 Validation Error``,
which this server never sends (a malformed parameter is a 400 problem, a malformed body a 422 one).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from flowkernel.server.crosssite import STATE_CHANGING
from flowkernel.server.views import Problem

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
MEDIA_TYPE = "application/problem+json"
SCHEME = "bearerToken"
_WHEN = {
    400: "a malformed request: a query, path or header parameter, or a body that is not JSON (`errors` names it)",
    401: "no `Authorization: Bearer <token>` with this server's FLOWKERNEL_API_TOKEN",
    403: "a state-changing request from a browser page of another origin (one not given with "
         "`serve --cors-origin`)",
    404: "no such run, agent run, message, tool call or flow",
    409: "the run's state refuses the command (recorded as `command:received` with `accepted: false`)",
    413: "a request body over the server's limit (10 MB by default)",
    415: "a state-changing request whose body is not `Content-Type: application/json`",
    421: "the request's `Host` is not one of this server's names (loopback, or `serve --allowed-host`)",
    422: "the body is not what the route takes, or what it names is invalid (`errors` has each problem's JSON "
         "path)",
    503: "the store cannot serve the request now (retry later)",
}
_FASTAPI_422 = "#/components/schemas/HTTPValidationError"


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: the problems it answers with besides those every route shares."""
    return {status: problem_response(status) for status in statuses}


def problem_response(status: int) -> dict[str, Any]:
    return {"description": _WHEN[status], "content": {MEDIA_TYPE: {"schema": PROBLEM_REF}}}


def document_of(app: FastAPI) -> dict[str, Any]:
    """``app``'s document, made on first use (routes do not change once the server runs)."""
    doc: dict[str, Any] | None = getattr(app.state, "document", None)
    if doc is None:
        config = app.state.config
        doc = app.state.document = build(app, token=config.token is not None, open_paths=app.state.open_paths,
                                         host_check=config.token is None or bool(config.allowed_hosts))
    return doc


def build(app: FastAPI, *, token: bool, open_paths: frozenset[str], host_check: bool = True) -> dict[str, Any]:
    """The document of ``app``. ``token``: the server needs one; ``open_paths``: paths that never do;
    ``host_check``: requests naming another host are refused (421)."""
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas.update(Problem.model_json_schema(ref_template="#/components/schemas/{model}").pop("$defs", {}))
    schemas["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    components["securitySchemes"] = {SCHEME: {
        "type": "http", "scheme": "bearer",
        "description": "FLOWKERNEL_API_TOKEN, when the server has one" + ("" if token else " (this one has not)")}}
    for path, item in doc.get("paths", {}).items():
        for method, operation in item.items():
            for parameter in operation.get("parameters", []):
                parameter["schema"] = _not_null(parameter["schema"])
            responses: dict[str, Any] = operation.setdefault("responses", {})
            for status, response in list(responses.items()):
                schema = response.get("content", {}).get("application/json", {}).get("schema", {})
                if schema.get("$ref") == _FASTAPI_422:
                    del responses[status]
            operation.pop("security", None)
            if host_check:
                responses["421"] = problem_response(421)
            if method.upper() in STATE_CHANGING:
                responses["403"] = problem_response(403)
                responses["415"] = problem_response(415)
                if "requestBody" in operation:  # a JSON body is what a state-changing request must send
                    operation["requestBody"]["required"] = True
            if path in open_paths:
                continue
            if token:
                operation["security"] = [{SCHEME: []}]
                responses["401"] = problem_response(401)
            responses["503"] = problem_response(503)
            if "requestBody" in operation:
                responses["413"] = problem_response(413)
            operation["responses"] = dict(sorted(responses.items()))
    return doc


def _not_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A parameter's schema without pydantic's ``null`` branch: a query, path or header parameter is
    absent or a string, never null; what is said of the parameter (format, enum, pattern) goes with
    the value's own schema, where a client generating values looks for it."""
    branches = schema.get("anyOf")
    rest = [b for b in branches if b != {"type": "null"}] if isinstance(branches, list) else []
    if len(rest) != 1:
        return schema
    return {**rest[0], **{k: v for k, v in schema.items() if k not in ("anyOf", "default")}}
