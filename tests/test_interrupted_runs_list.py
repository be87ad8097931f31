"""Listing runs by the status their summaries show: ``interrupted`` (stored as running, but the process
that executed it died) is a status of its own in ``GET /api/v1/runs?status=`` as in ``flowkernel runs
--status``, and ``running`` lists only the runs a process executes, a page at a time over both.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from flowkernel.server import ServerConfig

from tests.helpers import run_id_once_a_node_started
from tests.server_support import Live, serving
from tests.test_postgres import needs_pg, pg_url  # noqa: F401  (the fixture)
from tests.test_server import HELLO, cli, hello

BLOCKED = {"name": "slow", "nodes": [{"id": "work", "type": "python", "input": {"function": "block_first_run"}},
                                     {"id": "after", "type": "noop", "input": {}}],
           "edges": [{"from": "work", "to": "after"}]}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=needs_pg)])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Live]:
    db = str(tmp_path / "runs.db") if request.param == "sqlite" else request.getfixturevalue("pg_url")
    with serving(db, ServerConfig(keepalive_s=0.5, flows=[HELLO.parent])) as server:
        yield server


def blocked_run(db: str, tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """A ``flowkernel run`` process executing a run whose node blocks; returns it once the node runs."""
    flow = tmp_path / "slow.json"
    flow.write_text(json.dumps(BLOCKED))
    proc = subprocess.Popen([sys.executable, "-m", "flowkernel", "--plugin", "tests.plugins.waiters", "run", str(flow),
                             "--db", db, "--json"], cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    run_id = run_id_once_a_node_started(proc)
    if run_id is None:
        raise AssertionError("the run ended before its node started")
    return proc, run_id


def killed_run(db: str, tmp_path: Path, env: dict[str, str]) -> str:
    proc, run_id = blocked_run(db, tmp_path, env)
    proc.send_signal(signal.SIGKILL)  # its executor dies mid-node
    proc.wait(timeout=30)
    return run_id


def listed(http: httpx.Client, **params: str | int) -> list[str]:
    """Every run id ``GET /runs`` lists with ``params``, following the cursors."""
    out: list[str] = []
    cursor: str | None = None
    while True:
        page = http.get("/api/v1/runs", params={**params, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        body = page.json()
        out += [r["runId"] for r in body["items"]]
        assert all(r["status"] == params.get("status", r["status"]) for r in body["items"]), body
        cursor = body["nextCursor"]
        if cursor is None:
            return out


def test_interrupted_is_a_status_filter_of_the_api_and_the_cli_and_running_lists_only_executed_runs(
        live: Live, tmp_path: Path, clean_env: dict[str, str]) -> None:
    older = killed_run(live.db, tmp_path, clean_env)
    executing, alive = None, None
    try:
        alive, executing = blocked_run(live.db, tmp_path, clean_env)
        done = hello(live)
        newer = killed_run(live.db, tmp_path, clean_env)
        hello(live, "Grace")
        with live.client() as http:
            # One run a page: the pages go past the runs of other statuses and stop after the last one.
            assert listed(http, status="interrupted", limit=1) == [newer, older]
            assert listed(http, status="interrupted") == [newer, older]
            assert listed(http, status="running", limit=1) == [executing]
            assert done in listed(http, status="completed")
            assert http.get(f"/api/v1/runs/{older}").json()["run"]["status"] == "interrupted"
        # The CLI lists them with the same code.
        shown = [json.loads(line) for line in cli(live.db, "runs", "--status", "interrupted", "--json").stdout.splitlines()]
        assert [(r["runId"], r["status"]) for r in shown] == [(newer, "interrupted"), (older, "interrupted")]
        running = cli(live.db, "runs", "--status", "running", "--json").stdout.splitlines()
        assert [json.loads(line)["runId"] for line in running] == [executing]
    finally:
        if alive is not None:
            alive.kill()
            alive.wait()


def test_an_unknown_status_is_still_a_problem_naming_the_parameter(live: Live) -> None:
    with live.client() as http:
        answer = http.get("/api/v1/runs", params={"status": "crashed"})
    assert answer.status_code == 400 and answer.json()["errors"] == [{"path": "status", "message": "unknown status"}]
    assert "interrupted" in answer.json()["detail"]
