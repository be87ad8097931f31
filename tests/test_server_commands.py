"""Commands over HTTP mean what they say, against a real uvicorn server on a loopback port with the
worker pool ``serve --workers N`` runs: a resume is recorded once, whoever continues the run, and a
body with a field the command does not take names the field it does take."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import tests.plugins.pool  # noqa: F401  (registers pool.gate)
from tests.server_support import Live, pool_worker, serving, wait_for
from tests.test_server import assert_problem


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Live]:
    with serving(str(tmp_path / "runs.db")) as live, pool_worker(live.db):
        yield live


def status(http: httpx.Client, run_id: str) -> str:
    got: str = http.get(f"/api/v1/runs/{run_id}").json()["run"]["status"]
    return got


def gated_items(gates: Path) -> dict[str, Any]:
    """Three forEach items, each held by ``pool.gate`` until its file ``item<n>.go`` exists."""
    return {"name": "items", "nodes": [
        {"id": "list", "type": "transform", "input": {"expr": "[1, 2, 3]"}},
        {"id": "each", "type": "python",
         "input": {"function": "pool.gate", "args": {"label": "item{{ n }}", "dir": str(gates)}}}],
        "edges": [{"from": "list", "to": "each", "forEach": {"in": "list", "as": "n"}}]}


@pytest.mark.parametrize("trial", range(2))
def test_pause_then_resume_with_a_message_of_a_running_foreach_records_one_resume(
        pool: Live, tmp_path: Path, trial: int) -> None:
    gates = tmp_path / f"gates{trial}"
    gates.mkdir()
    with pool.client() as http:
        run_id = http.post("/api/v1/runs", json={"flowDocument": gated_items(gates)}).json()["runId"]
        wait_for(lambda: len(list(gates.glob("*.entered"))) == 3, what="the three items to start")
        assert http.post(f"/api/v1/runs/{run_id}/pause", json={}).status_code == 202
        wait_for(lambda: status(http, run_id) == "paused", what="the run to pause")
        for n in (1, 2, 3):
            (gates / f"item{n}.go").write_text("")
        resumed = http.post(f"/api/v1/runs/{run_id}/resume", json={"message": "go on"})
        assert resumed.status_code == 202, resumed.text
        wait_for(lambda: status(http, run_id) == "completed", what="the pool to finish the run")
        events = http.get(f"/api/v1/runs/{run_id}/events", params={"limit": 500}).json()["items"]
    assert [e["message"] for e in events if e["type"] == "flow:resumed"] == ["go on"]
    items = [e["item"] for e in events if e["type"] == "node:start" and e.get("item") is not None]
    assert sorted(items) == [0, 0, 1, 1, 2, 2]  # each item once before the pause, once after


@pytest.mark.parametrize(("command", "body", "message"), [
    ("send", {"to": "nr_x", "content": "hi"}, "unknown field 'content'; send takes 'to' and 'message'"),
    ("reply", {"to": "nr_x", "message": "yes"}, "unknown field 'message'; reply takes 'to' and 'content'"),
    ("pause", {"why": "lunch"}, "unknown field 'why'; pause takes 'reason'"),
    ("abort", {"message": "stop"}, "unknown field 'message'; abort takes 'reason'"),
    ("resume", {"msg": "go"}, "unknown field 'msg'; resume takes 'message', 'budget' and 'flowDocument'"),
    ("retry", {"budget": 3}, "unknown field 'budget'; retry takes 'message' and 'flowDocument'"),
])
def test_a_command_body_with_a_field_it_does_not_take_names_the_fields_it_takes(
        pool: Live, command: str, body: dict[str, Any], message: str) -> None:
    with pool.client() as http:
        got = assert_problem(http.post(f"/api/v1/runs/run_any/{command}", json=body), 422)
    field = message.split("'")[1]
    assert got["errors"] == [{"path": f"$.{field}", "message": message}]
    assert got["detail"] == f"$.{field}: {message}"
    assert "--" not in got["detail"]  # HTTP words, not the CLI's flags


def test_a_run_request_with_a_field_it_does_not_take_names_the_fields_it_takes(pool: Live) -> None:
    with pool.client() as http:
        got = assert_problem(http.post("/api/v1/runs", json={"flow": "hello", "inputs": {}}), 422)
    assert got["errors"] == [{"path": "$.inputs", "message": "unknown field 'inputs'; POST /api/v1/runs takes "
                                                            "'flow', 'flowDocument', 'input' and 'idempotencyKey'"}]
