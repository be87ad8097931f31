"""Continuing a run on an updated flow (``resume``/``retry --flow``): what an update may change.

An update may change anything that has not happened yet. Whatever the run has already done must
still mean the same in the new flow, or its history would describe another graph: every node that
has run (or was skipped) keeps its id, and every edge that was decided (or counted loop passes)
keeps its id, its ends and its kind (plain, loop or forEach). Nodes and edges that have not run nor
been decided may be changed, added or removed freely; that is how a bug in a failed node's input
is fixed, or a step is added after a node that completed.

Pure: a snapshot and two compiled flows in, the list of problems out (empty: the update is allowed).
"""

from __future__ import annotations

from flowkernel.core.compiler import CompiledEdge, CompiledFlow
from flowkernel.core.snapshot import RunSnapshot


def _kind(edge: CompiledEdge) -> str:
    if edge.is_loop:
        return "a loop edge"
    if edge.for_each is not None:
        return "a forEach edge"
    return "a plain edge"


def _node_history(snap: RunSnapshot, node_id: str) -> str | None:
    """How the node took part in the run so far (its status), or None if it has not."""
    status = snap.nodeStatus.get(node_id, "pending")
    if status != "pending":
        return status
    if node_id in snap.nodeRuns or node_id in snap.outputs:
        return "ran before a loop reset it"
    return None


def _edge_history(snap: RunSnapshot, edge_id: str) -> str | None:
    """How the edge was decided so far, or None if it has not been."""
    status = snap.edgeStatus.get(edge_id, "pending")
    if status != "pending":
        return status
    if edge_id in snap.loopCounters:
        return f"looped {snap.loopCounters[edge_id]} time(s)"
    return None


def incompatibilities(old: CompiledFlow, new: CompiledFlow, snap: RunSnapshot) -> list[str]:
    """Every reason the run in ``snap`` (following ``old``) cannot continue on ``new``, one line each."""
    problems: list[str] = []
    for node_id in old.nodes:
        history = _node_history(snap, node_id)
        if history is not None and node_id not in new.nodes:
            problems.append(f"node {node_id!r} has run in this run ({history}) but the new flow has no node "
                            f"{node_id!r}: a node that has run must keep its id")
    for edge_id, edge in old.edges.items():
        history = _edge_history(snap, edge_id)
        if history is None:
            continue
        changed = new.edges.get(edge_id)
        if changed is None:
            problems.append(f"edge {edge_id!r} was decided in this run ({history}) but the new flow has no edge "
                            f"{edge_id!r}: a decided edge must keep its id")
            continue
        if (changed.source, changed.target) != (edge.source, edge.target):
            problems.append(f"edge {edge_id!r} was decided in this run ({history}) from {edge.source!r} to "
                            f"{edge.target!r}; the new flow has it from {changed.source!r} to {changed.target!r}")
        if _kind(changed) != _kind(edge):
            problems.append(f"edge {edge_id!r} was decided in this run ({history}) as {_kind(edge)}; "
                            f"the new flow makes it {_kind(changed)}")
    return problems
