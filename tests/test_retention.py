"""``prune``, ``export`` and ``import`` (DESIGN §13) on SQLite and PostgreSQL.

WHEN runs are exported and imported into the other kind of store THEN ``show``, ``events``, replay
and ``rerun`` give the same results there, agent conversations and tool calls come along, a waiting
run can be replied to and completes there, and importing the same runs again is refused. WHEN a
line of an import is bad THEN that run is refused whole and the others load. WHEN old runs are
pruned THEN stopped ones go with their child runs, agent rows and the blobs no other run uses;
waiting, paused and executing runs stay unless ``--status`` names them (executing ones always stay).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.commands import Command
from flowkernel.core.reducer import fold
from flowkernel.errors import RunBusyError, UnknownRunError
from flowkernel.fixtures import MockQuery
from flowkernel.ids import now_ms
from flowkernel.plugins.registry import default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.run.timetravel import rerun
from flowkernel.store.checkpoint import checkpoint_blobs
from flowkernel.store.open import open_store
from flowkernel.store.retention import export_runs, import_runs, prune
from flowkernel.store.sql.store import SqlStore

from tests.test_postgres import needs_pg, pg_url  # noqa: F401 (pg_url is a fixture)

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "flowkernel.cli"]
TOPIC = "dark mode in the settings page"


def fk(env: dict[str, str], cwd: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, timeout=120, input=stdin)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=needs_pg)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path / "runs.db") if request.param == "sqlite" else request.getfixturevalue("pg_url")


def _kernel(db: str, fixtures: str | None = None) -> Kernel:
    services: dict[str, Any] = {}
    if fixtures:
        services = {"query_fn": MockQuery(str(ROOT / "fixtures" / fixtures)), "fixtures": str(ROOT / "fixtures" / fixtures)}
    return Kernel(open_store(db, create=True), registry=default_registry().copy(), services=services)


def _agent_rows(store: Any, table: str, run_id: str) -> list[dict[str, Any]]:
    assert isinstance(store, SqlStore)
    with store._tx() as tx:
        rows = store._rows(tx, f"SELECT * FROM {table} WHERE flow_run_id = {store.param} ORDER BY id", (run_id,))
    return [{k: v for k, v in r.items() if k not in ("id", "message_id")} for r in rows]


async def _example_runs(db: str) -> tuple[list[str], str]:
    """A sub-flow run (with its child), a review loop and an approval waiting for its reply."""
    top: list[str] = []
    for name, value in (("subflow", {"topic": "durable workflows"}), ("review-loop", {"feature": "CSV export"}),
                        ("approval", {"topic": TOPIC})):
        kernel = _kernel(db, name)
        try:
            snap = await kernel.run(kernel.load_flow(ROOT / "flows" / f"{name}.json"), value)
            top.append(snap.runId)
        finally:
            kernel.close()
    return top, top[2]


@pytest.mark.parametrize("direction", ["sqlite-to-postgres", "postgres-to-sqlite"])
@needs_pg
async def test_export_then_import_into_the_other_store_kind_gives_the_same_show_events_replay_and_rerun(
        direction: str, pg_url: str, tmp_path: Path, clean_env: dict[str, str]) -> None:  # noqa: F811
    sqlite = str(tmp_path / "runs.db")
    src, dst = (sqlite, pg_url) if direction == "sqlite-to-postgres" else (pg_url, sqlite)
    top, waiting = await _example_runs(src)
    exported = fk(clean_env, tmp_path, "export", *top, "--with-children", "--db", src)
    assert exported.returncode == 0, exported.stderr
    assert b"exported 4 runs" in exported.stderr
    (tmp_path / "runs.jsonl").write_bytes(exported.stdout)
    imported = fk(clean_env, tmp_path, "import", "runs.jsonl", "--db", dst)
    assert imported.returncode == 0, imported.stderr
    ids = imported.stdout.decode().split()
    assert len(ids) == 4 and set(top) <= set(ids)

    before, after = _kernel(src), _kernel(dst)
    try:
        for run_id in ids:
            assert after.detail(run_id) == before.detail(run_id), "show --json"
            assert after.events(run_id) == before.events(run_id), "events"
            assert fold(after.flow_of(run_id), after.events(run_id), None) == after.snapshot(run_id), "replay"
            for table in ("agent_messages", "agent_tool_calls", "agent_runs"):
                assert _agent_rows(after.store, table, run_id) == _agent_rows(before.store, table, run_id)
            # Tool calls point at their assistant message in the new store (message ids are the store's own).
            messages = {m["id"]: m for m in after.store.list_agent_messages(flow_run_id=run_id, limit=1000)}
            for call in after.store.list_tool_calls(flow_run_id=run_id, limit=1000):
                if call["messageId"] is not None:
                    assert any(b.get("id") == call["toolUseId"] for b in messages[call["messageId"]]["content"])
        review = top[1]
        report = await rerun(after, review)
        assert report.matches and report.snapshot.status == "completed", report.describe()
        assert _agent_rows(after.store, "agent_runs", review), "the review loop's agent runs came along"
    finally:
        before.close()
        after.close()

    # The waiting run continues in its new store: the reply goes to the node run that waits there.
    node_run = json.loads(fk(clean_env, tmp_path, "show", waiting, "--json", "--db", dst).stdout)["snapshot"]["nodeRuns"]["review"]
    replied = fk(clean_env, tmp_path, "reply", waiting, "--to", node_run, "approve", "--db", dst,
                 "--fixtures", str(ROOT / "fixtures" / "approval"))
    assert replied.returncode == 0, replied.stderr
    done = _kernel(dst)
    try:
        assert done.store.get_run(waiting).status == "completed"
    finally:
        done.close()

    again = fk(clean_env, tmp_path, "import", "runs.jsonl", "--db", dst, "--json")
    assert again.returncode == 1
    outcome = json.loads(again.stdout)
    assert outcome["imported"] == [] and len(outcome["refused"]) == 4
    assert all("exists in" in r["reason"] and "already" in r["reason"] for r in outcome["refused"])


async def test_an_import_loads_each_run_all_or_nothing(tmp_path: Path, clean_env: dict[str, str]) -> None:
    src, dst = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    top, _ = await _example_runs(src)
    source = _kernel(src)
    try:
        out = tmp_path / "runs.jsonl"
        with out.open("wb") as f:
            export_runs(source.store, top[1:], f)
    finally:
        source.close()
    agent, good = out.read_bytes().splitlines()  # the review loop (with an agent_runs row), the approval
    broken = json.loads(agent)
    # A column no store of this version has, in the last table the import writes: the run's row, its
    # events and messages were written already in that transaction and must all go.
    broken["archive"]["tables"]["agent_runs"][0]["bogus"] = 1
    lines = [good, b'{"format": "flowkernel.run", "schem', json.dumps(broken).encode(), b""]
    target = _kernel(dst)
    try:
        report = import_runs(target.store, lines)
        assert report.imported == [top[2]]
        assert [why.split(":")[0] for _, why in report.refused] == ["line 2", "agent_runs column(s) bogus are unknown to "
                                                                    f"{target.store.location}"]
        with pytest.raises(UnknownRunError):
            target.store.get_run(top[1])
        assert target.store._query("SELECT COUNT(*) FROM events")[0][0] == len(target.events(top[2]))  # type: ignore[attr-defined]
        assert _agent_rows(target.store, "agent_messages", top[1]) == []
        assert [r.runId for r in target.runs()] == [top[2]]
    finally:
        target.close()
    # Bad arguments: one line naming them, exit 2, nothing written.
    unknown = fk(clean_env, tmp_path, "export", top[0], "run_nope", "--db", src)
    assert unknown.returncode == 2 and unknown.stdout == b"" and b"run_nope" in unknown.stderr
    missing = fk(clean_env, tmp_path, "import", "nope.jsonl", "--db", dst)
    assert missing.returncode == 2 and b"nope.jsonl" in missing.stderr and b"Traceback" not in missing.stderr


async def _paused_run(kernel: Kernel) -> str:
    """A run paused while its python node was working."""
    started = anyio.Event()

    async def slow() -> str:
        started.set()
        await anyio.sleep(60)
        return "never"

    kernel.registry.add_function("slow", slow)
    flow = kernel.compile({"name": "slow", "nodes": [{"id": "work", "type": "python", "input": {"function": "slow"}}],
                           "edges": []})
    got: list[str] = []
    async with anyio.create_task_group() as tg:
        async def run() -> None:
            got.append((await kernel.run(flow, {})).runId)

        tg.start_soon(run)
        with anyio.fail_after(30):
            await started.wait()
        run_id = kernel.runs(status="running")[0].runId
        await kernel.command(run_id, Command(kind="pause"))
    assert got == [run_id]
    return run_id


async def test_prune_deletes_old_stopped_runs_with_children_and_unshared_blobs_and_leaves_live_runs_alone(
        db: str, tmp_path: Path, clean_env: dict[str, str]) -> None:
    big = "x" * 2000  # large enough to be stored as a blob
    shared_flow = {"name": "shared", "inputs": {"type": "object"},
                   "nodes": [{"id": "make", "type": "transform", "input": {"expr": f"'{big}'"}},
                             {"id": "ask", "type": "human.input", "input": {"prompt": "ok?"}}],
                   "edges": [{"from": "make", "to": "ask"}]}
    own_flow = {"name": "own", "nodes": [{"id": "make", "type": "transform", "input": {"expr": "$string(flow.input)"}},
                                         {"id": "ask", "type": "human.input", "input": {"prompt": "ok?"}}],
                "edges": [{"from": "make", "to": "ask"}]}
    top, _ = await _example_runs(db)  # subflow and review-loop completed; approval waiting
    kernel = _kernel(db)
    try:
        shared = kernel.compile(shared_flow)
        own = kernel.compile(own_flow)
        kept_waiting = (await kernel.run(shared, {})).runId  # its blob is also the completed one's
        completed_shared = (await kernel.run(shared, {})).runId
        completed_own = (await kernel.run(own, {"v": "y" * 3000})).runId
        paused = await _paused_run(kernel)
        for run_id in (completed_shared, completed_own):
            nr = kernel.snapshot(run_id).nodeRuns["ask"]
            assert (await kernel.reply(run_id, nr, "yes")).status == "completed"
        assert kernel.store.get_run(paused).status == "paused"
        executing = kernel.enqueue(own, {"v": "q"})
        assert kernel.store.claim_runs("other-worker", now_ms(), 600_000, limit=1)[0].runId == executing
        skeleton = kernel.store.read_checkpoint(completed_own)
        assert skeleton is not None
        own_blobs = set(checkpoint_blobs(skeleton[1], kernel.store.read_blobs))
        shared_blobs = set(checkpoint_blobs(kernel.store.read_checkpoint(kept_waiting)[1],  # type: ignore[index]
                                            kernel.store.read_blobs))
        assert own_blobs and shared_blobs and not own_blobs & shared_blobs
        child = kernel.runs(parent=top[0])[0].runId
        review = top[1]
        assert kernel.store.list_agent_messages(flow_run_id=review)
    finally:
        kernel.close()

    young = fk(clean_env, tmp_path, "prune", "--older-than", "1h", "--db", db, "--json")
    assert young.returncode == 0, young.stderr
    assert json.loads(young.stdout)["runs"] == 0
    dry = fk(clean_env, tmp_path, "prune", "--older-than", "0s", "--dry-run", "--db", db, "--json")
    assert json.loads(dry.stdout) == {"runs": 4, "childRuns": 1, "events": json.loads(dry.stdout)["events"],
                                      "blobs": 0, "dryRun": True}
    done = fk(clean_env, tmp_path, "prune", "--older-than", "0s", "--db", db, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["runs"], report["childRuns"], report["events"]) == (4, 1, json.loads(dry.stdout)["events"])
    assert report["events"] > 0 and report["blobs"] >= len(own_blobs)

    kernel = _kernel(db)
    try:
        left = {r.runId: r.status for r in kernel.runs()}
        assert left == {top[2]: "waiting", kept_waiting: "waiting", paused: "paused", executing: "queued"}
        for gone in (top[0], child, review, completed_shared, completed_own):
            with pytest.raises(UnknownRunError):
                kernel.store.get_run(gone)
        assert kernel.store._query("SELECT COUNT(*) FROM events")[0][0] == \
            sum(len(kernel.store.read_events(r)) for r in left)  # type: ignore[attr-defined]
        assert kernel.store.list_agent_messages(flow_run_id=review) == []
        assert kernel.store.list_tool_calls(flow_run_id=review) == []
        assert _agent_rows(kernel.store, "agent_runs", review) == []
        assert kernel.store.read_blobs(own_blobs) == {}
        assert set(kernel.store.read_blobs(shared_blobs)) == shared_blobs, "still used by the waiting run"
        assert kernel.snapshot(kept_waiting).outputs["make"] == big
    finally:
        kernel.close()

    # Named, waiting and paused runs go too (and the blob only they used); an executing run never.
    named = fk(clean_env, tmp_path, "prune", "--older-than", "0s", "--status", "waiting,paused,queued",
               "--db", db, "--json")
    assert named.returncode == 0, named.stderr
    assert json.loads(named.stdout)["runs"] == 3
    kernel = _kernel(db)
    try:
        assert [r.runId for r in kernel.runs()] == [executing]
        with pytest.raises(RunBusyError, match="other-worker"):  # were it listed before the claim
            kernel.store.delete_runs([executing], now_ms())  # type: ignore[attr-defined]
        assert kernel.store.read_blobs(shared_blobs) == {}
    finally:
        kernel.close()

    bad = fk(clean_env, tmp_path, "prune", "--older-than", "soon", "--db", db)
    assert bad.returncode == 2 and b"--older-than 'soon'" in bad.stderr and b"Traceback" not in bad.stderr
    bad = fk(clean_env, tmp_path, "prune", "--older-than", "1d", "--status", "done", "--db", db)
    assert bad.returncode == 2 and b"--status 'done'" in bad.stderr


@pytest.mark.no_audit  # hand-made rows: no flow to replay them with
def test_blobs_an_event_stored_packed_reaches_are_kept_by_prune_and_carried_by_export(db: str) -> None:
    # A large payload of an event is stored packed: the event's body refers to blobs. Here the kept
    # run's events reach blob k1 (its checkpoint does not); the pruned run's checkpoint reaches k1 and k2.
    from io import BytesIO

    from flowkernel.store.base import RunRecord
    from flowkernel.store.packing import PACKED_PREFIX
    from flowkernel.store.retention import prune

    store = open_store(db, create=True)
    try:
        store.put_flow("h1", "f", '{"name": "f", "nodes": [], "edges": []}')
        leaf = json.dumps(["x" * 600]).encode()
        blobs = {"k1": json.dumps({"$keys": ["k3"]}).encode(), "k2": b'"old"', "k3": leaf}
        packed = PACKED_PREFIX + b'"type":"node:complete","seq":1,"output":{"$chunks":["k1"],"$tail":[]}}'
        kept = RunRecord(runId="run_kept", flowName="f", flowHash="h1", status="waiting", seq=1, input={},
                         createdAt=1000, updatedAt=1000)
        store.create_run(kept, [(1, 1000, packed)], b'{"state":{},"outputs":{}}', blobs)
        gone = RunRecord(runId="run_gone", flowName="f", flowHash="h1", status="completed", seq=1, input={},
                         createdAt=1000, updatedAt=1000)
        store.create_run(gone, [(1, 1000, b'{"type":"flow:start","seq":1}')],
                         b'{"state":{"a":{"$blob":"k2"}},"outputs":{"n":{"$chunks":["k1"],"$tail":[]}}}')
        report = prune(store, older_than_ms=1000)
        assert report.runs == 1 and report.blobs == 1  # k2 only: k1 and the block under it are in use
        assert set(store.read_blobs(["k1", "k2", "k3"])) == {"k1", "k3"}
        out = BytesIO()
        export_runs(store, ["run_kept"], out)
        archive = json.loads(out.getvalue())["archive"]
        assert set(archive["blobs"]) == {"k1", "k3"}
    finally:
        store.close()


def test_prune_works_in_batches_and_reports_progress(tmp_path: Path) -> None:
    kernel = _kernel(str(tmp_path / "runs.db"))
    try:
        flow = kernel.compile({"name": "tiny", "nodes": [{"id": "a", "type": "transform", "input": {"expr": "1"}}],
                               "edges": []})
        ids = [anyio.run(kernel.run, flow, {}).runId for _ in range(3)]
        newest = max(kernel.store.get_run(i).updatedAt for i in ids)
        deadline = now_ms() + 5000
        while now_ms() <= newest and now_ms() < deadline:  # "older than 0 s": strictly before now
            pass
        lines: list[str] = []
        report = prune(kernel.store, older_than_ms=0, batch=1, progress=lines.append, progress_after_s=0)
        assert (report.runs, report.dryRun) == (3, False)
        # four events a run: flow:start, node:start, node:complete, flow:complete
        assert lines == [f"prune: {n} run{'s' * (n > 1)} (0 child runs, {4 * n} events) deleted so far"
                         for n in (1, 2, 3)]
        assert kernel.runs() == []
    finally:
        kernel.close()
