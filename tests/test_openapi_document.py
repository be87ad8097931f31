"""The OpenAPI document says exactly what the server answers (DESIGN §10), checked against real
servers on loopback two ways:

- a walk of the document: every operation, every problem status it declares provoked by a real
  request (and answered as ``application/problem+json`` of the declared schema), every undeclared
  method a 405 naming the declared ones, the token as a bearer security scheme only when the server
  has one, request bodies and cursors with the constraints the server checks;
- schemathesis, a property-based client generated from the document (``flowkernel serve`` process,
  a bounded number of examples per operation): it must find no disagreement.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import jsonschema
import pytest
from flowkernel.run.kernel import Kernel
from flowkernel.server import ServerConfig
from flowkernel.store.open import open_store

from tests.browser_support import serve
from tests.server_support import Live, serving
from tests.test_server import HELLO

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "walk-the-document"
PROBLEM = "application/problem+json"
METHODS = ("get", "post", "put", "patch", "delete", "options", "trace")
# Lists, by the format their cursor has in the document.
LISTS = {"/api/v1/runs": "runs-cursor", "/api/v1/runs/{runId}/events": "events-cursor",
         "/api/v1/agent-runs": "agent-runs-cursor", "/api/v1/runs/{runId}/messages": "messages-cursor",
         "/api/v1/runs/{runId}/tool-calls": "tool-calls-cursor",
         "/api/v1/agent-runs/{agentRunId}/messages": "messages-cursor",
         "/api/v1/agent-runs/{agentRunId}/tool-calls": "tool-calls-cursor", "/api/v1/flows": "flows-cursor"}


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Live]:
    """A server with a token, a small body limit (so 413 is cheap to provoke) and a flows folder."""
    config = ServerConfig(token=TOKEN, flows=[HELLO.parent], max_body_bytes=4096, keepalive_s=0.5)
    with serving(str(tmp_path / "runs.db"), config) as live:
        live.headers = {"Authorization": f"Bearer {TOKEN}"}
        yield live


def document(live: Live) -> dict[str, Any]:
    with live.client() as http:
        got = http.get("/api/v1/openapi.json")
    assert got.status_code == 200, got.text
    doc: dict[str, Any] = got.json()
    return doc


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the document's components reachable (for jsonschema)."""
    return {**schema, "components": doc["components"]}


def completed_run(live: Live) -> str:
    return anyio.run(live.kernel.run, live.kernel.load_flow(HELLO), {"name": "Ada"}).runId


def provoke(live: Live, http: httpx.Client, path: str, method: str, status: int, run_id: str) -> httpx.Response:
    """A real request for which the operation at ``method path`` answers ``status``."""
    known = {"runId": run_id, "agentRunId": "nr_none", "name": "hello", "messageId": "1", "toolCallId": "1"}
    unknown = {"runId": "run_none", "agentRunId": "nr_none", "name": "none", "messageId": "1", "toolCallId": "1"}
    url = path.format(**(unknown if status == 404 else known))
    headers: dict[str, str] = {}
    if status == 401:
        headers["Authorization"] = "Bearer not-the-token"
    if method == "post":
        body: bytes = json.dumps({}).encode()
        if status == 400:
            body = b'{"unfinished": '
        elif status == 413:
            body = json.dumps({"message": "x" * 5000}).encode()
        elif status == 422:
            body = json.dumps({"no-such-field": 1}).encode()
        elif status == 404 and path.endswith("/fork"):
            body = json.dumps({"at": 1}).encode()  # a body the route takes, for a run there is not
        elif status == 409 and path.endswith(("/send", "/reply")):
            body = json.dumps({"to": "nr_x"} if path.endswith("/send") else {"to": "nr_x", "content": "x"}).encode()
        elif path == "/api/v1/runs" or path == "/api/v1/flows/validate":
            body = json.dumps({"flow": "hello", "input": {"name": "Ada"}} if path == "/api/v1/runs"
                              else json.loads(HELLO.read_text())).encode()
        content_type = "text/plain" if status == 415 else "application/json"
        if status == 403:
            headers["Origin"] = "http://elsewhere.example"
        return http.post(url, content=body, headers={**headers, "content-type": content_type})
    params: dict[str, str] = {}
    if status == 400:
        if "{messageId}" in path or "{toolCallId}" in path:
            url = path.format(**{**known, "messageId": "zero", "toolCallId": "zero"})
        elif path.endswith("/stream"):
            headers["Last-Event-ID"] = "x"
        elif path.endswith(("/flow",)) or path == "/api/v1/runs/{runId}":
            params["at"] = "0"
        else:
            params["limit"] = "0"
    if path.endswith("/stream") and status != 400:
        params["after"] = "0"
    return http.get(url, params=params, headers=headers)


def test_every_declared_problem_is_what_a_real_request_gets(guarded: Live) -> None:
    doc = document(guarded)
    problem_schema = resolve(doc, {"$ref": "#/components/schemas/Problem"})
    run_id = completed_run(guarded)
    seen: set[tuple[str, str, int]] = set()
    with guarded.client() as http:
        for path, method, operation in operations(doc):
            declared = sorted(int(s) for s in operation["responses"] if s[0] in "45")
            for status in declared:
                if status == 503:
                    continue  # the store cannot serve: not something a request can bring about
                got = provoke(guarded, http, path, method, status, run_id)
                assert got.status_code == status, (method, path, status, got.text)
                assert got.headers["content-type"] == PROBLEM, (method, path, status)
                assert list(operation["responses"][str(status)]["content"]) == [PROBLEM]
                jsonschema.validate(got.json(), problem_schema)
                seen.add((method, path, status))
    assert len(seen) > 60


def test_the_token_is_a_bearer_scheme_required_only_where_the_server_has_one(guarded: Live, tmp_path: Path) -> None:
    doc = document(guarded)
    assert doc["components"]["securitySchemes"] == {"bearerToken": {
        "type": "http", "scheme": "bearer", "description": "FLOWKERNEL_API_TOKEN, when the server has one"}}
    for path, _, operation in operations(doc):
        assert not [p for p in operation.get("parameters", []) if p["name"].lower() == "authorization"]
        if path == "/api/v1/health":
            assert "security" not in operation and "401" not in operation["responses"]
        else:
            assert operation["security"] == [{"bearerToken": []}] and "401" in operation["responses"], path
    with serving(str(tmp_path / "open.db")) as open_server:
        plain = document(open_server)
        with open_server.client() as http:
            assert http.get("/api/v1/runs").status_code == 200  # no token asked, none declared
    for _, _, operation in operations(plain):
        assert "security" not in operation and "401" not in operation["responses"]


def test_the_document_and_its_page_need_what_the_server_says_and_nothing_more(guarded: Live) -> None:
    with httpx.Client(base_url=guarded.url, timeout=30) as anonymous:
        assert anonymous.get("/api/v1/openapi.json").status_code == 401
        assert anonymous.get("/api/v1/health").status_code == 200
        # The docs page and its files hold no data: a browser loads them without a header.
        page = anonymous.get("/api/v1/docs")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        for asset in re.findall(r'(?:src|href)="(docs/[^"]+)"', page.text):
            assert anonymous.get(f"/api/v1/{asset}").status_code == 200, asset


def test_every_undeclared_method_is_a_405_naming_the_declared_ones(guarded: Live) -> None:
    doc = document(guarded)
    with guarded.client() as http:
        for path, item in doc["paths"].items():
            url = path.format(runId="run_x", agentRunId="nr_x", name="hello", messageId=1, toolCallId=1)
            declared = sorted(m.upper() for m in item)
            for method in METHODS:
                if method in item:
                    continue
                got = http.request(method.upper(), url)
                assert got.status_code == 405, (method, path, got.text)
                assert got.headers["allow"] == ", ".join(declared)
                assert got.headers["content-type"] == PROBLEM


def test_request_bodies_declare_what_the_server_refuses(guarded: Live) -> None:
    doc = document(guarded)

    def body_schema(path: str) -> dict[str, Any]:
        content = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        return resolve(doc, content["schema"])

    runs, validate = body_schema("/api/v1/runs"), body_schema("/api/v1/flows/validate")
    with guarded.client() as http:
        for body in ({}, {"flow": None}, {"flow": "hello", "flowDocument": {"name": "x", "nodes": []}}, {"flow": 3}):
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(body, runs)
            assert http.post("/api/v1/runs", json=body).status_code == 422, body
        for body in ({"flow": "hello", "input": {"name": "Ada"}}, {"flowDocument": {"name": "x", "nodes": []}},
                     {"flow": "hello", "flowDocument": None, "input": {"name": "Ada"}}):
            jsonschema.validate(body, runs)
            assert http.post("/api/v1/runs", json=body).status_code == 201, body
        for body in (None, [], "flow", {"nodes": []}):
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(body, validate)
            sent = http.post("/api/v1/flows/validate", content=json.dumps(body).encode(),
                             headers={"content-type": "application/json"})
            assert sent.status_code == 422, body
        jsonschema.validate(json.loads(HELLO.read_text()), validate)


def test_every_list_declares_its_limit_and_a_cursor_format_of_its_own(guarded: Live) -> None:
    doc = document(guarded)
    listed = {}
    for path, method, operation in operations(doc):
        parameters = {p["name"]: p["schema"] for p in operation.get("parameters", [])}
        if "cursor" not in parameters:
            continue
        listed[path] = cursor = parameters["cursor"]
        assert cursor["type"] == "string" and cursor["pattern"] == "^[A-Za-z0-9_-]{1,1000}$" and cursor["format"] == LISTS[path], path
        assert (parameters["limit"]["minimum"], parameters["limit"]["maximum"]) == (1, 500)
        assert doc["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].startswith(
            "#/components/schemas/Page_")
    assert set(listed) == set(LISTS)


def test_the_document_lists_every_route_of_the_server(guarded: Live) -> None:
    from fastapi.routing import APIRoute
    from flowkernel.server import agents, execute, flows, runs, stream, workers

    doc = document(guarded)
    routes = {(f"/api/v1{r.path}", m.lower()) for module in (runs, execute, stream, agents, flows, workers)
              for r in module.router.routes if isinstance(r, APIRoute) for m in r.methods}
    declared = {(path, method) for path, method, _ in operations(doc)}
    assert routes | {("/api/v1/health", "get")} == declared


# --- a property-based client generated from the document ---------------------------------------

CONFIG = """
hooks = "tests.schemathesis_hooks"
request-timeout = 10
workers = 1
seed = 20260101
color = false
[generation]
max-examples = 5
[phases.stateful]
enabled = false
[phases.coverage]
unexpected-methods = ["TRACE"]
generate-duplicate-query-parameters = false

# A flow named by the body is checked against the server's flows, and the run's input against that
# flow's own `inputs` schema; a flow document is validated whole (every problem with its JSON path):
# what no document can say of every flow, so a drawn body the document allows may be refused (422).
[[operations]]
include-path = "/api/v1/runs"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", 401, 404, 409, 422]
[[operations]]
include-path = "/api/v1/flows/validate"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", 401, 422]
# Likewise a command names one of the run's live node runs, or a flow the run can continue on; a fork
# one of the run's events and an input its flow takes; a rerun a run that has started.
[[operations]]
include-path-regex = "^/api/v1/runs/[{]runId[}]/(send|reply|pause|abort|resume|retry|fork|rerun)$"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", 401, 404, 409, 422]
# And `at` must be one of the run's events: 400 naming `at` past its last one.
[[operations]]
include-path-regex = "^/api/v1/runs/[{]runId[}](/flow)?$"
include-method = "GET"
checks.positive_data_acceptance.expected-statuses = ["2xx", 400, 401, 404]
"""


def test_a_property_based_client_generated_from_the_document_finds_no_disagreement(
        tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    Kernel(open_store(db, create=True)).close()
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLOWKERNEL_TEST_STORE": db, "NO_COLOR": "1"}
    with serve(db, "--flows", str(HELLO.parent), "--workers", "1", token=TOKEN) as server:
        done = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
             f"{server.url}/api/v1/openapi.json", "--checks", "all", "--exclude-path", "/api/v1/runs/{runId}/stream",
             "-H", f"Authorization: Bearer {TOKEN}"],
            capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=240)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "No issues found" in done.stdout or " passed" in done.stdout, done.stdout[-3000:]
