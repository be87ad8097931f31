"""Continuing a run on an updated flow: ``retry RUN --flow FILE`` and ``resume RUN --flow FILE``.

WHEN a user fixes a bug in the flow file of a failed run, or adds a step, THEN the run continues on
the new flow (recording ``flow:updated``), its history still folds to its snapshot at every seq, and
an update that would rewrite what already happened is refused up front with every reason listed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flowkernel.core.compiler import compile_flow
from flowkernel.core.flow_update import incompatibilities
from flowkernel.core.reducer import fold
from flowkernel.plugins.registry import default_registry
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.testing.audit import audit_store

from tests.helpers import flow, registry, run_flow, t
from tests.server_support import Live, wait_for
from tests.test_commands_cli import events_until
from tests.test_postgres import _audited, needs_pg, pg_url  # noqa: F401  (pg_url is a fixture)
from tests.test_server import assert_problem
from tests.test_server_runs import live, pool  # noqa: F401  (fixtures, on this module's ``db``)

PLUGINS = ["--plugin", "tests.plugins.extras", "--plugin", "tests.plugins.waiters"]


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *PLUGINS, *args], cwd=cwd, env=env,
                          text=True, capture_output=True, timeout=60)


def write(tmp_path: Path, name: str, document: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return str(path)


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=needs_pg)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """``--db`` for the CLI: a SQLite file (audited by conftest) or a fresh PostgreSQL schema (audited here)."""
    if request.param == "sqlite":
        yield str(tmp_path / "runs.db")
        return
    url = request.getfixturevalue("pg_url")
    yield url
    assert _audited(url) >= 1


# A python node whose args are wrong: it fails. The fix passes the right argument.
BUGGY = flow([t("name", '"ada"'),
              {"id": "greet", "type": "python", "input": {"function": "shout", "args": {"txt": "{{ name }}"}}},
              t("ask", 'greet & "?"')],
             [{"from": "name", "to": "greet"}, {"from": "greet", "to": "ask"}], name="greeting")
FIXED = flow([t("name", '"ada"'),
              {"id": "greet", "type": "python", "input": {"function": "shout", "args": {"text": "{{ name }}"}}},
              t("ask", 'greet & "?"'),
              t("echo", 'name & " again"')],  # new, after a node that completed
             [{"from": "name", "to": "greet"}, {"from": "greet", "to": "ask"}, {"from": "name", "to": "echo"}],
             name="greeting")


def test_retry_with_a_fixed_flow_file_completes_the_failed_run_and_records_the_update(
        tmp_path: Path, clean_env: dict[str, str], db: str) -> None:
    buggy = write(tmp_path, "greeting.json", BUGGY)
    first = fk("run", buggy, "--json", "--db", db, cwd=tmp_path, env=clean_env)
    assert first.returncode == 1, first.stderr
    run_id = lines(first.stdout)[0]["flowRunId"]
    failed_at = lines(first.stdout)[-1]["seq"]
    fixed = write(tmp_path, "greeting-fixed.json", FIXED)

    again = fk("retry", run_id, "--flow", fixed, "--json", "--db", db, cwd=tmp_path, env=clean_env)
    assert again.returncode == 0, again.stderr
    events = lines(again.stdout)
    types = [e["type"] for e in events]
    assert types[:3] == ["command:received", "flow:updated", "flow:resumed"]
    update = events[1]
    old_hash = compile_flow(BUGGY, default_registry().node_types).hash
    new_hash = compile_flow(FIXED, default_registry().node_types).hash
    assert (update["fromHash"], update["toHash"]) == (old_hash, new_hash)
    # The new edge out of the node that completed before the update is decided as an event, then it runs.
    fired = next(e for e in events if e["type"] == "edge:fire" and e["edgeId"] == "name->echo")
    assert fired["seq"] > update["seq"]

    shown = fk("show", run_id, "--json", "--db", db, cwd=tmp_path, env=clean_env)
    snap = json.loads(shown.stdout)["snapshot"]
    assert snap["status"] == "completed" and snap["flowHash"] == new_hash
    assert snap["outputs"]["ask"] == "ADA!?" and snap["outputs"]["echo"] == "ada again"

    # Time travel: before the update the run followed the old flow; right after it, the new one.
    before = json.loads(fk("show", run_id, "--json", "--at", str(failed_at), "--db", db,
                           cwd=tmp_path, env=clean_env).stdout)["snapshot"]
    assert before["flowHash"] == old_hash and "echo" not in before["nodeStatus"]
    assert before["nodeStatus"]["greet"] == "failed"
    after = json.loads(fk("show", run_id, "--json", "--at", str(update["seq"]), "--db", db,
                          cwd=tmp_path, env=clean_env).stdout)["snapshot"]
    assert after["flowHash"] == new_hash
    assert after["nodeStatus"]["echo"] == "pending" and after["edgeStatus"]["name->echo"] == "pending"
    assert after["nodeStatus"]["name"] == "done"

    replayed = fk("replay", run_id, "--db", db, cwd=tmp_path, env=clean_env)
    assert replayed.returncode == 0 and "matches the stored snapshot" in replayed.stderr


def test_an_update_that_rewrites_history_is_refused_with_every_problem_and_nothing_recorded(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    old = flow([t("start", "1"), t("side", "2"),
                {"id": "work", "type": "python", "input": {"function": "shout", "args": {"txt": "x"}}},
                t("last", "work")],
               [{"id": "go", "from": "start", "to": "side"}, {"from": "start", "to": "work"},
                {"from": "work", "to": "last"}], name="history")
    path = write(tmp_path, "history.json", old)
    db = str(tmp_path / "runs.db")
    first = fk("run", path, "--json", "--db", db, cwd=tmp_path, env=clean_env)
    assert first.returncode == 1, first.stderr
    run_id = lines(first.stdout)[0]["flowRunId"]
    stored = SqliteStore(Path(db), create=False)
    try:
        seq_before = stored.get_run(run_id).seq
        hash_before = stored.get_run(run_id).flowHash
    finally:
        stored.close()

    bad = flow([t("start", "1"),  # "side" (it ran) is gone
                {"id": "work2", "type": "python", "input": {"function": "shout", "args": {"text": "x"}}},  # renamed
                t("last", "work2")],
               [{"id": "go", "from": "start", "to": "last"},  # decided edge, other end
                {"from": "start", "to": "work2"}, {"from": "work2", "to": "last"}], name="history")
    refused = fk("retry", run_id, "--flow", write(tmp_path, "bad.json", bad), "--db", db,
                 cwd=tmp_path, env=clean_env)
    assert refused.returncode == 2, refused.stderr
    assert "Traceback" not in refused.stderr
    err = refused.stderr
    assert "4 problems" in err and "nothing was recorded" in err
    assert "node 'side' has run in this run (done)" in err
    assert "node 'work' has run in this run (failed)" in err
    assert "edge 'go' was decided in this run (fired) from 'start' to 'side'; the new flow has it from 'start' to 'last'" in err
    assert "edge 'start->work' was decided in this run (fired) but the new flow has no edge 'start->work'" in err

    stored = SqliteStore(Path(db), create=False)
    try:
        record = stored.get_run(run_id)
        assert (record.seq, record.flowHash, record.status) == (seq_before, hash_before, "failed")
    finally:
        stored.close()


def test_resume_of_a_paused_run_with_a_new_flow_adds_a_step_after_the_interrupted_node(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    edges = [{"from": "work", "to": "after"}]
    old = flow([{"id": "work", "type": "python", "input": {"function": "block_first_run"}},
                {"id": "after", "type": "noop", "input": {"got": "{{ work.inbox }}"}}], edges, name="pausable")
    path = write(tmp_path, "pausable.json", old)
    db = str(tmp_path / "runs.db")
    proc = subprocess.Popen([sys.executable, "-m", "flowkernel.cli", *PLUGINS, "run", path, "--json", "--db", db],
                            cwd=tmp_path, env=clean_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        seen = list(events_until(proc.stdout, lambda e: e["type"] == "node:start"))
        run_id = seen[0]["flowRunId"]
        assert fk("pause", run_id, "--db", db, cwd=tmp_path, env=clean_env).returncode == 0
        proc.stdout.read()
        assert proc.wait(timeout=30) == 3
    finally:
        proc.kill()
        proc.communicate()

    new = flow([{"id": "work", "type": "python", "input": {"function": "block_first_run"}},
                {"id": "after", "type": "noop", "input": {"got": "{{ work.inbox }}", "note": "updated"}},
                {"id": "audit", "type": "noop", "input": {"from": "{{ work.resumedFrom }}"}}],
               [*edges, {"from": "work", "to": "audit"}], name="pausable")
    resumed = fk("resume", run_id, "--flow", write(tmp_path, "pausable-2.json", new), "--message", "go on",
                 "--json", "--db", db, cwd=tmp_path, env=clean_env)
    assert resumed.returncode == 0, resumed.stderr
    events = lines(resumed.stdout)
    assert [e["type"] for e in events][:3] == ["command:received", "flow:updated", "flow:resumed"]
    done = {e["nodeId"]: e["output"] for e in events if e["type"] == "node:complete"}
    assert done["after"] == {"got": ["go on"], "note": "updated"}
    assert done["audit"]["from"] == seen[-1]["runId"]  # the interrupted node run, continued


def test_replaying_a_run_through_an_update_gives_its_snapshot_at_every_seq(tmp_path: Path) -> None:
    """The fold switches flows at flow:updated: at every seq, folding the log up to it gives what the
    store rebuilds (``snapshot(at=)``), and the whole log gives the live snapshot."""
    import anyio

    calls = {"n": 0}

    def flaky(x: int) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("first call fails")
        return x * 10

    reg = registry(flaky=flaky)
    store = SqliteStore(tmp_path / "runs.db")
    old = flow([t("a", "1"), {"id": "b", "type": "python", "input": {"function": "flaky", "args": {"x": "{{ a }}"}}}],
               [{"from": "a", "to": "b"}], name="fold")
    kernel, snap, _ = run_flow(old, store=store, reg=reg)
    assert snap.status == "failed"
    new = flow([t("a", "1"), {"id": "b", "type": "python", "input": {"function": "flaky", "args": {"x": "{{ a }}"}}},
                t("c", "b + a"), t("d", "a * 2")],
               [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}, {"from": "a", "to": "d", "when": "a > 5"}],
               name="fold")
    final = anyio.run(lambda: kernel.retry(snap.runId, flow=kernel.compile(new)))
    assert final.status == "completed" and final.outputs["c"] == 11
    assert final.nodeStatus["d"] == "skipped" and final.edgeStatus["a->d"] == "skipped"
    events = kernel.events(snap.runId)
    record = store.get_run(snap.runId)
    flows = kernel.flows_of(record)
    start = flows(events[0].flowHash)  # type: ignore[union-attr]
    for i in range(1, len(events) + 1):
        assert fold(start, events[:i], flows=flows) == kernel.snapshot(snap.runId, at=i), f"at seq {i}"
    assert fold(start, events, flows=flows) == final
    assert audit_store(store) == 1
    # Without the lookup a fold cannot follow the update: it says so rather than fold on the old flow.
    with pytest.raises(ValueError, match="flow:updated"):
        fold(start, events)


def test_a_fork_after_the_update_follows_the_new_flow_and_one_before_it_the_old(tmp_path: Path) -> None:
    import anyio
    from flowkernel.run.kernel import Kernel
    from flowkernel.run.timetravel import create_fork

    store = SqliteStore(tmp_path / "runs.db")
    kernel = Kernel(store, registry=registry())
    old = kernel.compile(flow([t("a", "1"), t("b", "$error('bug')")], [{"from": "a", "to": "b"}], name="f"))
    snap = anyio.run(kernel.run, old, None)
    new = kernel.compile(flow([t("a", "1"), t("b", "a + 1")], [{"from": "a", "to": "b"}], name="f"))
    final = anyio.run(lambda: kernel.retry(snap.runId, flow=new))
    assert final.status == "completed"
    update = next(e for e in kernel.events(snap.runId) if e.type == "flow:updated")
    late = create_fork(kernel, snap.runId, update.seq)
    early = create_fork(kernel, snap.runId, update.seq - 2)
    assert store.get_run(late).flowHash == new.hash == kernel.snapshot(late).flowHash
    assert store.get_run(early).flowHash == old.hash
    assert audit_store(store) == 3


def test_incompatibilities_name_an_edge_whose_kind_changed() -> None:
    types = default_registry().node_types
    old = compile_flow(flow([t("a", "[1, 2]"), t("b", "1")], [{"id": "e", "from": "a", "to": "b"}]), types)
    new = compile_flow(flow([t("a", "[1, 2]"), t("b", "1")],
                            [{"id": "e", "from": "a", "to": "b", "forEach": {"in": "a"}}]), types)
    _, snap, _ = run_flow(flow([t("a", "[1, 2]"), t("b", "1")], [{"id": "e", "from": "a", "to": "b"}]))
    assert incompatibilities(old, new, snap) == [
        "edge 'e' was decided in this run (fired) as a plain edge; the new flow makes it a forEach edge"]
    assert incompatibilities(old, old, snap) == []


def test_retry_over_http_takes_an_updated_flow_document_and_refuses_one_that_rewrites_history(
        pool: Live) -> None:  # noqa: F811  (the fixture)
    from tests.test_server_runs import status

    buggy = flow([t("a", "1"), t("b", "$error('bug in b')")], [{"from": "a", "to": "b"}], name="web")
    with pool.client() as http:
        created = http.post("/api/v1/runs", params={"wait": 30}, json={"flowDocument": buggy})
        assert created.json()["status"] == "failed", created.text
        run_id = created.json()["runId"]
        seq = http.get(f"/api/v1/runs/{run_id}").json()["snapshot"]["seq"]

        renamed = flow([t("a2", "1"), t("b", "a2 + 1")], [{"from": "a2", "to": "b"}], name="web")
        body = assert_problem(http.post(f"/api/v1/runs/{run_id}/retry", json={"flowDocument": renamed}), 422,
                              path="$.flowDocument")
        assert any("node 'a' has run" in e["message"] for e in body["errors"])
        assert any("edge 'a->b' was decided" in e["message"] for e in body["errors"])
        assert_problem(http.post(f"/api/v1/runs/{run_id}/retry", json={"flowDocument": {"name": "web"}}), 422,
                       path="$.flowDocument.nodes")
        assert http.get(f"/api/v1/runs/{run_id}").json()["snapshot"]["seq"] == seq  # nothing recorded

        fixed = flow([t("a", "1"), t("b", "a + 1")], [{"from": "a", "to": "b"}], name="web")
        retried = http.post(f"/api/v1/runs/{run_id}/retry", json={"flowDocument": fixed})
        assert retried.status_code == 202, retried.text
        assert retried.json()["seq"] == seq + 1
        wait_for(lambda: status(http, run_id) == "completed", what="the retried run to complete")
        assert http.get(f"/api/v1/runs/{run_id}").json()["snapshot"]["outputs"]["b"] == 2
        events = http.get(f"/api/v1/runs/{run_id}/events", params={"after": seq}).json()["items"]
        assert [e["type"] for e in events][:3] == ["command:received", "flow:updated", "flow:resumed"]
        served = http.get(f"/api/v1/runs/{run_id}/flow").json()
        assert served["nodes"][1]["input"]["expr"] == "a + 1"


def test_an_exported_updated_run_imports_with_every_flow_it_followed(tmp_path: Path) -> None:
    """WHEN a run that was continued on an updated flow is exported and imported into another store,
    THEN the snapshot before the update can still be rebuilt there (the earlier flow travels too)."""
    import io

    import anyio
    from flowkernel.run.kernel import Kernel
    from flowkernel.store.retention import export_runs, import_runs

    source = SqliteStore(tmp_path / "source.db")
    kernel = Kernel(source, registry=registry())
    old = kernel.compile(flow([t("a", "1"), t("b", "$error('bug')")], [{"from": "a", "to": "b"}], name="moved"))
    run_id = anyio.run(kernel.run, old, None).runId
    new = kernel.compile(flow([t("a", "1"), t("b", "a + 1")], [{"from": "a", "to": "b"}], name="moved"))
    assert anyio.run(lambda: kernel.retry(run_id, flow=new)).status == "completed"
    update = next(e for e in kernel.events(run_id) if e.type == "flow:updated")
    out = io.BytesIO()
    export_runs(source, [run_id], out)

    target = SqliteStore(tmp_path / "target.db")
    import_runs(target, out.getvalue().splitlines())
    there = Kernel(target, registry=registry())
    assert there.snapshot(run_id, at=update.seq - 1).flowHash == old.hash
    assert there.snapshot(run_id).outputs["b"] == 2
    assert audit_store(target) == 1
