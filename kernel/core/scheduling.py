"""The scheduling rules (DESIGN §3), pure: given a snapshot, which events must happen next.

``decide`` looks at the nodes whose situation may have changed and returns drafts: edge decisions,
loop iterations, skips, node starts (``runId`` left empty for the shell to fill), forEach items and
their aggregate, waiting and completion of the run. Applying the drafts through the reducer and
deciding again until nothing is left is one step of the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
from flowkernel.core.compiler import CompiledFlow, CompiledNode
from flowkernel.core.events import (
    BaseEvent,
    EdgeFire,
    EdgeSkip,
    FlowComplete,
    FlowResumed,
    FlowWaiting,
    LoopExhausted,
    LoopIterate,
    NodeComplete,
    NodeError,
    NodeSkipped,
    NodeStart,
)
from flowkernel.core.expressions import ALWAYS, is_constant
from flowkernel.core.snapshot import ForEachState, RunSnapshot
from flowkernel.errors import ExpressionError
from msgspec import UNSET

EMPTY: Mapping[str, Any] = {}


class Decision(msgspec.Struct):
    drafts: list[BaseEvent] = msgspec.field(default_factory=list)
    deferred: set[str] = msgspec.field(default_factory=set)  # ready, but no capacity yet


def binding_context(snap: RunSnapshot) -> dict[str, Any]:
    """What ``{{ }}`` and ``when`` see: ``flow.input``, ``state`` and every node's output."""
    ctx: dict[str, Any] = dict(snap.outputs)
    ctx["flow"] = {"input": snap.input}
    ctx["state"] = snap.state
    return ctx


def item_variables(fe: ForEachState, index: int, as_name: str, ctx: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Context and variables for forEach item ``index``: the ``as`` name, $iteration, $first, $last."""
    item_ctx = dict(ctx)
    item_ctx[as_name] = fe.items[index]
    variables = {"iteration": index, "first": index == 0, "last": index == len(fe.items) - 1}
    return item_ctx, variables


def running_count(snap: RunSnapshot) -> int:
    """Node runs that occupy a concurrency slot."""
    count = 0
    for n, st in snap.nodeStatus.items():
        if st == "running":
            fe = snap.forEach.get(n)
            count += len(fe.running) if fe is not None else 1
    return count


class Progress:
    """What ``decide`` would otherwise count again on every step, derived from a snapshot: per node, its
    non-loop incoming edges that are pending, fired and skipped (a join of 8,000 branches is judged by
    three numbers), and per running forEach group, its items finished and the first item that may not
    have started yet (items start in order).

    Counted from the snapshot when first asked for, then kept up to date by ``follow`` as each event
    is applied, so the run shell can hand it to ``decide`` on every step; ``decide`` without it counts
    from the snapshot, with the same result.
    """

    __slots__ = ("_edges", "_items")

    def __init__(self) -> None:
        # node -> (pending, fired, skipped) incoming edges. Tuples of ints, not lists: the cyclic collector
        # stops tracking those at its first pass, where a list per node of a large fan-in stays tracked and
        # makes each full collection during the run longer and the next one sooner.
        self._edges: dict[str, tuple[int, int, int]] = {}
        self._items: dict[str, list[int]] = {}  # forEach node -> [items finished, first maybe not started]

    def edges(self, flow: CompiledFlow, snap: RunSnapshot, n: str) -> tuple[int, int, int]:
        counts = self._edges.get(n)
        if counts is None:
            pending = fired = skipped = 0
            for eid in flow.incoming[n]:
                st = snap.edgeStatus[eid]
                if st == "pending":
                    pending += 1
                elif st == "fired":
                    fired += 1
                else:
                    skipped += 1
            counts = self._edges[n] = (pending, fired, skipped)
        return counts

    def items(self, snap: RunSnapshot, n: str) -> list[int]:
        counts = self._items.get(n)
        if counts is None:
            fe = snap.forEach[n]
            cursor = next((i for i, r in enumerate(fe.results) if r is None and str(i) not in fe.running),
                          len(fe.results))
            counts = self._items[n] = [sum(r is not None for r in fe.results), cursor]
        return counts

    def follow(self, flow: CompiledFlow, ev: BaseEvent) -> None:
        """``ev`` was just applied to the snapshot this counts."""
        t = type(ev)
        if t is EdgeFire or t is EdgeSkip:
            edge = flow.edges[ev.edgeId]  # type: ignore[attr-defined]
            edge_counts = self._edges.get(edge.target)
            if edge_counts is not None and not edge.is_loop:
                pending, fired, skipped = edge_counts
                self._edges[edge.target] = (pending - 1, fired + 1, skipped) if t is EdgeFire \
                    else (pending - 1, fired, skipped + 1)
            if t is EdgeFire and ev.items is not None:  # type: ignore[attr-defined]
                self._items.pop(edge.target, None)  # a new group
        elif t is NodeStart or t is NodeComplete or t is NodeSkipped or t is NodeError:
            item = ev.item  # type: ignore[attr-defined]
            counts = self._items.get(ev.nodeId or "")
            if counts is None:
                return
            if item is None:
                if t is not NodeStart:
                    del self._items[ev.nodeId or ""]  # the group finished: its state is gone
                return
            if t is not NodeStart and (t is not NodeError or not ev.willRetry):  # type: ignore[attr-defined]
                counts[0] += 1
            if (t is NodeStart or t is NodeSkipped) and item >= counts[1]:
                counts[1] = item + 1
        elif t is LoopIterate:
            for n in flow.reset_sets[ev.edgeId]:  # type: ignore[attr-defined]
                self._items.pop(n, None)
                for e in flow.outgoing[n]:
                    self._edges.pop(flow.edges[e].target, None)
        elif t is FlowResumed:  # interrupted items start again, a retry clears failed ones: count anew
            self._items.clear()


class _Context:
    """The binding context, built on first use: most edges and inputs never look at it, and building
    it copies every node's output."""

    __slots__ = ("_snap", "_value")

    def __init__(self, snap: RunSnapshot) -> None:
        self._snap = snap
        self._value: dict[str, Any] | None = None

    def get(self) -> dict[str, Any]:
        if self._value is None:
            self._value = binding_context(self._snap)
        return self._value


def awake(flow: CompiledFlow, snap: RunSnapshot) -> set[str]:
    """The nodes ``decide`` may do something with in ``snap``: what to hand it when the whole run may
    have changed (loaded, resumed), instead of every node. Left out are those it passes over: a node
    done or skipped whose outgoing edges are all decided, a pending node one of whose incoming edges
    is pending, a running node that is not a forEach group. A run of 10,000 nodes resumed halfway
    then starts after looking at one node, not all of them."""
    node_status, edge_status, outgoing, incoming = snap.nodeStatus, snap.edgeStatus, flow.outgoing, flow.incoming
    out: set[str] = set()
    for n in flow.nodes:  # (loops, not any(): this runs over every node of the flow)
        st = node_status.get(n)
        if st == "done" or st == "skipped":
            for e in outgoing[n]:
                if edge_status[e] == "pending":
                    out.add(n)
                    break
        elif st == "pending":
            for e in incoming[n]:
                if edge_status[e] == "pending":
                    break
            else:
                out.add(n)
        elif st != "running" or n in snap.forEach:
            out.add(n)  # failed (whatever its policy), waiting, a running forEach group
    return out


def decide(flow: CompiledFlow, snap: RunSnapshot, candidates: Iterable[str], running: int,
           finish: bool = True, progress: Progress | None = None) -> Decision:
    """Drafts for what must happen next. ``running`` is the number of node runs in flight;
    ``progress``, when given, must be the snapshot's (see ``Progress``)."""
    if snap.status != "running":
        return Decision()
    decision = Decision()
    capacity = flow.max_concurrency - running
    ctx = _Context(snap)
    nodes = flow.nodes
    order = [c for c in candidates if c in nodes]
    if len(order) > 1:
        order = sorted(set(order), key=lambda n: nodes[n].index)
    for pos, n in enumerate(order):
        st = snap.nodeStatus[n]
        node = nodes[n]
        if st in ("done", "skipped") or (st == "failed" and node.policy.continueOnError):
            stop = _decide_edges(flow, snap, n, ctx, decision)
            if stop:  # a loop reset part of the graph: decide the rest again on the new snapshot
                decision.deferred.update(order[pos:])
                return decision
        elif st == "failed":
            fault = snap.faults.get(n)
            reason = f"node {n!r} failed: {fault.message}" if fault else f"node {n!r} failed"
            decision.drafts.append(FlowComplete(status="failed", error=reason))
            return decision
        elif st == "pending":
            verdict = _gate(flow, snap, n) if progress is None else _counted_gate(flow, snap, progress, n)
            if verdict == "wait":
                continue
            if verdict == "skip":
                decision.drafts.append(NodeSkipped(nodeId=n, reason="edge"))
                continue
            if capacity <= 0 and n not in flow.for_each_into:
                decision.deferred.add(n)
                continue
            capacity -= _start(flow, snap, node, ctx, decision)
        elif st == "running" and n in snap.forEach:
            capacity -= _advance_for_each(flow, snap, node, ctx, capacity, decision, progress)
        elif st == "waiting":
            w = snap.waiting.get(n)
            if w is not None and any(m.seq > w.since for m in snap.inbox.get(w.runId, ())):
                if capacity <= 0:
                    decision.deferred.add(n)
                    continue
                capacity -= 1
                decision.drafts.append(NodeStart(nodeId=n, attempt=snap.attempts.get(n, 1),
                                                 input=_resolve(node, ctx.get()),
                                                 resumedFrom=w.runId))
    if finish and not decision.drafts and not decision.deferred and running == 0:
        _finish(flow, snap, decision)
    return decision


def _decide_edges(flow: CompiledFlow, snap: RunSnapshot, n: str, ctx: _Context,
                  decision: Decision) -> bool:
    skipped = snap.nodeStatus[n] == "skipped"
    for eid in flow.outgoing[n]:
        if snap.edgeStatus[eid] != "pending":
            continue
        e = flow.edges[eid]
        if skipped:
            decision.drafts.append(EdgeSkip(edgeId=eid, from_=e.source, to=e.target))
            continue
        counter = snap.loopCounters.get(eid, 0)
        try:
            fires = e.when is ALWAYS or e.when.holds(ctx.get(), {"iteration": counter} if e.is_loop else None)
        except ExpressionError as exc:
            decision.drafts.append(FlowComplete(status="failed", error=f"edge {eid!r}: when failed: {exc}"))
            return True
        if not fires:
            decision.drafts.append(EdgeSkip(edgeId=eid, from_=e.source, to=e.target))
        elif e.is_loop:
            if counter >= (e.max_iterations or 0):
                decision.drafts.append(LoopExhausted(edgeId=eid, iteration=counter))
                decision.drafts.append(EdgeSkip(edgeId=eid, from_=e.source, to=e.target))
            else:
                decision.drafts.append(EdgeFire(edgeId=eid, from_=e.source, to=e.target))
                decision.drafts.append(LoopIterate(edgeId=eid, iteration=counter + 1))
                # Whatever follows was judged on the snapshot before the reset: decide it again.
                return True
        elif e.for_each is not None:
            try:
                items = e.for_each.evaluate(ctx.get())
            except ExpressionError as exc:
                decision.drafts.append(FlowComplete(status="failed", error=f"edge {eid!r}: forEach.in failed: {exc}"))
                return True
            if items is None:
                items = []
            elif not isinstance(items, list):
                items = [items]
            decision.drafts.append(EdgeFire(edgeId=eid, from_=e.source, to=e.target, items=items))
        else:
            decision.drafts.append(EdgeFire(edgeId=eid, from_=e.source, to=e.target))
    return False


def _gate(flow: CompiledFlow, snap: RunSnapshot, n: str) -> str:
    """``ready``, ``skip`` or ``wait`` for a pending node, from its non-loop incoming edges."""
    incoming = flow.incoming[n]
    if not incoming:
        return "ready"
    fired = skipped = 0
    for eid in incoming:
        st = snap.edgeStatus[eid]
        if st == "pending":
            return "wait"
        if st == "fired":
            fired += 1
        else:
            skipped += 1
    if flow.gates[n] == "any":
        return "ready" if fired else "skip"
    return "skip" if skipped else "ready"


def _counted_gate(flow: CompiledFlow, snap: RunSnapshot, progress: Progress, n: str) -> str:
    """``_gate`` from the counts of ``progress``."""
    if not flow.incoming[n]:
        return "ready"
    pending, fired, skipped = progress.edges(flow, snap, n)
    if pending:
        return "wait"
    if flow.gates[n] == "any":
        return "ready" if fired else "skip"
    return "skip" if skipped else "ready"


def _resolve(node: CompiledNode, ctx: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> Any:
    return node.input.render(ctx, variables)


def _start(flow: CompiledFlow, snap: RunSnapshot, node: CompiledNode, ctx: _Context,
           decision: Decision) -> int:
    """Start a ready node (or skip it); returns the concurrency slots taken."""
    n = node.id
    resumed = snap.resumedFrom.get(n)
    # A node run that continues one a pause, a crash or a hand-over interrupted goes on with its attempt:
    # no attempt failed. (A retry of a failed node has its attempts cleared: it starts at 1.)
    attempt = snap.attempts[n] if resumed is not None and n in snap.attempts else snap.attempts.get(n, 0) + 1
    fe = snap.forEach.get(n)
    if fe is not None:
        # The group run: its items start as separate node runs, within capacity.
        decision.drafts.append(NodeStart(nodeId=n, attempt=attempt, input={"items": fe.items},
                                         resumedFrom=resumed))
        return 0
    try:
        if node.when is not ALWAYS and not node.when.holds(ctx.get()):
            decision.drafts.append(NodeSkipped(nodeId=n, reason="when"))
            return 0
        value = node.input.render(EMPTY) if is_constant(node.input) else _resolve(node, ctx.get())
    except ExpressionError as exc:
        decision.drafts.append(NodeStart(nodeId=n, attempt=attempt, input=None, resumedFrom=resumed))
        decision.drafts.append(NodeError(nodeId=n, errorType="binding_error", message=str(exc), attempt=attempt))
        return 0
    decision.drafts.append(NodeStart(nodeId=n, attempt=attempt, input=value, resumedFrom=resumed))
    return 1


def _advance_for_each(flow: CompiledFlow, snap: RunSnapshot, node: CompiledNode, context: _Context,
                      capacity: int, decision: Decision, progress: Progress | None) -> int:
    n = node.id
    fe = snap.forEach[n]
    counts = progress.items(snap, n) if progress is not None else None
    finished = counts[0] == len(fe.results) if counts is not None else all(r is not None for r in fe.results)
    if finished and not fe.running:
        errors = [r.error for r in fe.results if r is not None and r.error is not UNSET]
        if errors and not node.policy.continueOnError:
            decision.drafts.append(NodeError(
                nodeId=n, runId=snap.nodeRuns.get(n), errorType="item_failed", attempt=snap.attempts.get(n, 1),
                message=f"{len(errors)} of {len(fe.items)} items failed; first: {errors[0]}"))
        else:
            iterations = [None if r is None else r.as_json() for r in fe.results]
            decision.drafts.append(NodeComplete(nodeId=n, runId=snap.nodeRuns.get(n),
                                                output={"iterations": iterations}))
        return 0
    edge = flow.edges[flow.for_each_into[n]]
    taken = 0
    results = fe.results
    # Every item before the cursor has started or finished: start looking there.
    for i in range(counts[1] if counts is not None else 0, len(results)):
        if results[i] is not None or str(i) in fe.running:
            continue
        if taken >= capacity:
            decision.deferred.add(n)
            break
        item_ctx, variables = item_variables(fe, i, edge.for_each_as, context.get())
        try:
            if not node.when.holds(item_ctx, variables):
                decision.drafts.append(NodeSkipped(nodeId=n, reason="when", item=i))
                continue
            value = _resolve(node, item_ctx, variables)
        except ExpressionError as exc:
            decision.drafts.append(NodeStart(nodeId=n, item=i, input=None))
            decision.drafts.append(NodeError(nodeId=n, item=i, errorType="binding_error", message=str(exc)))
            continue
        decision.drafts.append(NodeStart(nodeId=n, item=i, input=value, resumedFrom=fe.resumedFrom.get(str(i))))
        taken += 1
    return taken


def _finish(flow: CompiledFlow, snap: RunSnapshot, decision: Decision) -> None:
    """Nothing in flight and nothing to do: the run completes, waits, or is stuck."""
    statuses = snap.nodeStatus
    if any(st == "waiting" for st in statuses.values()):
        decision.drafts.append(FlowWaiting(reason="waiting for input: " + ", ".join(
            n for n, st in statuses.items() if st == "waiting")))
        return
    stuck = [n for n, st in statuses.items() if st in ("pending", "running")]
    if not stuck:
        decision.drafts.append(FlowComplete(status="completed"))
        return
    # The candidates given may have missed something: look at every node before declaring it stuck.
    again = decide_all(flow, snap)
    if again.drafts:
        decision.drafts.extend(again.drafts)
        return
    decision.drafts.append(FlowComplete(status="failed", error="no node can start: " + ", ".join(stuck)))


def decide_all(flow: CompiledFlow, snap: RunSnapshot) -> Decision:
    """``decide`` over every node, without the completion check."""
    return decide(flow, snap, flow.nodes, running_count(snap), finish=False)
