"""Agent runs (DESIGN §10): one per node run of an agent node, folded from the run's events.

An agent node is one whose node type declares ``records_agent_runs`` (``claude.agent`` does;
``flowkernel.core.node.RecordsAgentRuns``); the fold asks an ``AgentTypes`` (a registry) by type name,
and knows no node type itself.

An agent run is what one node run of an agent did: when it started and ended, how it ended, how many
model calls it made and what they cost. Its id is the node run id (``nr_…``), the ``runId`` of its
stored messages and tool calls. Everything here is a fold of the event log:

- ``node:start`` of an agent node begins one (``resumedFrom`` when it continues an interrupted or
  waiting node run's conversation); the start of a ``forEach`` group is not one, its items are;
- ``agent:start`` gives its session and model; each ``agent:usage`` is one step (a model call) and
  adds its tokens and cost; ``agent:complete`` its final text (``summary``);
- ``node:complete`` ends it ``completed``; ``node:error`` ``failed`` (a retry is a new node run);
  ``node:waiting`` makes it ``waiting`` until the reply starts the node run that continues it;
- it is ``interrupted`` when it stops unfinished: the run paused, failed, was aborted or resumed
  after a crash while it was running, a loop edge reset its node, or (waiting) its conversation
  continued in a new node run. The run shell keeps the ``agent_runs`` table with every commit, in
  the same transaction as the events, by folding what it appends onto the rows still open; the
  replay audit folds the whole log again and compares.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import msgspec
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import (
    USAGE_KEYS,
    AgentComplete,
    AgentStart,
    AgentUsage,
    BaseEvent,
    FlowComplete,
    FlowPaused,
    FlowResumed,
    FlowStart,
    FlowUpdated,
    LoopIterate,
    NodeComplete,
    NodeError,
    NodeStart,
    NodeWaiting,
)
from flowkernel.core.reducer import FlowLookup, apply, initial_snapshot, own
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.store.base import AgentRun, Store

# The events that change agent runs: the shell folds only these.
FOLDED = frozenset({NodeStart, NodeComplete, NodeError, NodeWaiting, AgentStart, AgentUsage, AgentComplete,
                    FlowStart, FlowPaused, FlowResumed, FlowComplete, LoopIterate})
STATUSES = ("running", "waiting", "completed", "failed", "interrupted")
OPEN = frozenset({"running", "waiting"})  # statuses a later event can still change


class AgentTypes(Protocol):
    """Which node types record agent runs, by type name (``flowkernel.plugins.registry.Registry`` is one)."""

    def records_agent_runs(self, type_name: str) -> bool: ...

    def agent_max_steps(self, type_name: str, node_input: Any) -> int | None: ...


class AgentRunFold:
    """Folds a run's events into its agent runs, one event at a time.

    ``rows``: the run's agent runs that are still open (as stored); ``changed()`` hands over the rows
    that events changed since it was last called.
    """

    def __init__(self, flow: CompiledFlow, run_id: str, parent_run_id: str | None,
                 rows: Iterable[AgentRun] = (), *, agent_types: AgentTypes) -> None:
        self.run_id = run_id
        self.parent_run_id = parent_run_id
        self._types = agent_types
        self.agent_nodes = agent_nodes(flow, agent_types)
        self._node_types = {n: node.type for n, node in flow.nodes.items()}
        self._reset_sets = flow.reset_sets
        self.rows: dict[str, AgentRun] = {r.agentRunId: r for r in rows}
        self._dirty: set[str] = set()

    def follow(self, flow: CompiledFlow) -> None:
        """From here on the run follows ``flow`` (a ``flow:updated``)."""
        self.agent_nodes = agent_nodes(flow, self._types)
        self._node_types = {n: node.type for n, node in flow.nodes.items()}
        self._reset_sets = flow.reset_sets

    @classmethod
    def for_run(cls, flow: CompiledFlow, snap: RunSnapshot, store: Store,
                agent_types: AgentTypes) -> AgentRunFold | None:
        """The fold that continues ``snap``'s run from its stored open agent runs; None if its flow has
        no agent node (nothing to keep)."""
        if not agent_nodes(flow, agent_types):
            return None
        rows = [r for _, r in store.list_agent_runs(run_id=snap.runId, open_only=True, limit=2**31)]
        return cls(flow, snap.runId, snap.parentRunId, rows, agent_types=agent_types)

    def apply(self, before: RunSnapshot | None, ev: BaseEvent) -> None:
        """Fold ``ev``; ``before`` is the run's snapshot just before it (``None`` for ``flow:start``)."""
        run_id = ev.runId
        if run_id is not None:
            row = self.rows.get(run_id)
            if isinstance(ev, NodeStart):
                self._start(before, ev)
                return
            if row is None:
                return
            if isinstance(ev, AgentUsage):
                row.stepCount += 1
                row.usage = {k: row.usage.get(k, 0) + int(ev.usage.get(k, 0)) for k in USAGE_KEYS}
                row.totalCostUsd += ev.costUsd  # in event order, as the run's own total: equal to the bit
                row.model = row.model or ev.model
            elif isinstance(ev, AgentStart):
                row.sessionId, row.model = ev.sessionId, ev.model
            elif isinstance(ev, AgentComplete):
                row.summary = ev.result if isinstance(ev.result, str) else None
            elif isinstance(ev, NodeComplete):
                self._end(row, "completed", ev.timestamp)
            elif isinstance(ev, NodeError):
                self._end(row, "failed", ev.timestamp)
                row.errorMessage = ev.message
            elif isinstance(ev, NodeWaiting):
                row.status = "waiting"
            else:
                return
            self._dirty.add(run_id)
        elif isinstance(ev, FlowStart):
            self.parent_run_id = ev.parentRunId
        elif isinstance(ev, FlowPaused):
            self._interrupt(ev.timestamp, ("running",))  # a waiting agent run waits on across a pause
        elif isinstance(ev, FlowResumed):
            self._interrupt(ev.timestamp, ("running",))  # still running: its executor died
        elif isinstance(ev, FlowComplete):
            self._interrupt(ev.timestamp, OPEN)
        elif isinstance(ev, LoopIterate):
            reset = set(self._reset_sets.get(ev.edgeId, ()))
            self._interrupt(ev.timestamp, OPEN, lambda row: row.agentId in reset)

    def _start(self, before: RunSnapshot | None, ev: NodeStart) -> None:
        n = ev.nodeId or ""
        if n not in self.agent_nodes or before is None:
            return
        if ev.item is None and n in before.forEach:
            return  # the group start of a forEach node: its items are the agent runs
        if ev.resumedFrom is not None:
            self._interrupt(ev.timestamp, OPEN, lambda row: row.agentRunId == ev.resumedFrom)
        run_id = ev.runId or ""
        self.rows[run_id] = AgentRun(agentRunId=run_id, runId=self.run_id, agentId=n, status="running",
                                     createdAt=ev.timestamp, attempt=ev.attempt, item=ev.item,
                                     maxSteps=self._types.agent_max_steps(self._node_types[n], ev.input),
                                     resumedFrom=ev.resumedFrom,
                                     parentRunId=self.parent_run_id, usage=dict.fromkeys(USAGE_KEYS, 0))
        self._dirty.add(run_id)

    def _end(self, row: AgentRun, status: str, at: int) -> None:
        row.status, row.completedAt, row.durationMs = status, at, at - row.createdAt

    def _interrupt(self, at: int, statuses: Sequence[str] | frozenset[str], which: Any = None) -> None:
        for row in self.rows.values():
            if row.status in statuses and (which is None or which(row)):
                self._end(row, "interrupted", at)
                self._dirty.add(row.agentRunId)

    def changed(self) -> list[AgentRun]:
        """Copies of the rows changed since the last call (for the store). Rows that can no longer
        change are forgotten: a long run keeps only its open agent runs in memory."""
        if not self._dirty:
            return []
        out = [self.rows[r] for r in self._dirty]
        self._dirty.clear()
        for row in out:
            if row.status in ("completed", "failed"):
                del self.rows[row.agentRunId]
        return [msgspec.structs.replace(r, usage=dict(r.usage)) for r in out]


def agent_nodes(flow: CompiledFlow, agent_types: AgentTypes) -> frozenset[str]:
    """The nodes of ``flow`` whose node runs are agent runs."""
    records = {t: agent_types.records_agent_runs(t) for t in {node.type for node in flow.nodes.values()}}
    return frozenset(n for n, node in flow.nodes.items() if records[node.type])


def fold_agent_runs(flow: CompiledFlow, events: Sequence[BaseEvent], *, agent_types: AgentTypes,
                    flows: FlowLookup | None = None) -> list[AgentRun]:
    """Every agent run of a run, from its whole log, in the order they started: what the table holds.
    ``flow`` and ``flows`` as for ``flowkernel.core.reducer.fold``."""
    if not events:
        return []
    fold = AgentRunFold(flow, events[0].flowRunId, None, agent_types=agent_types)
    snap: RunSnapshot | None = None
    for ev in events:
        if isinstance(ev, FlowUpdated):
            if flows is None:
                raise ValueError(f"event {ev.seq} is flow:updated: folding it needs the flows lookup")
            flow = flows(ev.toHash)
            fold.follow(flow)
        fold.apply(snap, ev)  # before the reducer: it changes the snapshot's maps in place
        if snap is None:
            snap = own(initial_snapshot(flow, ev)) if isinstance(ev, FlowStart) else None
        else:
            snap, _ = apply(flow, snap, ev, owned=True)
    return list(fold.rows.values())


class AgentRunBackfill:
    """The ``Backfill`` a store migrating from before schema 9 folds agent runs with
    (``flowkernel.store.base``): the runs of flows with an agent node, as ``agent_types`` says."""

    def __init__(self, agent_types: AgentTypes) -> None:
        self._types = agent_types

    def wants(self, document: str) -> bool:
        import json

        try:
            nodes = json.loads(document).get("nodes") or []
        except (ValueError, AttributeError):
            return False
        return any(isinstance(n, dict) and isinstance(n.get("type"), str) and self._types.records_agent_runs(n["type"])
                   for n in nodes)

    def __call__(self, document: str, bodies: Sequence[bytes]) -> list[AgentRun]:
        """The agent runs of a stored run, from its flow document (as stored) and its event bodies."""
        import json

        from flowkernel.core.compiler import compile_flow
        from flowkernel.core.events import decode

        flow = compile_flow(json.loads(document), node_types=(), trusted=True)  # validated when it was stored
        return fold_agent_runs(flow, [decode(b) for b in bodies], agent_types=self._types)
