"""Fork, rerun, finding runs, the queue and the workers over HTTP (DESIGN §10, §11): ``POST
/runs/{id}/fork`` and ``/rerun`` call what ``flowkernel fork`` and ``rerun`` call and leave the new run
to the worker pool; ``GET /runs`` filters by run id prefix, flow, status and error text, in either
order; ``GET /workers`` lists what ``flowkernel workers --json`` does. A real uvicorn server on a
loopback port and a pool worker on its store.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from flowkernel.server import ServerConfig

from tests.server_support import Live, pool_worker, serving, wait_for
from tests.test_postgres import needs_pg, pg_url  # noqa: F401  (the fixture)
from tests.test_server import assert_problem, cli

GREETING = {"name": "greeting", "inputs": {"type": "object", "properties": {"name": {"type": "string"}}},
            "nodes": [{"id": "hello", "type": "transform", "input": {"expr": "'Hello, ' & flow.input.name"}},
                      {"id": "loud", "type": "transform", "input": {"expr": "$uppercase(hello)"}}],
            "edges": [{"from": "hello", "to": "loud"}]}
ASK = {"name": "ask", "nodes": [
    {"id": "q", "type": "human.input", "input": {"prompt": "Which?", "schema": {"type": "string"}}},
    {"id": "done", "type": "transform", "input": {"expr": "q"}}], "edges": [{"from": "q", "to": "done"}]}
FAILS = {"name": "fails", "nodes": [{"id": "boom", "type": "transform", "input": {"expr": "$error('Disk 100% full_now')"}}],
         "edges": []}


@pytest.fixture
def flows(tmp_path: Path) -> Path:
    folder = tmp_path / "flows"
    folder.mkdir()
    for doc in (GREETING, ASK, FAILS):
        (folder / f"{doc['name']}.json").write_text(json.dumps(doc))
    return folder


@pytest.fixture
def pool(tmp_path: Path, flows: Path) -> Iterator[Live]:
    with serving(str(tmp_path / "runs.db"), ServerConfig(keepalive_s=0.5, flows=[flows])) as live, \
            pool_worker(live.db):
        yield live


def start(http: httpx.Client, flow: str, input: Any = None) -> dict[str, Any]:
    created = http.post("/api/v1/runs", params={"wait": 30}, json={"flow": flow, "input": input or {}})
    assert created.status_code == 201, created.text
    body: dict[str, Any] = created.json()
    return body


def stopped(http: httpx.Client, run_id: str) -> dict[str, Any]:
    """The run's detail once it is neither queued nor running."""
    def detail() -> dict[str, Any] | None:
        got: dict[str, Any] = http.get(f"/api/v1/runs/{run_id}").json()
        return got if got["run"]["status"] not in ("queued", "running") else None
    found: dict[str, Any] = wait_for(detail, what=f"run {run_id} to stop")
    return found


def events(http: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = http.get(f"/api/v1/runs/{run_id}/events", params={"limit": 500}).json()["items"]
    return items


def test_a_fork_over_http_starts_a_run_from_the_snapshot_after_the_event_with_a_changed_input(pool: Live) -> None:
    with pool.client() as http:
        original = start(http, "greeting", {"name": "Ada"})["runId"]
        recorded = events(http, original)
        at = next(e["seq"] for e in recorded if e["type"] == "node:start" and e["nodeId"] == "loud") - 1
        created = http.post(f"/api/v1/runs/{original}/fork", json={"at": at, "input": {"name": "Grace"}})
        assert created.status_code == 201, created.text
        fork = created.json()
        assert created.headers["location"] == f"/api/v1/runs/{fork['runId']}"
        assert fork["runId"] != original and fork["flowName"] == "greeting"
        detail = stopped(http, fork["runId"])
        assert detail["run"]["status"] == "completed"
        assert (detail["run"]["forkedFrom"], detail["run"]["forkedAt"]) == (original, at)
        # Nodes finished before the cut keep their outputs; the rest ran with the changed input.
        assert detail["snapshot"]["outputs"] == {"hello": "Hello, Ada", "loud": "HELLO, ADA"}
        assert detail["run"]["input"] == {"name": "Grace"}
        copied = events(http, fork["runId"])
        assert [e["type"] for e in copied[:at]] == [e["type"] for e in recorded[:at]]
        assert copied[0]["forkedFrom"] == original
        assert copied[at]["type"] == "flow:resumed"  # as `flowkernel fork` starts it, then a worker went on
        assert copied[-1]["type"] == "flow:complete"


def test_a_fork_refuses_an_event_the_run_does_not_have_and_an_input_its_flow_does_not_take(pool: Live) -> None:
    with pool.client() as http:
        original = start(http, "greeting", {"name": "Ada"})["runId"]
        last = events(http, original)[-1]["seq"]
        too_far = assert_problem(http.post(f"/api/v1/runs/{original}/fork", json={"at": last + 1}), 422)
        assert f"there is no event {last + 1}" in too_far["detail"]
        wrong = assert_problem(http.post(f"/api/v1/runs/{original}/fork", json={"at": 1, "input": {"name": 3}}), 422)
        assert wrong["errors"][0]["path"] == "$.input.name"
        assert_problem(http.post("/api/v1/runs/run_nope/fork", json={"at": 1}), 404)
        assert_problem(http.post(f"/api/v1/runs/{original}/fork", json={}), 422, path="$.at")
        before = http.get("/api/v1/runs").json()["items"]
        assert [r["runId"] for r in before] == [original]  # nothing was created by a refusal


def test_a_rerun_over_http_is_a_run_whose_flow_complete_says_it_matches(pool: Live) -> None:
    with pool.client() as http:
        original = start(http, "greeting", {"name": "Ada"})["runId"]
        created = http.post(f"/api/v1/runs/{original}/rerun", json={})
        assert created.status_code == 201, created.text
        rerun = created.json()
        assert created.headers["location"] == f"/api/v1/runs/{rerun['runId']}"
        detail = stopped(http, rerun["runId"])
        assert detail["run"]["status"] == "completed" and detail["run"]["rerunOf"] == original
        log = events(http, rerun["runId"])
        assert log[0]["rerunOf"] == original
        assert log[-1]["type"] == "flow:complete"
        assert log[-1]["rerun"] == {"of": original, "matches": True}
        assert detail["snapshot"]["outputs"] == {"hello": "Hello, Ada", "loud": "HELLO, ADA"}
    # The same verdict as `flowkernel rerun` on the command line.
    done = cli(pool.db, "rerun", original, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["matches"] is True, done.stdout + done.stderr


def test_a_rerun_of_a_changed_flow_says_where_it_diverged(pool: Live, flows: Path) -> None:
    with pool.client() as http:
        original = start(http, "greeting", {"name": "Ada"})["runId"]
        changed = json.loads(json.dumps(GREETING))
        changed["nodes"][1]["input"]["expr"] = "$lowercase(hello)"
        (flows / "greeting.json").write_text(json.dumps(changed))  # rerun takes the file as it is now
        rerun = http.post(f"/api/v1/runs/{original}/rerun", json={}).json()["runId"]
        stopped(http, rerun)
        verdict = events(http, rerun)[-1]["rerun"]
        # loud's node:start records the input it was given: the first event the changed flow differs at.
        loud = next(e for e in events(http, original) if e["type"] == "node:start" and e["nodeId"] == "loud")
        assert verdict["of"] == original and verdict["matches"] is False
        assert verdict["divergence"]["seq"] == loud["seq"] and verdict["divergence"]["kind"] == "event"
        assert "$uppercase(hello)" in verdict["divergence"]["message"]
    done = cli(pool.db, "rerun", original, "--json")
    assert json.loads(done.stdout)["divergence"]["seq"] == loud["seq"]


def test_a_rerun_stops_where_its_recording_does_and_an_unstarted_run_has_nothing_to_rerun(live_only: Live) -> None:
    with live_only.client() as http:
        queued = http.post("/api/v1/runs", json={"flow": "ask"}).json()["runId"]
        refused = assert_problem(http.post(f"/api/v1/runs/{queued}/rerun", json={}), 422)
        assert "has not started" in refused["detail"]
        assert_problem(http.post("/api/v1/runs/run_nope/rerun", json={}), 404)
        assert_problem(http.post(f"/api/v1/runs/{queued}/rerun", json={"at": 1}), 422)
    with pool_worker(live_only.db), live_only.client() as http:
        assert stopped(http, queued)["run"]["status"] == "waiting"
        rerun = http.post(f"/api/v1/runs/{queued}/rerun", json={}).json()["runId"]
        detail = stopped(http, rerun)
        # The recording waits for a reply it never got: the rerun ends there, and still matches.
        assert detail["run"]["status"] == "aborted"
        last = events(http, rerun)[-1]
        assert last["type"] == "flow:complete" and last["rerun"] == {"of": queued, "matches": True}
        assert "ends where its recording does" in last["error"]


@pytest.fixture
def live_only(tmp_path: Path, flows: Path) -> Iterator[Live]:
    with serving(str(tmp_path / "runs.db"), ServerConfig(keepalive_s=0.5, flows=[flows])) as live:
        yield live


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=needs_pg)])
def any_store(request: pytest.FixtureRequest, tmp_path: Path, flows: Path) -> Iterator[Live]:
    """A server and a pool worker on SQLite, and on PostgreSQL (whose LIKE and LOWER differ)."""
    db = str(tmp_path / "runs.db") if request.param == "sqlite" else request.getfixturevalue("pg_url")
    with serving(db, ServerConfig(keepalive_s=0.5, flows=[flows])) as live, pool_worker(live.db):
        yield live


def test_runs_are_found_by_id_prefix_flow_status_and_error_text_a_page_at_a_time(any_store: Live) -> None:
    with any_store.client() as http:
        ada = start(http, "greeting", {"name": "Ada"})["runId"]
        failed = [start(http, "fails")["runId"] for _ in range(3)]
        assert {stopped(http, r)["run"]["status"] for r in failed} == {"failed"}

        def found(**params: Any) -> list[str]:
            got = http.get("/api/v1/runs", params=params)
            assert got.status_code == 200, got.text
            return [r["runId"] for r in got.json()["items"]]

        everyone = found()
        short = found(runIdPrefix=ada[:12])  # ids begin with their time: close runs share a prefix
        assert ada in short and short == [r for r in everyone if r.startswith(ada[:12])]
        assert found(runIdPrefix=ada) == [ada]
        assert found(runIdPrefix="run_%") == [] and found(runIdPrefix="run__") == []  # LIKE's wildcards are text
        # The error text, whatever its case; `%` and `_` in it are themselves.
        assert found(error="disk 100% FULL_now") == failed[::-1]
        assert found(error="100%") == failed[::-1]
        assert found(error="disk 100x") == [] and found(error="full now") == []
        assert found(error="disk", flow="greeting") == []
        assert found(error="disk", status="completed") == []
        # Keyset pages with a filter: each run once, newest first.
        first = http.get("/api/v1/runs", params={"error": "disk", "limit": 2}).json()
        assert [r["runId"] for r in first["items"]] == failed[:0:-1]
        rest = http.get("/api/v1/runs", params={"error": "disk", "limit": 2, "cursor": first["nextCursor"]}).json()
        assert [r["runId"] for r in rest["items"]] == failed[:1] and rest["nextCursor"] is None
        assert_problem(http.get("/api/v1/runs", params={"order": "sideways"}), 400)
        assert_problem(http.get("/api/v1/runs", params={"runIdPrefix": ""}), 400)


def test_the_queue_lists_queued_runs_oldest_first_and_the_workers_route_lists_the_pool(live_only: Live) -> None:
    with live_only.client() as http:
        queued = [http.post("/api/v1/runs", json={"flow": "greeting", "input": {"name": n}}).json()["runId"]
                  for n in ("a", "b", "c")]
        page = http.get("/api/v1/runs", params={"status": "queued", "order": "oldest", "limit": 2}).json()
        assert [r["runId"] for r in page["items"]] == queued[:2]
        rest = http.get("/api/v1/runs", params={"status": "queued", "order": "oldest", "limit": 2,
                                                "cursor": page["nextCursor"]}).json()
        assert [r["runId"] for r in rest["items"]] == queued[2:] and rest["nextCursor"] is None
        assert http.get("/api/v1/workers").json() == {"items": []}
    with pool_worker(live_only.db) as worker, live_only.client() as http:
        for run_id in queued:
            stopped(http, run_id)
        listed = wait_for(lambda: http.get("/api/v1/workers").json()["items"], what="the worker to register")
        shown = cli(live_only.db, "workers", "--json")
        assert listed == [json.loads(line) for line in shown.stdout.splitlines()]
        assert listed[0]["workerId"] == worker.id and listed[0]["concurrency"] == worker.concurrency
        assert set(listed[0]) == {"workerId", "host", "pid", "startedAt", "heartbeatAt", "concurrency", "leaseMs",
                                  "runs"}


def test_a_rerun_whose_recording_is_gone_when_a_worker_takes_it_ends_failed_saying_why(live_only: Live) -> None:
    with pool_worker(live_only.db), live_only.client() as http:
        original = start(http, "greeting", {"name": "Ada"})["runId"]
    with live_only.client() as http:
        rerun = http.post(f"/api/v1/runs/{original}/rerun", json={}).json()["runId"]
        pruned = cli(live_only.db, "prune", "--older-than", "0s", "--status", "completed")
        assert pruned.returncode == 0, pruned.stderr
        assert_problem(http.get(f"/api/v1/runs/{original}"), 404)
    with pool_worker(live_only.db), live_only.client() as http:
        detail = stopped(http, rerun)
        assert detail["run"]["status"] == "failed"
        assert original in detail["run"]["error"] and "cannot execute the run" in detail["run"]["error"]
