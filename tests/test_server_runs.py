"""Runs started and continued over HTTP (DESIGN §10, §11): ``POST /runs`` queues a run for the worker
pool, ``resume``/``retry``/``reply`` hand it back to the pool, and ``serve --workers N`` executes
with the same ``Worker`` as ``flowkernel worker``. A real uvicorn server on a loopback port, on
SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from flowkernel.server import ServerConfig

import tests.plugins.pool
import tests.plugins.serving  # noqa: F401  (likewise serving.unless_file)
from tests.server_support import Live, pool_worker, serving, wait_for
from tests.test_postgres import needs_pg, pg_url  # noqa: F401  (the fixture)
from tests.test_server import HELLO, ROOT, assert_problem, cli

ASK = {"name": "ask", "inputs": {"type": "object", "properties": {"topic": {"type": "string"}}},
       "nodes": [{"id": "q", "type": "human.input", "input": {"prompt": "About {{ flow.input.topic }}?",
                                                              "schema": {"type": "string"}}},
                 {"id": "done", "type": "transform", "input": {"expr": "q"}}],
       "edges": [{"from": "q", "to": "done"}]}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=needs_pg)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "runs.db")
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def live(db: str) -> Iterator[Live]:
    with serving(db, ServerConfig(keepalive_s=0.5, flows=[HELLO.parent])) as server:
        yield server


@pytest.fixture
def pool(live: Live) -> Iterator[Live]:
    """The server and a worker pool on its store: what ``serve --workers 2`` runs."""
    with pool_worker(live.db):
        yield live


def status(http: httpx.Client, run_id: str) -> str:
    got: str = http.get(f"/api/v1/runs/{run_id}").json()["run"]["status"]
    return got


def test_a_run_started_by_flow_name_is_queued_and_a_worker_completes_it(pool: Live) -> None:
    with pool.client() as http:
        created = http.post("/api/v1/runs", params={"wait": 30}, json={"flow": "hello", "input": {"name": "Ada"}})
        assert created.status_code == 201, created.text
        body = created.json()
        assert created.headers["location"] == f"/api/v1/runs/{body['runId']}"
        assert (body["flowName"], body["status"], body["error"]) == ("hello", "completed", None)
        assert set(body["usage"]) == {"inputTokens", "outputTokens", "cacheCreationInputTokens",
                                      "cacheReadInputTokens"}
        detail = http.get(created.headers["location"]).json()
        assert detail["snapshot"]["status"] == "completed" and detail["run"]["input"] == {"name": "Ada"}
    # The CLI sees the run the API created, through the store.
    shown = cli(pool.db, "show", body["runId"], "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["run"]["status"] == "completed"


def test_without_workers_a_run_stays_queued_and_wait_answers_after_its_seconds(live: Live) -> None:
    with live.client() as http:
        created = http.post("/api/v1/runs", params={"wait": 0.3}, json={"flow": "hello", "input": {"name": "x"}})
        assert created.status_code == 201 and created.json()["status"] == "queued"
        run_id = created.json()["runId"]
        assert http.get("/api/v1/runs", params={"status": "queued"}).json()["items"][0]["runId"] == run_id
    # A `flowkernel worker` process on the same store executes it.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen([sys.executable, "-m", "flowkernel", "worker", "--db", live.db, "--grace-s", "1"],
                              stderr=subprocess.PIPE, text=True, env=env)
    try:
        with live.client() as http:
            wait_for(lambda: status(http, run_id) == "completed", what="a worker process to complete the run")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0


def test_a_run_started_from_a_flow_document_waits_then_a_reply_over_http_lets_the_pool_finish_it(
        pool: Live) -> None:
    with pool.client() as http:
        created = http.post("/api/v1/runs", params={"wait": 30}, json={"flowDocument": ASK, "input": {"topic": "tea"}})
        assert created.status_code == 201, created.text
        assert created.json()["status"] == "waiting"
        run_id = created.json()["runId"]
        snap = http.get(f"/api/v1/runs/{run_id}").json()["snapshot"]
        node_run = snap["waiting"]["q"]["runId"]
        assert snap["waiting"]["q"]["prompt"] == "About tea?"
        replied = http.post(f"/api/v1/runs/{run_id}/reply", json={"to": node_run, "content": "green"})
        assert replied.status_code == 202, replied.text
        wait_for(lambda: status(http, run_id) == "completed", what="the pool to finish the run after the reply")
        assert http.get(f"/api/v1/runs/{run_id}").json()["snapshot"]["outputs"]["done"] == "green"


def test_the_same_idempotency_key_gives_the_same_run_even_at_once(live: Live) -> None:
    body = {"flow": "hello", "input": {"name": "Ada"}, "idempotencyKey": "order-17"}
    with live.client() as http:
        first = http.post("/api/v1/runs", json=body)
        again = http.post("/api/v1/runs", json=body)
        assert (first.status_code, again.status_code) == (201, 200)
        assert again.json()["runId"] == first.json()["runId"]
        assert again.headers["location"] == first.headers["location"]
    answers: list[httpx.Response] = []

    def post() -> None:
        with live.client() as http:
            answers.append(http.post("/api/v1/runs", json={**body, "idempotencyKey": "order-18"}))

    threads = [threading.Thread(target=post) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 201]
    assert len({a.json()["runId"] for a in answers}) == 1
    with live.client() as http:
        assert len(http.get("/api/v1/runs", params={"flow": "hello"}).json()["items"]) == 2


def test_bad_run_requests_are_problems_naming_the_field_and_store_nothing(live: Live) -> None:
    bad_doc = {"name": "bad", "nodes": [{"id": "a", "type": "nope"}, {"id": "a", "type": "noop"}],
               "edges": [{"from": "a", "to": "ghost"}], "extra": 1}
    with live.client() as http:
        assert_problem(http.post("/api/v1/runs", json={"input": {}}), 422, path="$.flow")
        assert_problem(http.post("/api/v1/runs", json={"flow": "hello", "flowDocument": ASK}), 422, path="$.flow")
        assert_problem(http.post("/api/v1/runs", json={"flow": "nope"}), 422, path="$.flow")
        invalid = assert_problem(http.post("/api/v1/runs", json={"flowDocument": bad_doc}), 422)
        paths = {e["path"] for e in invalid["errors"]}
        assert {"$.flowDocument.nodes[0].type", "$.flowDocument.edges[0].to", "$.flowDocument.extra"} <= paths
        assert_problem(http.post("/api/v1/runs", json={"flow": "hello", "input": {"name": 3}}), 422,
                       path="$.input.name")
        assert_problem(http.post("/api/v1/runs", json={"flow": "hello", "input": {}}), 422)
        assert_problem(http.post("/api/v1/runs", json={"flow": "hello", "idempotencyKey": ""}), 422,
                       path="$.idempotencyKey")
        for wait in ("-1", "301", "soon"):
            assert_problem(http.post("/api/v1/runs", params={"wait": wait}, json={"flow": "hello"}), 400,
                           path="wait")
        assert_problem(http.post("/api/v1/runs", content=b'{"flow": ', headers={"content-type": "application/json"}),
                       400)
        assert http.get("/api/v1/runs").json()["items"] == []


def gated(tmp_path: Path) -> dict[str, Any]:
    """``g`` waits for the file ``g.go`` in ``tmp_path`` (``pool.gate``); then ``after`` copies its output."""
    return {"name": "gated", "nodes": [
        {"id": "g", "type": "python", "input": {"function": "pool.gate", "args": {"label": "g", "dir": str(tmp_path)}}},
        {"id": "after", "type": "transform", "input": {"expr": "g"}}], "edges": [{"from": "g", "to": "after"}]}


def test_resume_over_http_continues_a_paused_run_through_the_pool_with_its_message(
        pool: Live, tmp_path: Path) -> None:
    with pool.client() as http:
        run_id = http.post("/api/v1/runs", json={"flowDocument": gated(tmp_path)}).json()["runId"]
        wait_for(lambda: (tmp_path / "g.entered").exists(), what="the node run to start")
        paused = http.post(f"/api/v1/runs/{run_id}/pause", json={"reason": "lunch"})
        assert paused.status_code == 202, paused.text
        wait_for(lambda: status(http, run_id) == "paused", what="the run to pause")
        (tmp_path / "g.go").write_text("")
        resumed = http.post(f"/api/v1/runs/{run_id}/resume", json={"message": "back"})
        assert resumed.status_code == 202, resumed.text
        wait_for(lambda: status(http, run_id) == "completed", what="the pool to continue the run")
        events = http.get(f"/api/v1/runs/{run_id}/events", params={"after": resumed.json()["seq"] - 1}).json()
        first, second = events["items"][:2]
        assert (first["type"], first["command"], first["accepted"]) == ("command:received", "resume", True)
        assert (second["type"], second["message"]) == ("flow:resumed", "back")
        # Resuming a completed run is refused by the same judge as on the CLI, and recorded.
        again = assert_problem(http.post(f"/api/v1/runs/{run_id}/resume", json={}), 409)
        assert "completed" in again["detail"]
        last = http.get(f"/api/v1/runs/{run_id}/events", params={"types": "command:received"}).json()["items"][-1]
        assert (last["command"], last["accepted"]) == ("resume", False)


def flaky(tmp_path: Path) -> dict[str, Any]:
    """``f`` fails until the file ``ready`` exists in ``tmp_path``."""
    return {"name": "flaky", "nodes": [{"id": "f", "type": "python", "input": {
        "function": "serving.unless_file", "args": {"path": str(tmp_path / "ready")}}}], "edges": []}


def test_retry_over_http_runs_the_failed_node_again_in_the_pool(pool: Live, tmp_path: Path) -> None:
    marker = tmp_path / "ready"
    with pool.client() as http:
        created = http.post("/api/v1/runs", params={"wait": 30}, json={"flowDocument": flaky(tmp_path)})
        assert created.json()["status"] == "failed", created.text
        run_id = created.json()["runId"]
        marker.write_text("")
        retried = http.post(f"/api/v1/runs/{run_id}/retry", json={})
        assert retried.status_code == 202, retried.text
        wait_for(lambda: status(http, run_id) == "completed", what="the retried run to complete")
        assert http.get(f"/api/v1/runs/{run_id}").json()["snapshot"]["outputs"]["f"] == "found"
        assert_problem(http.post(f"/api/v1/runs/{run_id}/retry", json={}), 409)  # nothing failed any more
        assert_problem(http.post("/api/v1/runs/run_unknown/retry", json={}), 404)
        assert_problem(http.post(f"/api/v1/runs/{run_id}/resume", json={"message": 3}), 422, path="$.message")


def test_resume_over_http_of_a_run_a_cli_process_started_names_the_command_instead(
        live: Live, tmp_path: Path) -> None:
    import anyio

    snap = anyio.run(live.kernel.run, live.kernel.compile(flaky(tmp_path)), {})
    assert snap.status == "failed"
    with live.client() as http:
        for kind in ("resume", "retry"):
            body = assert_problem(http.post(f"/api/v1/runs/{snap.runId}/{kind}", json={}), 409)
            assert f"flowkernel {kind} {snap.runId}" in body["detail"]
    assert live.kernel.store.get_run(snap.runId).seq == snap.seq, "nothing recorded"


# --- serve --workers N, as a process ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve(db: str, port: int, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    env.pop("FLOWKERNEL_API_TOKEN", None)
    return subprocess.Popen([sys.executable, "-m", "flowkernel", "serve", "--port", str(port), "--db", db, *args],
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))


def answering(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "Traceback" not in err
    return err


def test_serve_with_workers_fixtures_and_a_plugin_executes_an_agent_flow_offline(db: str, tmp_path: Path) -> None:
    port = free_port()
    process = serve(db, port, "--workers", "2", "--flows", "flows", "--fixtures", "fixtures/research",
                    "--plugin", "flowkernel.examples.research_tools")
    try:
        wait_for(lambda: answering(port), what="serve to answer")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            page = http.get("/")  # the web UI, at the address serve prints for it
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            created = http.post("/api/v1/runs", params={"wait": 60}, json={
                "flow": "research", "input": {"question": "Which database should our desktop app use?"}})
            assert created.status_code == 201, created.text
            assert created.json()["status"] == "waiting", created.text
            run_id = created.json()["runId"]
            node_run = http.get(f"/api/v1/runs/{run_id}").json()["snapshot"]["waiting"]["researcher"]["runId"]
            http.post(f"/api/v1/runs/{run_id}/reply", json={"to": node_run, "content": "Mostly record transactions."})
            wait_for(lambda: status(http, run_id) == "completed", timeout=60, what="the agent run to complete")
            summary = http.get(f"/api/v1/runs/{run_id}").json()["run"]
            assert summary["totalCostUsd"] > 0 and summary["usage"]["inputTokens"] > 0
            agents = http.get("/api/v1/agent-runs", params={"runId": run_id}).json()["items"]
            assert {a["agentId"] for a in agents} == {"researcher"} and agents[0]["status"] == "completed"
    finally:
        if process.poll() is None:
            err = stop(process)
    location = db if db.startswith("/") else err.split("/api/v1 on ", 1)[1].split(" (", 1)[0]
    assert f"flowkernel: serving http://127.0.0.1:{port}/api/v1 on {location} (2 run(s) at once)\n" \
           f"flowkernel: web UI at http://127.0.0.1:{port}/\n" in err, err


def test_sigterm_hands_an_in_flight_run_over_and_the_next_serve_finishes_it(db: str, tmp_path: Path) -> None:
    gate = gated(tmp_path)
    port = free_port()
    args = ("--workers", "1", "--grace-s", "0.2", "--plugin", "tests.plugins.pool")
    first = serve(db, port, *args)
    try:
        wait_for(lambda: answering(port), what="serve to answer")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            run_id = http.post("/api/v1/runs", json={"flowDocument": gate}).json()["runId"]
            wait_for(lambda: (tmp_path / "g.entered").exists(), what="the node run to start")
        err = stop(first)
        assert "handing over 1 run(s)" in err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    (tmp_path / "g.entered").unlink()
    second = serve(db, port, *args)
    try:
        wait_for(lambda: answering(port), what="serve to answer again")
        wait_for(lambda: (tmp_path / "g.entered").exists(), what="the next serve to resume the node run")
        (tmp_path / "g.go").write_text("")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            wait_for(lambda: status(http, run_id) == "completed", what="the resumed run to complete")
            types = [e["type"] for e in http.get(f"/api/v1/runs/{run_id}/events", params={"limit": 500}).json()["items"]]
    finally:
        if second.poll() is None:
            stop(second)
    assert types.count("node:start") == 3 and "flow:resumed" in types  # g, g again after the hand-over, after
