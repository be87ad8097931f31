"""Replay audit: folding a run's stored events through the reducer must give its stored snapshot.

The shell writes checkpoints from its live, incrementally built snapshot; this rebuilds the same
snapshot from scratch out of the event log and compares. A difference means the reducer depends on
something that is not in the events (a clock, a mutation, an id), which would break resume.
"""

from __future__ import annotations

import json
from typing import Any

from flowkernel.core.compiler import CompiledFlow, compile_flow
from flowkernel.core.events import FlowStart, decode
from flowkernel.core.reducer import fold
from flowkernel.history.agent_runs import AgentTypes, fold_agent_runs
from flowkernel.plugins.registry import default_registry
from flowkernel.store.base import Store
from flowkernel.store.checkpoint import load_checkpoint


class _AnyType:
    """Accept every node type: the audit needs the graph, not the node implementations."""

    def __contains__(self, item: object) -> bool:
        return True


def audit_run(store: Store, run_id: str, agent_types: AgentTypes | None = None) -> None:
    """Raise AssertionError if the run's events do not fold into its latest stored checkpoint (and its
    agent runs, which ``agent_types`` says the nodes of: the default registry unless given)."""
    record = store.get_run(run_id)
    checkpoint = load_checkpoint(store, run_id)
    if checkpoint is None:
        return
    cp_seq, stored = checkpoint
    compiled: dict[str, CompiledFlow] = {}

    def flows(flow_hash: str) -> CompiledFlow:
        if flow_hash not in compiled:
            compiled[flow_hash] = compile_flow(json.loads(store.get_flow(flow_hash)), source=f"<audit {run_id}>",
                                               node_types=_AnyType())
        return compiled[flow_hash]

    events = [decode(b) for b in store.read_events(run_id, until=cp_seq)]
    seqs = [e.seq for e in events]
    if seqs != list(range(1, len(seqs) + 1)):
        raise AssertionError(f"run {run_id}: event seq is not gapless from 1: {seqs[:10]}…")
    # Folded from the flow the run started with; a flow:updated switches to the one it names.
    first = events[0]
    flow = flows(first.flowHash if isinstance(first, FlowStart) else record.flowHash)
    rebuilt = fold(flow, events, flows=flows)
    if rebuilt != stored:
        raise AssertionError(f"run {run_id}: replaying {len(events)} events does not reproduce the stored "
                             f"snapshot at seq {cp_seq}:\n{_diff(rebuilt, stored)}")
    # The run row's usage and cost are the fold of the whole log, kept by every commit that moves them.
    whole = fold(flows(rebuilt.flowHash), [decode(b) for b in store.read_events(run_id, after=cp_seq)], rebuilt,
                 flows=flows)
    if whole.flowHash != record.flowHash:
        raise AssertionError(f"run {run_id}: the run row names flow {record.flowHash}, its events {whole.flowHash}")
    if _nonzero(record.usage) != _nonzero(whole.usage) or record.totalCostUsd != whole.totalCostUsd:
        raise AssertionError(f"run {run_id}: the run row says usage {record.usage} costing "
                             f"{record.totalCostUsd}, its events add up to {whole.usage} costing {whole.totalCostUsd}")
    # So are its agent runs: each row the fold of the events of its node run.
    folded = {r.agentRunId: r for r in fold_agent_runs(flow, [decode(b) for b in store.read_events(run_id)],
                                                       flows=flows, agent_types=agent_types or default_registry())}
    kept = {r.agentRunId: r for _, r in store.list_agent_runs(run_id=run_id, limit=2**31)}
    if folded != kept:
        lines = [f"  agent run {k}: replayed {_brief(folded.get(k))} != stored {_brief(kept.get(k))}"
                 for k in sorted(set(folded) | set(kept)) if folded.get(k) != kept.get(k)]
        raise AssertionError(f"run {run_id}: its agent runs differ from a replay of its events:\n" + "\n".join(lines))


def _brief(row: Any) -> str:
    import msgspec

    return json.dumps(msgspec.to_builtins(row))[:400] if row is not None else "(none)"


def _nonzero(usage: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in usage.items() if v}


def audit_store(store: Store) -> int:
    """Audit every run in ``store``; returns how many were checked."""
    runs = store.list_runs(limit=100_000)
    for r in runs:
        audit_run(store, r.runId)
    return len(runs)


def _diff(a: Any, b: Any) -> str:
    import msgspec

    da = msgspec.to_builtins(a)
    db = msgspec.to_builtins(b)
    lines = []
    for key in sorted(set(da) | set(db)):
        if da.get(key) != db.get(key):
            lines.append(f"  {key}: replayed {json.dumps(da.get(key))[:300]} != stored {json.dumps(db.get(key))[:300]}")
    return "\n".join(lines)
