"""The HTTP API (DESIGN §10) against a real uvicorn server on a loopback port, on SQLite and PostgreSQL.

Runs are made the way users make them: through the Python API or a ``flowkernel`` CLI process on the
same store, while the server answers from its own connections.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from flowkernel.server import ServerConfig

from tests.server_support import Frame, Live, serving, sse_frames, wait_for
from tests.test_postgres import needs_pg, pg_url  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parent.parent
HELLO = ROOT / "flows" / "hello.json"
PROBLEM = "application/problem+json"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=needs_pg)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "runs.db")
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def live(db: str) -> Iterator[Live]:
    with serving(db) as server:
        yield server


def hello(live: Live, name: str = "Ada") -> str:
    snap = anyio.run(live.kernel.run, live.kernel.load_flow(HELLO), {"name": name})
    return snap.runId


def asking_flow(tmp_path: Path) -> Path:
    path = tmp_path / "ask.json"
    path.write_text(json.dumps({"name": "ask", "nodes": [
        {"id": "q", "type": "human.input", "input": {"prompt": "Proceed?", "schema": {"type": "string"}}},
        {"id": "done", "type": "transform", "input": {"expr": "q"}}], "edges": [{"from": "q", "to": "done"}]}))
    return path


def waiting_run(live: Live, tmp_path: Path) -> tuple[str, str]:
    """A run waiting at ``q``; returns its id and the waiting node run."""
    snap = anyio.run(live.kernel.run, live.kernel.load_flow(asking_flow(tmp_path)), {})
    assert snap.status == "waiting"
    return snap.runId, snap.waiting["q"].runId


def assert_problem(response: httpx.Response, status: int, *, path: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["title"] and body["detail"] and body["type"]
    assert "Traceback" not in response.text and 'File "' not in response.text
    if path is not None:
        assert path in [e["path"] for e in body.get("errors", [])], body
    return body


def cli(env_db: str, *args: str, env_extra: dict[str, str] | None = None,
        **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", **(env_extra or {})}
    env.pop("FLOWKERNEL_DB", None)
    return subprocess.run([sys.executable, "-m", "flowkernel", *args, "--db", env_db], capture_output=True, text=True,
                          env=env, timeout=120, cwd=str(ROOT), **kw)


# --- health, auth, errors ---------------------------------------------------------------------


def test_health_reports_the_store_kind_and_version(live: Live, db: str) -> None:
    with live.client() as http:
        got = http.get("/api/v1/health")
    assert got.status_code == 200
    body = got.json()
    assert body["status"] == "ok" and body["version"]
    assert body["store"] == ("postgresql" if db.startswith("postgresql") else "sqlite")


def test_a_token_guards_every_route_but_health(tmp_path: Path) -> None:
    with serving(str(tmp_path / "runs.db"), ServerConfig(token="s3cret")) as live, live.client() as http:
        assert http.get("/api/v1/health").status_code == 200
        missing = http.get("/api/v1/runs")
        assert_problem(missing, 401)
        assert missing.headers["www-authenticate"] == "Bearer"
        assert_problem(http.get("/api/v1/runs", headers={"Authorization": "Bearer s3cre"}), 401)
        assert_problem(http.get("/api/v1/runs", headers={"Authorization": "Basic s3cret"}), 401)
        assert_problem(http.post("/api/v1/runs/run_x/pause", json={}), 401)
        ok = http.get("/api/v1/runs", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json() == {"items": [], "nextCursor": None}


def test_unknown_runs_and_routes_are_404_problems(live: Live) -> None:
    with live.client() as http:
        body = assert_problem(http.get("/api/v1/runs/run_nope"), 404)
        assert "run_nope" in body["detail"]
        assert_problem(http.get("/api/v1/runs/run_nope/events"), 404)
        assert_problem(http.get("/api/v1/runs/run_nope/stream"), 404)
        assert_problem(http.get("/api/v1/nothing-here"), 404)


def test_a_failure_inside_the_server_is_a_500_problem_without_a_traceback(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with serving(str(db)) as live:
        run_id = hello(live)
        # A damaged row: the store holds bytes that are not an event.
        raw = sqlite3.connect(db)
        raw.execute("UPDATE checkpoints SET body = '{\"runId\": \"run_' WHERE run_id = ?", (run_id,))
        raw.commit()
        raw.close()
        with live.client() as http:
            got = http.get(f"/api/v1/runs/{run_id}")
        body = assert_problem(got, 500)
        assert "Traceback" not in json.dumps(body) and "msgspec" not in json.dumps(body)
        raw = sqlite3.connect(db)
        raw.execute("DELETE FROM runs")  # keep the replay audit away from the damage
        raw.commit()
        raw.close()


def test_bad_query_parameters_are_400_problems_naming_the_parameter(live: Live) -> None:
    run_id = hello(live)
    with live.client() as http:
        assert_problem(http.get("/api/v1/runs", params={"limit": 0}), 400, path="limit")
        assert_problem(http.get("/api/v1/runs", params={"limit": 100000}), 400, path="limit")
        assert_problem(http.get("/api/v1/runs", params={"limit": "ten"}), 400, path="limit")
        assert_problem(http.get("/api/v1/runs", params={"status": "sleeping"}), 400, path="status")
        assert_problem(http.get("/api/v1/runs", params={"cursor": "not-a-cursor"}), 400, path="cursor")
        assert_problem(http.get(f"/api/v1/runs/{run_id}/events", params={"types": "node:begin"}), 400, path="types")
        assert_problem(http.get(f"/api/v1/runs/{run_id}", params={"at": 10_000}), 400, path="at")
        assert_problem(http.get(f"/api/v1/runs/{run_id}/events", params={"after": -1}), 400, path="after")


def test_a_tampered_cursor_or_one_from_another_list_is_refused(live: Live) -> None:
    run_ids = [hello(live, n) for n in ("A", "B", "C")]
    with live.client() as http:
        first = http.get("/api/v1/runs", params={"limit": 1}).json()
        cursor = first["nextCursor"]
        assert cursor is not None
        flipped = cursor[:-2] + ("A" if cursor[-2] != "A" else "B") + cursor[-1]
        assert_problem(http.get("/api/v1/runs", params={"cursor": flipped}), 400, path="cursor")
        events_cursor = http.get(f"/api/v1/runs/{run_ids[0]}/events", params={"limit": 1}).json()["nextCursor"]
        assert_problem(http.get("/api/v1/runs", params={"cursor": events_cursor}), 400, path="cursor")


def test_cors_is_off_unless_origins_are_configured(tmp_path: Path) -> None:
    origin = {"Origin": "http://localhost:5173"}
    with serving(str(tmp_path / "a.db")) as live, live.client() as http:
        assert "access-control-allow-origin" not in http.get("/api/v1/runs", headers=origin).headers
    config = ServerConfig(cors_origins=["http://localhost:5173"])
    with serving(str(tmp_path / "b.db"), config) as live, live.client() as http:
        got = http.get("/api/v1/runs", headers=origin)
        assert got.headers["access-control-allow-origin"] == "http://localhost:5173"
        pre = http.options("/api/v1/runs/run_x/pause", headers={**origin, "Access-Control-Request-Method": "POST",
                                                                "Access-Control-Request-Headers": "authorization"})
        assert pre.status_code == 200
        assert http.get("/api/v1/runs", headers={"Origin": "http://evil.example"}).headers.get(
            "access-control-allow-origin") is None


def test_the_openapi_document_lists_every_endpoint_with_its_models(live: Live) -> None:
    with live.client() as http:
        doc = http.get("/api/v1/openapi.json").json()
    paths = doc["paths"]
    for path, method in [("/api/v1/health", "get"), ("/api/v1/runs", "get"), ("/api/v1/runs/{runId}", "get"),
                         ("/api/v1/runs/{runId}/events", "get"), ("/api/v1/runs/{runId}/stream", "get"),
                         ("/api/v1/runs/{runId}/send", "post"), ("/api/v1/runs/{runId}/reply", "post"),
                         ("/api/v1/runs/{runId}/pause", "post"), ("/api/v1/runs/{runId}/abort", "post"),
                         ("/api/v1/flows", "get"), ("/api/v1/flows/{name}", "get"),
                         ("/api/v1/flows/validate", "post")]:
        assert method in paths[path], path
    schemas = doc["components"]["schemas"]
    assert {"RunSummary", "RunDetail", "Usage", "Problem", "Accepted", "Health"} <= set(schemas)
    assert set(schemas["RunSummary"]["properties"]) == {
        "runId", "flowName", "status", "parentRunId", "createdAt", "updatedAt", "completedAt", "durationMs",
        "totalCostUsd", "usage", "error"}


# --- runs ---------------------------------------------------------------------------------


def test_runs_are_listed_newest_first_with_filters(live: Live, tmp_path: Path) -> None:
    first, second = hello(live, "Ada"), hello(live, "Grace")
    waiting, _ = waiting_run(live, tmp_path)
    with live.client() as http:
        items = http.get("/api/v1/runs").json()["items"]
        assert [r["runId"] for r in items] == [waiting, second, first]
        assert set(items[0]) == {"runId", "flowName", "status", "parentRunId", "createdAt", "updatedAt",
                                 "completedAt", "durationMs", "totalCostUsd", "usage", "error"}
        assert items[1]["status"] == "completed" and items[1]["durationMs"] >= 0 and items[1]["completedAt"]
        assert items[0]["completedAt"] is None and items[0]["usage"]["inputTokens"] == 0
        assert [r["runId"] for r in http.get("/api/v1/runs", params={"status": "waiting"}).json()["items"]] == [waiting]
        assert [r["runId"] for r in http.get("/api/v1/runs", params={"flow": "hello"}).json()["items"]] == [
            second, first]
        assert http.get("/api/v1/runs", params={"parentRunId": first}).json()["items"] == []


def test_keyset_pages_neither_repeat_nor_skip_when_runs_are_added_between_pages(live: Live) -> None:
    before = [hello(live, f"n{i}") for i in range(5)]
    seen: list[str] = []
    with live.client() as http:
        page = http.get("/api/v1/runs", params={"limit": 2}).json()
        seen += [r["runId"] for r in page["items"]]
        added = [hello(live, f"new{i}") for i in range(3)]  # newer: never in a later page
        while page["nextCursor"]:
            page = http.get("/api/v1/runs", params={"limit": 2, "cursor": page["nextCursor"]}).json()
            seen += [r["runId"] for r in page["items"]]
            hello(live, "meanwhile")
        assert seen == list(reversed(before))
        fresh = http.get("/api/v1/runs", params={"limit": 500}).json()["items"]
        assert [r["runId"] for r in fresh][-5:] == list(reversed(before)) and added[-1] in [r["runId"] for r in fresh]


def test_run_detail_is_the_shape_of_show_json(live: Live) -> None:
    run_id = hello(live)
    with live.client() as http:
        got = http.get(f"/api/v1/runs/{run_id}").json()
        at2 = http.get(f"/api/v1/runs/{run_id}", params={"at": 2}).json()
    shown = json.loads(cli(live.db, "show", run_id, "--json").stdout)
    assert got == shown
    assert got["run"]["runId"] == run_id and got["run"]["status"] == "completed" and got["children"] == []
    assert got["snapshot"]["outputs"]["finish"]["letters"] == "A-D-A!"
    assert at2["snapshot"]["seq"] == 2 and at2["snapshot"]["status"] == "running"


def test_child_runs_are_listed_in_the_detail_and_by_parent(live: Live) -> None:
    snap = anyio.run(live.kernel.run, live.kernel.load_flow(ROOT / "tests" / "flows" / "parent.json"), {})
    with live.client() as http:
        detail = http.get(f"/api/v1/runs/{snap.runId}").json()
        children = http.get("/api/v1/runs", params={"parentRunId": snap.runId}).json()["items"]
    assert [c["runId"] for c in detail["children"]] == [c["runId"] for c in children] and len(children) == 1
    assert children[0]["parentRunId"] == snap.runId


# --- events ---------------------------------------------------------------------------------


def test_events_are_exactly_what_events_json_prints(live: Live) -> None:
    run_id = hello(live)
    printed = [json.loads(line) for line in cli(live.db, "events", run_id, "--json").stdout.splitlines()]
    with live.client() as http:
        items: list[dict[str, Any]] = []
        cursor = None
        while True:
            page = http.get(f"/api/v1/runs/{run_id}/events", params={"limit": 7, **({"cursor": cursor} if cursor
                                                                                      else {})}).json()
            items += page["items"]
            cursor = page["nextCursor"]
            if cursor is None:
                break
        assert items == printed
        after = http.get(f"/api/v1/runs/{run_id}/events", params={"after": 5, "limit": 3}).json()["items"]
        assert [e["seq"] for e in after] == [6, 7, 8]
        starts = http.get(f"/api/v1/runs/{run_id}/events", params={"types": "node:start,flow:complete"}).json()
        assert {e["type"] for e in starts["items"]} == {"node:start", "flow:complete"}
        assert [e for e in printed if e["type"] in ("node:start", "flow:complete")] == starts["items"]


def test_event_pages_pick_up_events_committed_between_pages(live: Live, tmp_path: Path) -> None:
    run_id, node_run = waiting_run(live, tmp_path)
    with live.client() as http:
        page = http.get(f"/api/v1/runs/{run_id}/events", params={"limit": 500}).json()
        last = page["items"][-1]["seq"]
        assert page["nextCursor"] is None
        anyio.run(live.kernel.reply, run_id, node_run, "yes")
        rest = http.get(f"/api/v1/runs/{run_id}/events", params={"after": last}).json()["items"]
        assert [e["seq"] for e in rest] == list(range(last + 1, last + 1 + len(rest)))
        assert rest[0]["type"] == "command:received" and rest[-1]["type"] == "flow:complete"


# --- the stream -----------------------------------------------------------------------------


def read_stream(live: Live, run_id: str, *, headers: dict[str, str] | None = None, params: dict[str, Any] | None = None,
                until_complete: bool = True, into: list[Frame] | None = None) -> list[Frame]:
    frames: list[Frame] = [] if into is None else into
    with live.client() as http, http.stream("GET", f"/api/v1/runs/{run_id}/stream", headers=headers or {},
                                            params=params or {}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for frame in sse_frames(response):
            frames.append(frame)
            if not until_complete and frame.comment == "keepalive":
                break
    return frames


def test_the_stream_sends_the_whole_history_then_ends_after_flow_complete(live: Live) -> None:
    run_id = hello(live)
    frames = read_stream(live, run_id)
    events = [json.loads(line) for line in cli(live.db, "events", run_id, "--json").stdout.splitlines()]
    assert [f.id for f in frames] == [e["seq"] for e in events]
    assert [f.event for f in frames] == [e["type"] for e in events]
    assert [json.loads(f.data or "") for f in frames] == events
    assert frames[-1].event == "flow:complete"


def test_the_stream_resumes_after_last_event_id_or_after(live: Live) -> None:
    run_id = hello(live)
    whole = read_stream(live, run_id)
    resumed = read_stream(live, run_id, headers={"Last-Event-ID": "4"})
    assert [f.id for f in resumed] == [f.id for f in whole][4:]
    by_query = read_stream(live, run_id, params={"after": 10})
    assert [f.id for f in by_query] == [f.id for f in whole][10:]
    with live.client() as http:
        assert_problem(http.get(f"/api/v1/runs/{run_id}/stream", headers={"Last-Event-ID": "x"}), 400,
                       path="Last-Event-ID")


def test_a_waiting_run_keeps_its_stream_open_with_keepalives_and_carries_on_after_a_reply(
        live: Live, tmp_path: Path) -> None:
    run_id, node_run = waiting_run(live, tmp_path)
    frames: list[Frame] = []
    reader = threading.Thread(target=read_stream, args=(live, run_id), kwargs={"into": frames})
    reader.start()
    wait_for(lambda: any(f.comment == "keepalive" for f in frames), what="a keepalive on a waiting run")
    assert frames[-1].comment == "keepalive" and any(f.event == "node:waiting" for f in frames)
    with live.client() as other:  # another client answers
        accepted = other.post(f"/api/v1/runs/{run_id}/reply", json={"to": node_run, "content": "yes"})
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["accepted"] is True
    # Nobody executes the run yet: a CLI process continues it (`serve --workers` would).
    done = cli(live.db, "resume", run_id)
    assert done.returncode == 0, done.stderr
    reader.join(30)
    assert not reader.is_alive()
    events = [f for f in frames if f.id is not None]
    assert [f.id for f in events] == list(range(1, len(events) + 1))
    kinds = [f.event for f in events]
    assert kinds[-1] == "flow:complete" and "command:received" in kinds
    assert kinds.index("command:received") > kinds.index("node:waiting")
    assert json.loads(events[-1].data or "")["status"] == "completed"


def test_two_clients_of_a_run_executed_by_another_process_receive_identical_sequences(live: Live) -> None:
    flow = ROOT / "tests" / "flows" / "await.json"
    env_plugin = ["--plugin", "tests.plugins.waiters"]
    process = subprocess.Popen([sys.executable, "-m", "flowkernel", *env_plugin, "run", str(flow), "--json",
                                "--db", live.db], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"})
    try:
        assert process.stdout is not None
        run_id = json.loads(process.stdout.readline())["flowRunId"]
        streams: list[list[Frame]] = [[], []]
        readers = [threading.Thread(target=read_stream, args=(live, run_id), kwargs={"into": s}) for s in streams]
        for r in readers:
            r.start()
        wait_for(lambda: all(any(f.event == "node:start" for f in s) for s in streams), what="both streams")
        with live.client() as http:
            # A command sent over HTTP reaches the node run executing in the CLI process.
            events = http.get(f"/api/v1/runs/{run_id}/events", params={"types": "node:start"}).json()["items"]
            node_run = next(e["runId"] for e in events if e["nodeId"] == "wait")
            sent = http.post(f"/api/v1/runs/{run_id}/send", json={"to": node_run, "message": "over http"})
            assert sent.status_code == 202, sent.text
        _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        for r in readers:
            r.join(30)
        a, b = ([(f.id, f.event, f.data) for f in s if f.id is not None] for s in streams)
        assert a == b and a[-1][1] == "flow:complete"
        assert json.loads(a[-1][2] or "")["status"] == "completed"
        final = live.kernel.snapshot(run_id)
        assert final.outputs["wait"] == ["over http"]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# --- commands -------------------------------------------------------------------------------


def refusals(live: Live, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(b) for b in live.kernel.store.read_events(run_id)
            if b.startswith(b'{"type":"command:received"') and b'"accepted":false' in b]


def test_commands_refused_over_http_are_refused_and_recorded_as_on_the_cli(live: Live, tmp_path: Path) -> None:
    run_id, node_run = waiting_run(live, tmp_path)
    with live.client() as http:
        no_to = assert_problem(http.post(f"/api/v1/runs/{run_id}/reply", json={"content": "yes"}), 422)
        foreign = assert_problem(http.post(f"/api/v1/runs/{run_id}/send", json={"to": "nr_foreign", "message": "x"}),
                                 422)
        paused = assert_problem(http.post(f"/api/v1/runs/{run_id}/pause", json={}), 409)
        bad_reply = assert_problem(http.post(f"/api/v1/runs/{run_id}/reply", json={"to": node_run, "content": 42}),
                                   422)
    recorded = refusals(live, run_id)
    assert [(r["command"], r["reason"]) for r in recorded] == [
        ("reply", no_to["detail"]), ("send", foreign["detail"]), ("pause", paused["detail"]),
        ("reply", bad_reply["detail"])]
    assert [r["refusal"] for r in recorded] == ["invalid", "invalid", "conflict", "invalid"]
    # The CLI refuses the same command with the same reason.
    on_cli = cli(live.db, "reply", run_id, "yes")
    assert on_cli.returncode == 2 and no_to["detail"] in on_cli.stderr
    assert live.kernel.snapshot(run_id).status == "waiting"


def test_a_command_the_run_state_refuses_is_409_and_an_unknown_run_records_nothing(live: Live) -> None:
    run_id = hello(live)
    seq = live.kernel.store.get_run(run_id).seq
    with live.client() as http:
        body = assert_problem(http.post(f"/api/v1/runs/{run_id}/abort", json={"reason": "late"}), 409)
        assert "completed" in body["detail"]
        assert_problem(http.post("/api/v1/runs/run_unknown/abort", json={}), 404)
    assert [r["command"] for r in refusals(live, run_id)] == ["abort"]
    assert live.kernel.store.get_run(run_id).seq == seq + 1


def test_abort_over_http_ends_a_waiting_run(live: Live, tmp_path: Path) -> None:
    run_id, _ = waiting_run(live, tmp_path)
    with live.client() as http:
        got = http.post(f"/api/v1/runs/{run_id}/abort", json={"reason": "no longer needed"})
    assert got.status_code == 202
    seq = got.json()["seq"]
    events = live.kernel.events(run_id)
    assert events[seq - 1].type == "command:received" and events[-1].type == "flow:complete"
    assert live.kernel.snapshot(run_id).status == "aborted"


def test_malformed_oversized_and_mistyped_bodies_are_refused_and_record_nothing(live: Live, tmp_path: Path) -> None:
    run_id, node_run = waiting_run(live, tmp_path)
    seq = live.kernel.store.get_run(run_id).seq
    url = f"/api/v1/runs/{run_id}/reply"
    with live.client() as http:
        assert_problem(http.post(url, content=b'{"to": ', headers={"content-type": "application/json"}), 400,
                       path="$")
        assert_problem(http.post(url, content=b'{"to": "\xff\xfe"}', headers={"content-type": "application/json"}),
                       400)
        assert_problem(http.post(url, json={"to": node_run, "content": "x", "extra": 1}), 422, path="$.extra")
        assert_problem(http.post(url, json={"to": ["not", "a", "string"], "content": "x"}), 422, path="$.to")
        huge = b'{"to": "' + node_run.encode() + b'", "content": "' + b"x" * (10 * 1024 * 1024) + b'"}'
        assert_problem(http.post(url, content=huge, headers={"content-type": "application/json"}), 413)

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            yield b'{"to": "' + node_run.encode() + b'", "content": "'
            for _ in range(11):
                yield b"x" * (1024 * 1024)
            yield b'"}'

        assert_problem(http.post(url, content=chunks(), headers={"content-type": "application/json"}), 413)
    assert live.kernel.store.get_run(run_id).seq == seq
    assert live.kernel.snapshot(run_id).status == "waiting"


# --- flows ----------------------------------------------------------------------------------


def test_flows_are_listed_from_the_flows_folders_and_validated(tmp_path: Path) -> None:
    folder = tmp_path / "flows"
    folder.mkdir()
    (folder / "hello.json").write_text(HELLO.read_text())
    (folder / "broken.json").write_text('{"name": "broken", "nodes": [{"id": "a", "type": "nope"}]}')
    with serving(str(tmp_path / "runs.db"), ServerConfig(flows=[folder])) as live, live.client() as http:
        listed = http.get("/api/v1/flows").json()["items"]
        assert [f["name"] for f in listed] == ["hello"]
        assert listed[0]["inputs"]["required"] == ["name"]
        assert http.get("/api/v1/flows/hello").json()["name"] == "hello"
        assert_problem(http.get("/api/v1/flows/broken"), 404)
        assert http.post("/api/v1/flows/validate", json=json.loads(HELLO.read_text())).json() == {"valid": True}
        bad = {"name": "bad", "nodes": [{"id": "a", "type": "noop"}, {"id": "a", "type": "nope", "extra": 1}],
               "edges": [{"from": "a", "to": "ghost"}, {"from": "a", "to": "a", "when": "(("}]}
        body = assert_problem(http.post("/api/v1/flows/validate", json=bad), 422)
        paths = [e["path"] for e in body["errors"]]
        assert any(p.startswith("$.nodes[1]") for p in paths) and any(p.startswith("$.edges[0]") for p in paths)
        assert any(p.startswith("$.edges[1]") for p in paths)
        assert_problem(http.post("/api/v1/flows/validate", content=b"[1,", headers={"content-type":
                                                                                    "application/json"}), 400)


# --- the command line -----------------------------------------------------------------------


def test_serve_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FLOWKERNEL_API_TOKEN", None)
    done = subprocess.run([sys.executable, "-m", "flowkernel", "serve", "--host", "0.0.0.0", "--db",
                           str(tmp_path / "runs.db")], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2
    assert "FLOWKERNEL_API_TOKEN" in done.stderr and "Traceback" not in done.stderr


def test_serve_runs_on_loopback_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    import signal
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLOWKERNEL_API_TOKEN": "tok"}
    process = subprocess.Popen([sys.executable, "-m", "flowkernel", "serve", "--port", str(port), "--db",
                                str(tmp_path / "runs.db")], stderr=subprocess.PIPE, text=True, env=env)
    try:
        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, what="flowkernel serve to answer")
        runs = httpx.get(f"http://127.0.0.1:{port}/api/v1/runs", headers={"Authorization": "Bearer tok"})
        assert runs.status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# --- agent history ----------------------------------------------------------------------------


def research_run(live: Live) -> str:
    """The research example (an agent with two tool calls and an ask_human) run by CLI processes."""
    env = {"FLOWKERNEL_PLUGINS": "flowkernel.examples.research_tools"}
    first = cli(live.db, "run", "flows/research.json", "--input", "question=Which database should our desktop app use?",
                "--fixtures",
                "fixtures/research", "--json", env_extra=env)
    assert first.returncode == 3, first.stderr
    run_id = json.loads(first.stdout.splitlines()[0])["flowRunId"]
    node_run = live.kernel.snapshot(run_id).waiting["researcher"].runId
    done = cli(live.db, "reply", run_id, "--to", node_run, "Mostly record transactions.", "--fixtures",
               "fixtures/research", env_extra=env)
    assert done.returncode == 0, done.stderr
    return run_id


def test_a_runs_agent_messages_and_tool_calls_are_paged_and_filtered(live: Live) -> None:
    run_id = research_run(live)
    stored = live.kernel.store.list_agent_messages(flow_run_id=run_id, limit=1000)
    with live.client() as http:
        messages: list[dict[str, Any]] = []
        page = http.get(f"/api/v1/runs/{run_id}/messages", params={"limit": 2}).json()
        messages += page["items"]
        while page["nextCursor"]:
            page = http.get(f"/api/v1/runs/{run_id}/messages", params={"limit": 2, "cursor": page["nextCursor"]}).json()
            messages += page["items"]
        assert [m["messageId"] for m in messages] == [r["id"] for r in stored]
        first = messages[0]
        assert set(first) == {"messageId", "agentRunId", "runId", "agentId", "sessionId", "role", "content", "step",
                              "createdAt"}
        assert first["runId"] == run_id and first["agentId"] == "researcher"
        agent_runs = {m["agentRunId"] for m in messages}
        calls = http.get(f"/api/v1/runs/{run_id}/tool-calls").json()["items"]
        assert [c["toolName"] for c in calls] == ["lookup_fact", "lookup_fact", "ask_human"]
        only = http.get(f"/api/v1/runs/{run_id}/tool-calls", params={"toolName": "ask_human",
                                                                     "status": "completed"}).json()["items"]
        assert [c["output"] for c in only] == ["Mostly record transactions."]
        assert http.get(f"/api/v1/runs/{run_id}/messages", params={"nodeId": "nobody"}).json()["items"] == []
        assert_problem(http.get(f"/api/v1/runs/{run_id}/tool-calls", params={"status": "done"}), 400, path="status")
        assert_problem(http.get("/api/v1/runs/run_nope/messages"), 404)

        agent_run = calls[0]["agentRunId"]
        assert agent_run in agent_runs
        mine = http.get(f"/api/v1/agent-runs/{agent_run}/messages", params={"limit": 500}).json()["items"]
        assert mine and all(m["agentRunId"] == agent_run for m in mine)
        assert [m["step"] for m in mine] == sorted(m["step"] for m in mine)
        one = http.get(f"/api/v1/agent-runs/{agent_run}/messages/{mine[-1]['messageId']}").json()
        assert one == mine[-1]
        tools = http.get(f"/api/v1/agent-runs/{agent_run}/tool-calls", params={"toolName": "lookup_fact"}).json()
        assert len(tools["items"]) == 2 and tools["nextCursor"] is None
        call = tools["items"][0]
        assert http.get(f"/api/v1/agent-runs/{agent_run}/tool-calls/{call['toolCallId']}").json() == call
        assert set(call) == {"toolCallId", "toolUseId", "messageId", "agentRunId", "runId", "agentId", "toolName",
                             "input", "output", "status", "durationMs", "step", "createdAt"}
        assert_problem(http.get("/api/v1/agent-runs/nr_nope/messages"), 404)
        assert_problem(http.get(f"/api/v1/agent-runs/{agent_run}/messages/999999"), 404)
        assert_problem(http.get(f"/api/v1/agent-runs/{agent_run}/tool-calls/999999"), 404)
        assert_problem(http.get(f"/api/v1/agent-runs/{agent_run}/messages/abc"), 400, path="messageId")


def test_agent_runs_are_listed_newest_first_with_filters_and_their_detail_has_usage(live: Live) -> None:
    first = research_run(live)
    with live.client() as http:
        page = http.get("/api/v1/agent-runs", params={"limit": 1}).json()
        seen = page["items"]
        second = research_run(live)  # two more agent runs, stored between the pages
        while page["nextCursor"]:
            page = http.get("/api/v1/agent-runs", params={"limit": 1, "cursor": page["nextCursor"]}).json()
            seen += page["items"]
        stored = [r for _, r in live.kernel.store.list_agent_runs(run_id=first)]
        assert [a["agentRunId"] for a in seen] == [r.agentRunId for r in stored]  # no gap, no repeat, newest first
        waited, answered = reversed(stored)
        assert (waited.status, answered.status, answered.resumedFrom) == ("interrupted", "completed",
                                                                          waited.agentRunId)
        assert set(seen[0]) == {"agentRunId", "runId", "agentId", "status", "stepCount", "maxSteps", "sessionId",
                                "resumedFrom", "parentRunId", "createdAt", "completedAt", "durationMs",
                                "errorMessage", "totalCostUsd"}
        every = http.get("/api/v1/agent-runs").json()["items"]
        assert [a["runId"] for a in every] == [second, second, first, first]
        done = http.get("/api/v1/agent-runs", params={"status": "completed", "runId": second}).json()["items"]
        assert [a["status"] for a in done] == ["completed"] and done[0]["agentId"] == "researcher"
        assert http.get("/api/v1/agent-runs", params={"agentId": "nobody"}).json()["items"] == []
        assert http.get("/api/v1/agent-runs", params={"parentRunId": first}).json()["items"] == []

        detail = http.get(f"/api/v1/agent-runs/{answered.agentRunId}").json()
        assert {k: detail[k] for k in seen[0]} == next(a for a in seen if a["agentRunId"] == answered.agentRunId)
        assert detail["summary"] == answered.summary and detail["summary"]
        assert detail["model"] == answered.model and detail["usage"] == answered.usage
        assert detail["stepCount"] == answered.stepCount >= 1 and detail["maxSteps"] == 50
        run = http.get(f"/api/v1/runs/{first}").json()["run"]
        assert run["totalCostUsd"] == pytest.approx(sum(r.totalCostUsd for r in stored), abs=1e-9)

        assert_problem(http.get("/api/v1/agent-runs/nr_nope"), 404)
        assert_problem(http.get(f"/api/v1/agent-runs/{answered.agentRunId}", params={"runId": second}), 404)
        assert_problem(http.get("/api/v1/agent-runs", params={"status": "done"}), 400, path="status")
        assert_problem(http.get("/api/v1/agent-runs", params={"limit": 0}), 400, path="limit")
        runs_cursor = http.get("/api/v1/runs", params={"limit": 1}).json()["nextCursor"]
        assert_problem(http.get("/api/v1/agent-runs", params={"cursor": runs_cursor}), 400, path="cursor")
