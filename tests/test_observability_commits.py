"""Streamed deltas are committed in groups, in order, and never hold a transition back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.events import AgentCompaction, AgentTextDelta, BaseEvent, StatePatch
from flowkernel.core.node_context import NodeContext
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore
from flowkernel.store.sql.sqlite import SqliteStore

from tests.helpers import flow, py, registry

HOUR_MS = 3_600_000  # a window no test waits out: whatever is committed early was not held back


class Commits:
    """The rows of every commit a store makes, in order."""

    def __init__(self, store: Any) -> None:
        self.rows: list[list[bytes]] = []
        real = store.commit

        def commit(run_id: str, rows: Any, *args: Any, **kwargs: Any) -> None:
            real(run_id, rows, *args, **kwargs)
            self.rows.append([body for _, _, body in rows])

        store.commit = commit

    def only_deltas(self) -> int:
        return sum(all(b'"agent:text:delta"' in body for body in rows) for rows in self.rows)


def _kernel(store: Any, window_ms: int, **functions: Any) -> Kernel:
    return Kernel(store, registry=registry(**functions), services={"observability_commit_ms": window_ms})


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_deltas_are_stored_in_the_order_they_were_emitted_with_transitions_among_them(kind: str,
                                                                                      tmp_path: Path) -> None:
    async def stream(ctx: NodeContext) -> str:
        for i in range(300):
            ctx.emit(AgentTextDelta(content=f"t{i} "))
            if i % 100 == 50:
                ctx.patch_state("append", "marks", i)
            await anyio.sleep(0)
        return "done"

    store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "runs.db")
    seen: list[BaseEvent] = []
    kernel = _kernel(store, 20, stream=stream)
    snap = anyio.run(lambda: kernel.run(kernel.compile(flow([py("m", "stream")], state={"initial": {"marks": []}})),
                                        {}, on_event=seen.append))
    assert snap.status == "completed" and snap.state["marks"] == [50, 150, 250]
    stored = kernel.events(snap.runId)
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    emitted = [(type(e), getattr(e, "content", None) or getattr(e, "value", None))
               for e in stored if isinstance(e, AgentTextDelta | StatePatch)]
    expected: list[tuple[type, Any]] = []
    for i in range(300):
        expected.append((AgentTextDelta, f"t{i} "))
        if i % 100 == 50:
            expected.append((StatePatch, i))
    assert emitted == expected
    assert [e.seq for e in seen] == [e.seq for e in stored]  # listeners get the same events, in the same order


def test_a_stream_of_deltas_is_committed_in_a_few_transactions() -> None:
    async def stream(ctx: NodeContext) -> str:
        for i in range(500):
            ctx.emit(AgentTextDelta(content=f"t{i} "))
            await anyio.sleep(0)
        return "done"

    store = MemoryStore()
    commits = Commits(store)
    kernel = _kernel(store, HOUR_MS, stream=stream)
    snap = anyio.run(kernel.run, kernel.compile(flow([py("m", "stream")])), {})
    assert snap.status == "completed"
    assert len(commits.rows) <= 3  # the start, then the deltas with the node's completion
    assert sum(len(rows) for rows in commits.rows) == len(kernel.events(snap.runId)) - 1


def test_a_compaction_record_is_committed_at_once_not_in_the_observability_window() -> None:
    store = MemoryStore()
    seen_stored: list[bool] = []

    async def compacting(ctx: NodeContext) -> str:
        ctx.emit(AgentCompaction(tokensBefore=150_000, tokensAfter=900, messagesKept=2))
        with anyio.fail_after(10):  # the window is an hour: only a prompt commit stores it in time
            while not any(b'"agent:compaction"' in b for b in store.read_events(ctx.flow_run_id)):
                await anyio.sleep(0.01)
        seen_stored.append(True)
        return "done"

    kernel = _kernel(store, HOUR_MS, compacting=compacting)
    snap = anyio.run(kernel.run, kernel.compile(flow([py("m", "compacting")])), {})
    assert snap.status == "completed", snap.error
    assert seen_stored == [True]


def test_a_transition_after_deltas_is_committed_at_once_with_them() -> None:
    store = MemoryStore()
    seen_stored: list[bool] = []

    async def stream(ctx: NodeContext) -> str:
        for i in range(50):
            ctx.emit(AgentTextDelta(content=f"t{i} "))
            await anyio.sleep(0)
        ctx.patch_state("set", "phase", "after the deltas")
        with anyio.fail_after(10):  # the deltas' window is an hour: only a prompt commit shows the patch
            while True:
                bodies = store.read_events(ctx.flow_run_id)
                if any(b'"state:patch"' in b for b in bodies):
                    break
                await anyio.sleep(0.01)
        seen_stored.append(sum(b'"agent:text:delta"' in b for b in bodies) == 50)
        return "done"

    kernel = _kernel(store, HOUR_MS, stream=stream)
    snap = anyio.run(kernel.run, kernel.compile(flow([py("m", "stream")])), {})
    assert snap.status == "completed", snap.error
    assert seen_stored == [True]  # every delta before the patch was committed with it


def test_deltas_waiting_for_their_window_are_committed_when_the_run_pauses() -> None:
    async def stream(ctx: NodeContext) -> str:
        for i in range(20):
            ctx.emit(AgentTextDelta(content=f"t{i} "))
            await anyio.sleep(0)
        await anyio.sleep(60)
        return "never"

    store = MemoryStore()
    kernel = Kernel(store, registry=registry(stream=stream),
                    services={"observability_commit_ms": HOUR_MS, "pause_grace_s": 0})

    async def main() -> Any:
        flow_ = kernel.compile(flow([py("m", "stream")]))
        run_id = kernel.create_run(flow_, {})
        async with anyio.create_task_group() as tg:
            tg.start_soon(kernel.execute, run_id)
            with anyio.fail_after(10):
                while kernel.executing(run_id) is None:
                    await anyio.sleep(0.01)
                while len(kernel.executing(run_id).appender.applied) < 20:  # type: ignore[union-attr]
                    await anyio.sleep(0.01)
            from flowkernel.core.commands import Command

            await kernel.command(run_id, Command(kind="pause"))
        return run_id

    run_id = anyio.run(main)
    stored = kernel.events(run_id)
    assert sum(isinstance(e, AgentTextDelta) for e in stored) == 20
    assert kernel.snapshot(run_id).status == "paused"
