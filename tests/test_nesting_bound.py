"""JSON nested deeper than flowkernel.core.nesting.MAX_DEPTH is refused at the door with the JSON path where
the bound is passed; a run already stored deeper (before the bound, or written by a node) still lists,
shows (with a marker) and exports."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flowkernel.core.nesting import MARKER, MAX_DEPTH, clipped, clipped_text

from tests.server_support import serving

DEEP_PATH = "a" + "[0]" * (MAX_DEPTH - 1)  # where the 101st level of {"a": [[[...]]]} begins


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def nested_text(depth: int) -> str:
    return "[" * depth + "0" + "]" * depth


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=120)


def write_flow(tmp_path: Path, document: dict[str, Any]) -> str:
    path = tmp_path / f"{document['name']}.json"
    path.write_text(json.dumps(document))
    return str(path)


ECHO = {"name": "echo", "nodes": [{"id": "n", "type": "noop", "input": {"x": "{{ flow.input }}"}}]}
ASK = {"name": "ask", "nodes": [{"id": "ask", "type": "human.input", "input": {
    "prompt": "Data?", "schema": {"type": "object"}}}]}


def test_clipping_replaces_what_lies_below_the_bound_in_values_and_in_text() -> None:
    value = {"a": nested(MAX_DEPTH + 5), "b": [1, {"c": 2}]}
    shown = clipped(value)
    assert shown["b"] == [1, {"c": 2}]
    inner = shown["a"]
    for _ in range(MAX_DEPTH - 1):
        inner = inner[0]
    assert inner == MARKER
    text = '{"s": "[[[\\"]]", "a": ' + nested_text(3000) + "}"
    assert json.loads(clipped_text(text)) == {"s": "[[[\"]]", "a": clipped(nested(MAX_DEPTH + 5), MAX_DEPTH - 1)}


def test_run_input_nested_past_the_bound_is_exit_2_naming_where(tmp_path: Path, clean_env: dict[str, str]) -> None:
    (tmp_path / "input.json").write_text(json.dumps({"a": nested(MAX_DEPTH + 50)}))
    done = fk("run", write_flow(tmp_path, ECHO), "--input-json", str(tmp_path / "input.json"), "--db",
              str(tmp_path / "r.db"), cwd=tmp_path, env=clean_env)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"input.{DEEP_PATH} is nested more than {MAX_DEPTH} levels deep" in line
    fine = fk("run", write_flow(tmp_path, ECHO), "--input", f"a={nested_text(MAX_DEPTH - 1)}", "--db",
              str(tmp_path / "r.db"), cwd=tmp_path, env=clean_env)
    assert fine.returncode == 0, fine.stderr


def test_a_reply_nested_past_the_bound_is_refused_and_recorded(tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = str(tmp_path / "r.db")
    first = fk("run", write_flow(tmp_path, ASK), "--json", "--db", db, cwd=tmp_path, env=clean_env)
    assert first.returncode == 3, first.stderr
    events = [json.loads(line) for line in first.stdout.splitlines()]
    run_id, node_run = events[0]["flowRunId"], next(e["runId"] for e in events if e["type"] == "node:waiting")
    for depth in (MAX_DEPTH + 10, 5000):  # past the bound; past what Python's JSON reader goes
        answer = fk("reply", run_id, "--to", node_run, json.dumps({"a": nested(0)})[:-2] + nested_text(depth) + "}",
                    "--db", db, cwd=tmp_path, env=clean_env)
        assert answer.returncode == 2, answer.stderr
        assert f"nested more than {MAX_DEPTH} levels deep" in answer.stderr and "Traceback" not in answer.stderr
    shown = fk("events", run_id, "--json", "--db", db, cwd=tmp_path, env=clean_env)
    received = [json.loads(line) for line in shown.stdout.splitlines() if '"command:received"' in line]
    assert [(r["command"], r["accepted"]) for r in received] == [("reply", False), ("reply", False)]
    assert f"the reply.{DEEP_PATH} is nested" in received[0]["reason"]


def test_the_http_api_refuses_input_replies_and_messages_nested_past_the_bound(tmp_path: Path) -> None:
    db = str(tmp_path / "r.db")
    with serving(db) as live, live.client() as http:
        created = http.post("/api/v1/runs", json={"flowDocument": ECHO, "input": {"a": nested(MAX_DEPTH + 50)}})
        assert created.status_code == 422, created.text
        assert created.json()["errors"] == [{"path": f"$.input.{DEEP_PATH}", "message": (
            f"is nested more than {MAX_DEPTH} levels deep (lists and objects); flowkernel takes at most {MAX_DEPTH}")}]
        # Deeper than Python's JSON reader goes: the same answer, not a 500.
        body = '{"flowDocument": ' + json.dumps(ECHO) + ', "input": {"a": ' + nested_text(5000) + "}}"
        deepest = http.post("/api/v1/runs", content=body, headers={"content-type": "application/json"})
        assert deepest.status_code == 422 and deepest.json()["errors"][0]["path"] == f"$.input.{DEEP_PATH}"

        run_id = live.kernel.create_run(live.kernel.compile(ASK))
        import anyio

        anyio.run(live.kernel.execute, run_id)
        node_run = live.kernel.snapshot(run_id).waiting["ask"].runId
        deep = {"a": nested(MAX_DEPTH + 10)}
        for route, payload in (("reply", {"to": node_run, "content": deep}), ("send", {"to": node_run, "message": deep})):
            answer = http.post(f"/api/v1/runs/{run_id}/{route}", json=payload)
            assert answer.status_code == 422, (route, answer.text)
            assert f"message.{DEEP_PATH} is nested more than {MAX_DEPTH} levels deep" in answer.json()["detail"] \
                or f"reply.{DEEP_PATH} is nested more than {MAX_DEPTH} levels deep" in answer.json()["detail"], route
        # (a resume message is text: JSON of any depth is refused by the body's shape)
        assert http.post(f"/api/v1/runs/{run_id}/resume", json={"message": deep}).status_code == 422
        assert live.kernel.snapshot(run_id).status == "waiting"
        received = [e for e in live.kernel.events(run_id) if e.type == "command:received"]
        assert [(e.command, e.accepted) for e in received] == [("reply", False), ("send", False)]


def write_deep_run(tmp_path: Path, clean_env: dict[str, str], depth: int) -> tuple[str, str]:
    """A run stored with a value ``depth`` levels deep in its input, its events and its snapshot: written
    into the SQLite file directly, as a store written before the bound (or by a newer Python) holds it."""
    db = str(tmp_path / "r.db")
    (tmp_path / "input.json").write_text(json.dumps({"a": "DEEP"}))
    done = fk("run", write_flow(tmp_path, ECHO), "--input-json", str(tmp_path / "input.json"), "--json", "--db", db,
              cwd=tmp_path, env=clean_env)
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout.splitlines()[0])["flowRunId"]
    with sqlite3.connect(db) as conn:
        changed = sum(conn.execute(f"UPDATE {table} SET {column} = replace({column}, '\"DEEP\"', ?)",
                                   (nested_text(depth),)).rowcount
                      for table, column in (("runs", "input"), ("events", "body"), ("checkpoints", "body")))
    assert changed >= 3
    return db, run_id


@pytest.mark.no_audit  # the run was changed behind its log; its events and snapshot are clipped apart
@pytest.mark.parametrize("depth", [600, 1500])  # decodable but too deep to walk; too deep to decode
def test_a_run_stored_deeper_than_the_bound_still_lists_shows_and_exports(depth: int, tmp_path: Path,
                                                                         clean_env: dict[str, str]) -> None:
    db, run_id = write_deep_run(tmp_path, clean_env, depth)
    for args in (("runs",), ("runs", "--json"), ("show", run_id), ("show", run_id, "--full"),
                 ("show", run_id, "--json"), ("events", run_id, "--json"), ("export", run_id)):
        done = fk(*args, "--db", db, cwd=tmp_path, env=clean_env)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stderr[-2000:])
        if args[0] == "runs":
            assert run_id in done.stdout
    full = fk("show", run_id, "--full", "--db", db, cwd=tmp_path, env=clean_env).stdout
    shown = json.loads(fk("show", run_id, "--json", "--db", db, cwd=tmp_path, env=clean_env).stdout)
    assert shown["run"]["runId"] == run_id and shown["snapshot"]["status"] == "completed"
    if depth > 1000:  # (one that decodes is shown whole by --json)
        assert MARKER in full and MARKER in json.dumps(shown, ensure_ascii=False)
    exported = fk("export", run_id, "--db", db, cwd=tmp_path, env=clean_env).stdout
    assert exported.count("[" * depth) >= 1  # the run whole, as stored: an import gets it back


@pytest.mark.no_audit  # as above
def test_the_http_api_lists_and_shows_a_run_stored_too_deep(tmp_path: Path, clean_env: dict[str, str]) -> None:
    db, run_id = write_deep_run(tmp_path, clean_env, 1500)
    with serving(db) as live, live.client() as http:
        listed = http.get("/api/v1/runs")
        assert listed.status_code == 200 and [r["runId"] for r in listed.json()["items"]] == [run_id]
        shown = http.get(f"/api/v1/runs/{run_id}")  # (read whole or clipped, as deep as this process's Python goes)
        assert shown.status_code == 200 and f'"runId":"{run_id}","flowName":"echo","status":"completed"' in shown.text
        events = http.get(f"/api/v1/runs/{run_id}/events")
        assert events.status_code == 200 and '"type":"flow:complete"' in events.text  # (the events as stored)
