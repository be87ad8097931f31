"""What the server tells a client about itself: the API's document only with the token, every answer
with ``X-Content-Type-Options: nosniff``, and no path of the server's machine in an error (a flow file
is named by its path in its ``--flows`` folder, the store as "the store"). A real uvicorn server on a
loopback port."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from flowkernel.server import ServerConfig

from tests.server_support import Live, serving
from tests.test_server import HELLO

TOKEN = "s3cret"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    folder = tmp_path / "server-flows"
    folder.mkdir()
    shutil.copy(HELLO, folder / "hello.json")
    config = ServerConfig(token=TOKEN, flows=[folder], max_body_bytes=1000, keepalive_s=0.5)
    with serving(str(tmp_path / "private" / "runs.db"), config) as server:
        server.headers = {"Authorization": f"Bearer {TOKEN}"}
        yield server


def test_the_document_needs_the_token_and_its_page_does_not(live: Live) -> None:
    with httpx.Client(base_url=live.url, timeout=30) as anonymous:
        refused = anonymous.get("/api/v1/openapi.json")
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        page = anonymous.get("/api/v1/docs")
        assert page.status_code == 200 and "swagger-ui-bundle.js" in page.text
        assert "/api/v1/runs" not in page.text  # the page holds no part of the document
        assert anonymous.get("/api/v1/docs/swagger-ui-bundle.js").status_code == 200
    with live.client() as http:
        assert http.get("/api/v1/openapi.json").json()["info"]["title"] == "flowkernel"


def test_every_answer_says_nosniff(live: Live) -> None:
    run_id = anyio.run(live.kernel.run, live.kernel.load_flow(HELLO), {"name": "Ada"}).runId
    with live.client() as http, httpx.Client(base_url=live.url, timeout=30) as anonymous:
        answers = [
            http.get("/api/v1/runs"), http.get(f"/api/v1/runs/{run_id}/events"), http.get("/api/v1/openapi.json"),
            http.get(f"/api/v1/runs/{run_id}/stream"),  # a finished run's stream ends
            http.get("/api/v1/runs/run_none"), http.request("TRACE", "/api/v1/runs"),
            http.post("/api/v1/runs", content=b"x" * 2000, headers={"content-type": "application/json"}),  # 413
            anonymous.get("/api/v1/runs"), anonymous.get("/api/v1/health"), anonymous.get("/"),
            anonymous.get("/app.js"), anonymous.get("/api/v1/docs"), anonymous.get("/api/v1/docs/docs.js"),
            anonymous.get("/no-such-file.js")]
    assert {a.status_code for a in answers} >= {200, 401, 404, 405, 413}
    for answer in answers:
        assert answer.headers.get("x-content-type-options") == "nosniff", answer.request.url


def test_errors_name_flow_files_by_their_folder_path_and_never_the_servers_paths(live: Live, tmp_path: Path) -> None:
    with live.client() as http:
        answers = [
            http.post("/api/v1/runs", json={"flow": "hello", "input": {}}),
            http.post("/api/v1/runs", json={"flow": "hello", "input": {"name": 3}}),
            http.get("/api/v1/runs/run_none"), http.get("/api/v1/runs/run_none/events"),
            http.post("/api/v1/runs/run_none/pause", json={}), http.get("/api/v1/flows/none"),
            http.get("/api/v1/agent-runs/nr_none")]
    for answer in answers:
        assert answer.status_code in (404, 422), answer.text
        assert str(tmp_path) not in answer.text and "runs.db" not in answer.text, answer.text
    bad_input = answers[0].json()
    assert bad_input["detail"].startswith("hello.json: "), bad_input
    assert answers[2].json()["detail"] == "no run 'run_none'; GET /api/v1/runs lists the runs"
    assert json.loads(answers[1].text)["errors"][0]["path"] == "$.input.name"
