"""``KernelChildren``: the child runs of one node run (``flow.call``), as ``ctx.children`` offers them
(``flowkernel.core.node_context.ChildRuns``), over the Kernel, which the node never sees."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from flowkernel.core.commands import Command
from flowkernel.core.events import BaseEvent, Event, FlowResumed, NodeStart
from flowkernel.core.snapshot import RunSnapshot

if TYPE_CHECKING:
    from flowkernel.core.compiler import CompiledFlow
    from flowkernel.store.base import RunRecord, Store


class _KernelOps(Protocol):
    """What child runs need of the Kernel (typed here, so this module never imports it)."""

    @property
    def store(self) -> Store: ...

    def load_flow(self, path: str | Path) -> CompiledFlow: ...

    def create_run(self, flow: CompiledFlow, input: Any = None, *, parent_run_id: str | None = None,
                   parent_node_run_id: str | None = None, run_id: str | None = None) -> str: ...

    def events(self, run_id: str, after: int = 0, until: int | None = None) -> list[Event]: ...

    def runs(self, status: str | None = None, parent: str | None = None, limit: int = 1000) -> list[RunRecord]: ...

    def snapshot(self, run_id: str, at: int | None = None) -> RunSnapshot: ...

    async def resume(self, run_id: str, message: str | None = "continue", *, budget: float | None = None) -> RunSnapshot: ...

    async def retry(self, run_id: str) -> RunSnapshot: ...

    async def execute(self, run_id: str, *,
                      before: Callable[[RunSnapshot], list[BaseEvent]] | None = None) -> RunSnapshot: ...

    async def command(self, run_id: str, cmd: Command) -> Any: ...


class KernelChildren:
    """The child runs of node run ``node_run_id`` (node ``node_id``, forEach ``item``) of run ``run_id``."""

    def __init__(self, kernel: _KernelOps, *, run_id: str, node_id: str, node_run_id: str, item: int | None,
                 resumed_from: str | None) -> None:
        self._kernel = kernel
        self._run_id = run_id
        self._node_id = node_id
        self._node_run_id = node_run_id
        self._item = item
        self._resumed_from = resumed_from

    def ancestry(self) -> list[str]:
        names: list[str] = []
        current: str | None = self._run_id
        while current is not None and len(names) < 1000:
            record = self._kernel.store.get_run(current)
            names.append(record.flowName)
            current = record.parentRunId
        return names

    def load(self, path: Path) -> CompiledFlow:
        return self._kernel.load_flow(path)

    def adopt(self) -> str | None:
        """The child started by an earlier node run of this same pass (before a pause or crash)."""
        runs: list[str] = []
        for ev in self._kernel.events(self._run_id):
            if isinstance(ev, NodeStart) and ev.nodeId == self._node_id and ev.item == self._item:
                if ev.resumedFrom is None:
                    runs = []
                runs.append(ev.runId or "")
        mine = set(runs)
        children = [c for c in self._kernel.runs(parent=self._run_id) if c.parentNodeRunId in mine]
        return children[0].runId if children else None

    def create(self, flow: CompiledFlow, input: Any) -> str:
        return self._kernel.create_run(flow, input, parent_run_id=self._run_id, parent_node_run_id=self._node_run_id)

    async def drive(self, child_id: str, *, adopted: bool, resume_message: str | None,
                    raised_budget: float | None) -> RunSnapshot:
        kernel = self._kernel
        status = kernel.store.get_run(child_id).status
        resumed = self._resumed_from is not None
        if status == "paused" and resumed:
            return await kernel.resume(child_id, resume_message or "continue",
                                       budget=self._budget_for(child_id, raised_budget))
        if status == "failed" and resumed:
            return await kernel.retry(child_id)
        if status == "running" and adopted:
            # Its executor (this node's interrupted run, in a process that died) left it running: it is
            # resumed like any interrupted run, with the parent's resume message.
            return await kernel.resume(child_id, resume_message)
        if status in ("running", "waiting"):
            return await kernel.execute(child_id, before=_continue_waiting)
        return kernel.snapshot(child_id)

    def _budget_for(self, child_id: str, raised: float | None) -> float | None:
        """The limit to resume a child paused for its budget with: the one ``resume --budget`` gave this
        node in the parent, when that is above what the child spent (else the child decides)."""
        paused = self._kernel.snapshot(child_id).budgetPause
        return raised if raised is not None and paused is not None and raised > paused.costUsd else None

    async def command(self, child_id: str, command: Command) -> None:
        await self._kernel.command(child_id, command)

    def snapshot(self, child_id: str) -> RunSnapshot:
        return self._kernel.snapshot(child_id)


def _continue_waiting(snap: RunSnapshot) -> list[BaseEvent]:
    # A waiting child whose inbox now holds a reply continues; otherwise it stays as it is.
    if snap.status == "waiting" and any(snap.inbox.get(w.runId) for w in snap.waiting.values()):
        return [FlowResumed(message=None)]
    return []
