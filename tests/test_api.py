"""The Python API for embedding: load, run, follow events live, inspect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.commands import Command
from flowkernel.core.events import BaseEvent
from flowkernel.run.kernel import Kernel
from flowkernel.store.base import Lease
from flowkernel.store.sql.sqlite import SqliteStore

import tests.plugins.waiters  # noqa: F401  (registers await_message)
from tests.helpers import flow, py, registry, run_flow, t

ROOT = Path(__file__).resolve().parent.parent


def test_follow_yields_events_live_from_another_kernel_until_the_run_stops(tmp_path: Path) -> None:
    runner = Kernel(SqliteStore(tmp_path / "runs.db"), registry=registry())
    watcher = Kernel(SqliteStore(tmp_path / "runs.db"), registry=registry())
    run_id = runner.create_run(runner.compile(flow([py("wait", "await_message"), {"id": "after", "type": "noop"}],
                                                   [{"from": "wait", "to": "after"}])), {})
    seen: list[BaseEvent] = []

    async def main() -> None:
        with anyio.fail_after(20):
            await both()

    async def both() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.execute, run_id)

            async def watch() -> None:
                async for ev in watcher.follow(run_id):
                    seen.append(ev)
                    if ev.type == "node:start" and ev.nodeId == "wait":
                        await watcher.command(run_id, Command(kind="send", target=ev.runId, content="go"))

            tg.start_soon(watch)

    anyio.run(main)
    assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
    assert seen[-1].type == "flow:complete"
    assert [e.seq for e in seen] == [e.seq for e in runner.events(run_id)]


def test_on_event_sees_every_stored_event_in_order(tmp_path: Path) -> None:
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"))
    live: list[Any] = []
    snap = anyio.run(lambda: kernel.run(kernel.load_flow(ROOT / "flows" / "hello.json"), {"name": "Lin"},
                                        on_event=live.append))
    assert snap.status == "completed"
    assert [e.seq for e in live] == [e.seq for e in kernel.events(snap.runId)]


def test_runs_lists_by_status_and_snapshot_at_a_past_seq(tmp_path: Path) -> None:
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"))
    hello = kernel.load_flow(ROOT / "flows" / "hello.json")
    done = anyio.run(kernel.run, hello, {"name": "Bo"})
    pending = kernel.create_run(hello, {"name": "Cy"})
    assert [r.runId for r in kernel.runs(status="completed")] == [done.runId]
    assert [r.runId for r in kernel.runs(status="running")] == [pending]
    record = kernel.store.get_run(done.runId)
    assert record.seq == done.seq
    early = kernel.snapshot(done.runId, at=3)
    assert early.seq == 3 and early.status == "running"


def test_several_state_patches_from_one_node_run_all_land_in_order(tmp_path: Path) -> None:
    # The shell reuses the state a patch computed when nothing changed the state in between; every
    # later patch of the same node run was computed on an older state and must be applied afresh.
    seen: list[Any] = []

    def work(ctx: Any, tag: str) -> str:
        seen.append(ctx.patch_state("append", "log", f"{tag}-1"))
        ctx.patch_state("append", "log", f"{tag}-2")
        ctx.patch_state("set", "count", len(ctx.state.get("log", [])) + 2)
        ctx.patch_state("merge", "meta", {tag: True})
        return tag

    store = SqliteStore(tmp_path / "runs.db")
    kernel = Kernel(store, registry=registry(work=work))
    compiled = kernel.compile(flow([py("a", "work", {"tag": "a"}), py("b", "work", {"tag": "b"})],
                                   [{"from": "a", "to": "b"}], state={"initial": {"log": ["start"]}}))
    snap = anyio.run(kernel.run, compiled, None)
    # ctx.state includes the node run's own patches: b counts start, a-1, a-2, b-1 and b-2
    assert snap.state == {"log": ["start", "a-1", "a-2", "b-1", "b-2"], "count": 7, "meta": {"a": True, "b": True}}
    assert seen[0] == {"log": ["start", "a-1"]}  # what patch_state returns: the state with that patch applied
    assert kernel.snapshot(snap.runId) == snap  # stored checkpoint and log agree with the live snapshot


def test_a_snapshot_repr_is_whole_for_a_small_run_and_abbreviated_for_a_large_one() -> None:
    _, small, _ = run_flow(flow([t("a", "1"), t("b", "2")], [{"from": "a", "to": "b"}]))
    assert repr(small) == (
        f"RunSnapshot(runId={small.runId!r}, status='completed', seq={small.seq}, flowHash={small.flowHash!r}, "
        f"input={{}}, outputs={{'a': 1, 'b': 2}}, state={{}}, nodeStatus={{'a': 'done', 'b': 'done'}}, "
        f"edgeStatus={{'a->b': 'fired'}}, loopCounters={{}}, inbox={{}}, agentSessions={{}}, "
        f"nodeRuns={small.nodeRuns!r}, attempts={{'a': 1, 'b': 1}}, faults={{}}, waiting={{}}, forEach={{}}, "
        f"resumedFrom={{}}, staged={{}}, error=None, parentRunId=None, parentNodeRunId=None, usage={{}}, "
        f"totalCostUsd=0.0, nodeCostUsd={{}}, costLimits={{}}, budgetPause=None)")
    nodes = [t(f"n{i}", str(i)) for i in range(50)]
    _, large, _ = run_flow(flow(nodes, [{"from": f"n{i}", "to": f"n{i + 1}"} for i in range(49)]))
    text = repr(large)
    assert "outputs={'n0': 0, 'n1': 1, " in text and "'n9': 9, …40 more}" in text
    assert "'n10'" not in text and "edgeStatus={'n0->n1': 'fired'," in text and "…39 more}" in text


class _CountingStore(SqliteStore):
    """Counts the lease and flow transactions a run makes besides its commits."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.extra: list[str] = []

    def put_flow(self, flow_hash: str, name: str, document: str) -> None:
        self.extra.append("put_flow")
        super().put_flow(flow_hash, name, document)

    def acquire_lease(self, run_id: str, owner: str, now_ms: int, ttl_ms: int,
                      steal_from: str | None = None) -> Lease:
        self.extra.append("acquire_lease")
        return super().acquire_lease(run_id, owner, now_ms, ttl_ms, steal_from)

    def release_lease(self, run_id: str, lease: Lease) -> None:
        self.extra.append("release_lease")
        super().release_lease(run_id, lease)


def test_a_run_is_leased_from_its_creation_until_its_last_commit(tmp_path: Path) -> None:
    holders: list[Any] = []

    def look(ctx: Any) -> None:
        holders.append(ctx.store.get_run(ctx.flow_run_id).leaseOwner)

    store = _CountingStore(tmp_path / "runs.db")
    kernel = Kernel(store, registry=registry(look=look))
    compiled = kernel.compile(flow([py("a", "look"), py("b", "look")], [{"from": "a", "to": "b"}]))
    at_end: list[Any] = []
    snap = anyio.run(lambda: kernel.run(compiled, {}, on_event=lambda ev: at_end.append(
        (ev.type, store.get_run(ev.flowRunId or "").leaseOwner))))
    assert snap.status == "completed"
    assert holders == [kernel.owner, kernel.owner], "nobody else may execute the run while it runs"
    assert at_end[-1] == ("flow:complete", None), "the commit that completes the run ends its lease"
    # The flow, the run and its lease were stored together; the lease ended with the last commit.
    assert store.extra == []
    # Another process may take the run over at once: here it finds it completed.
    other = Kernel(SqliteStore(tmp_path / "runs.db"), registry=registry(look=look))
    assert anyio.run(other.execute, snap.runId).status == "completed"


@pytest.mark.no_audit  # the change bypasses the log, and the replay audit rightly says so
def test_a_run_changes_its_own_copy_of_the_flows_initial_state(tmp_path: Path) -> None:
    def grab(ctx: Any) -> int:
        ctx.state["items"].append("changed in place")  # wrong (state is read-only), and must stay local
        return len(ctx.state["items"])

    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), registry=registry(grab=grab))
    compiled = kernel.compile(flow([py("a", "grab")], state={"initial": {"items": []}}))
    first = anyio.run(kernel.run, compiled, {})
    second = anyio.run(kernel.run, compiled, {})
    assert first.outputs["a"] == second.outputs["a"] == 1
    assert compiled.initial_state == {"items": []}
