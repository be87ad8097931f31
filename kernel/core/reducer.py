"""The pure reducer: ``apply(flow, snapshot, event) -> snapshot``.

Every change of a run's snapshot happens here and only here, driven by one event. No I/O, no clock,
no random ids: ids and timestamps arrive in the event. Folding a run's stored events through
``apply`` therefore rebuilds its snapshot exactly, at any past ``seq`` (see ``fold``).

``apply`` never mutates its arguments: it copies the maps it changes (structural sharing for the rest).
``apply(..., owned=True)`` changes the snapshot's own maps in place instead, for a caller that holds
the only reference to them (the run shell): copying a 1,000-entry status map on every event would
make a step cost in proportion to the flow's size. Both modes give equal snapshots.

A run may switch flows midway (``flow:updated``, from ``resume``/``retry --flow``): ``apply`` always
takes the flow in effect *after* the event, which for ``flow:updated`` is the new one, and ``fold``
looks that flow up by its hash (``flows``) and folds every later event with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from flowkernel.core.budgets import budget_key
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import (
    USAGE_KEYS,
    AgentStart,
    AgentUsage,
    BaseEvent,
    CommandReceived,
    EdgeFire,
    EdgeSkip,
    FlowComplete,
    FlowPaused,
    FlowResumed,
    FlowStart,
    FlowUpdated,
    FlowWaiting,
    InboxConsumed,
    LoopExhausted,
    LoopIterate,
    NodeComplete,
    NodeError,
    NodeSkipped,
    NodeStart,
    NodeWaiting,
    StatePatch,
)
from flowkernel.core.snapshot import (
    BudgetPause,
    ForEachState,
    InboxMessage,
    ItemResult,
    NodeFault,
    RunSnapshot,
    StagedPatch,
    Waiting,
)
from flowkernel.core.state_ops import apply_patch, apply_patches
from msgspec import UNSET
from msgspec.structs import replace

ALL: frozenset[str] = frozenset({"*"})  # "every node may be affected"

# The compiled flow stored under a hash: how a fold finds the flow a ``flow:updated`` switches to.
FlowLookup = Callable[[str], CompiledFlow]


def initial_snapshot(flow: CompiledFlow, start: FlowStart) -> RunSnapshot:
    """The snapshot right after ``flow:start``."""
    return RunSnapshot(
        runId=start.flowRunId, status="running", seq=start.seq, flowHash=start.flowHash,
        input=start.input, outputs={}, state=flow.initial_state,
        nodeStatus={n: "pending" for n in flow.nodes}, edgeStatus={e: "pending" for e in flow.edges},
        loopCounters={}, inbox={}, agentSessions={}, nodeRuns={},
        parentRunId=start.parentRunId, parentNodeRunId=start.parentNodeRunId,
    )


def fold(flow: CompiledFlow, events: Iterable[BaseEvent], snapshot: RunSnapshot | None = None, *,
         flows: FlowLookup | None = None) -> RunSnapshot:
    """Fold events into a snapshot; starts from ``flow:start`` when ``snapshot`` is None.

    ``flow`` is the flow in effect at the start (the one of ``flow:start``, or of ``snapshot``:
    its ``flowHash``); ``flows`` finds the flow a ``flow:updated`` switches to (needed only if one
    is among ``events``). ``snapshot`` is left as it is: the fold works on a copy of its maps.
    """
    snap = None if snapshot is None else own(snapshot)
    for ev in events:
        if type(ev) is FlowUpdated:
            if flows is None:
                raise ValueError(f"event {ev.seq} is flow:updated: folding it needs the flows lookup")
            flow = flows(ev.toHash)
        if snap is None:
            if not isinstance(ev, FlowStart):
                raise ValueError(f"a run's first event must be flow:start, not {ev.type}")
            snap = initial_snapshot(flow, ev)
            continue
        snap, _ = apply(flow, snap, ev, owned=True)
    if snap is None:
        raise ValueError("no events to fold")
    return snap


def own(snap: RunSnapshot) -> RunSnapshot:
    """A snapshot equal to ``snap`` whose maps are new: ``apply(..., owned=True)`` may change them."""
    return replace(
        snap, outputs=dict(snap.outputs), nodeStatus=dict(snap.nodeStatus), edgeStatus=dict(snap.edgeStatus),
        loopCounters=dict(snap.loopCounters), inbox=dict(snap.inbox), agentSessions=dict(snap.agentSessions),
        nodeRuns=dict(snap.nodeRuns), attempts=dict(snap.attempts), faults=dict(snap.faults),
        waiting=dict(snap.waiting), resumedFrom=dict(snap.resumedFrom), staged=dict(snap.staged),
        nodeCostUsd=dict(snap.nodeCostUsd),
        forEach={n: replace(fe, results=list(fe.results), running=dict(fe.running), resumedFrom=dict(fe.resumedFrom))
                 for n, fe in snap.forEach.items()},
    )


def apply(flow: CompiledFlow, snap: RunSnapshot, ev: BaseEvent, *,
          owned: bool = False) -> tuple[RunSnapshot, frozenset[str]]:
    """The next snapshot, and the node ids whose scheduling may have changed (``ALL`` for all).

    ``flow``: the run's flow as of ``ev`` (for ``flow:updated``, the flow it switches to).

    ``owned``: the caller holds the only reference to ``snap``'s maps, so they may be changed in
    place (``snap`` itself must not be used afterwards).
    """
    handler = _HANDLERS.get(type(ev))
    if handler is None:
        return replace(snap, seq=ev.seq), _NONE
    result: tuple[RunSnapshot, frozenset[str]] = handler(flow, snap, ev, owned)
    return result


_NONE: frozenset[str] = frozenset()


def _set(o: bool, d: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    out = d if o else dict(d)
    out[key] = value
    return out


def _drop(o: bool, d: dict[str, Any], *keys: str) -> dict[str, Any]:
    if o:
        for k in keys:
            d.pop(k, None)
        return d
    if not any(k in d for k in keys):
        return d
    return {k: v for k, v in d.items() if k not in keys}


def _land(s: RunSnapshot, run_id: str | None, o: bool) -> RunSnapshot:
    """The node run finished: its staged patches reach the state."""
    patches = s.staged.get(run_id or "")
    if patches is None:
        return s
    state = apply_patches(s.state, ((p.op, p.path, p.value) for p in patches))
    return replace(s, state=state, staged=_drop(o, s.staged, run_id or ""))


def _discard(s: RunSnapshot, run_ids: Iterable[str | None], o: bool) -> RunSnapshot:
    """These node runs will never finish (failed, interrupted, reset): their staged patches go."""
    gone = [r for r in run_ids if r and r in s.staged]
    return replace(s, staged=_drop(o, s.staged, *gone)) if gone else s


def _node_of_run(snap: RunSnapshot, run_id: str) -> str | None:
    for node_id, nr in snap.nodeRuns.items():
        if nr == run_id:
            return node_id
    for node_id, fe in snap.forEach.items():
        if run_id in fe.running.values():
            return node_id
    return None


def _node_start(flow: CompiledFlow, s: RunSnapshot, ev: NodeStart, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    n = ev.nodeId or ""
    run_id = ev.runId or ""
    inbox = s.inbox
    if ev.resumedFrom is not None and ev.resumedFrom in inbox:
        # What was sent to the node run this one continues (the resume message, say) is for this one now.
        inbox = _drop(o, _set(o, inbox, run_id, [*inbox.get(run_id, []), *inbox[ev.resumedFrom]]), ev.resumedFrom)
    if ev.item is not None:
        fe = s.forEach[n]
        fe = replace(fe, running=_set(o, fe.running, str(ev.item), run_id),
                     resumedFrom=_drop(o, fe.resumedFrom, str(ev.item)))
        return replace(s, seq=ev.seq, forEach=_set(o, s.forEach, n, fe), inbox=inbox), frozenset({n})
    # A plain node that starts changes no other node's prospects; a forEach group must start its items.
    return replace(
        s, seq=ev.seq, nodeStatus=_set(o, s.nodeStatus, n, "running"), nodeRuns=_set(o, s.nodeRuns, n, run_id),
        attempts=_set(o, s.attempts, n, ev.attempt), inbox=inbox, waiting=_drop(o, s.waiting, n),
        resumedFrom=_drop(o, s.resumedFrom, n),
    ), frozenset({n}) if n in s.forEach else _NONE


def _item_result(s: RunSnapshot, n: str, item: int, result: ItemResult, o: bool,
                 failed_run: str | None = None) -> RunSnapshot:
    fe = s.forEach[n]
    if o:  # the shell's own snapshot: one slot changes, not a copy of 20,000
        fe.results[item] = result
        fe.running.pop(str(item), None)
        if failed_run is not None:  # a retry of the item continues this node run
            fe.resumedFrom[str(item)] = failed_run
        return s
    results = list(fe.results)
    results[item] = result
    resumed = fe.resumedFrom
    if failed_run is not None:  # a retry of the item continues this node run
        resumed = _set(o, resumed, str(item), failed_run)
    fe = ForEachState(items=fe.items, results=results, running=_drop(o, fe.running, str(item)), resumedFrom=resumed)
    return replace(s, forEach=_set(o, s.forEach, n, fe))


def _node_complete(flow: CompiledFlow, s: RunSnapshot, ev: NodeComplete, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    n = ev.nodeId or ""
    if s.staged:
        s = _land(s, ev.runId, o)
    if ev.item is not None:
        s = _item_result(s, n, ev.item, ItemResult(item=s.forEach[n].items[ev.item], output=ev.output), o)
        return replace(s, seq=ev.seq, inbox=_drop(o, s.inbox, ev.runId or "")), frozenset({n})
    return replace(
        s, seq=ev.seq, nodeStatus=_set(o, s.nodeStatus, n, "done"), outputs=_set(o, s.outputs, n, ev.output),
        inbox=_drop(o, s.inbox, ev.runId or ""), faults=_drop(o, s.faults, n), waiting=_drop(o, s.waiting, n),
        forEach=_drop(o, s.forEach, n),
    ), frozenset({n})


def _node_error(flow: CompiledFlow, s: RunSnapshot, ev: NodeError, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    n = ev.nodeId or ""
    if s.staged:
        s = _discard(s, [ev.runId], o)  # a failed attempt leaves the state as it found it
    if ev.willRetry:
        return replace(s, seq=ev.seq), frozenset()
    if ev.item is not None:
        s = _item_result(s, n, ev.item, ItemResult(item=s.forEach[n].items[ev.item], error=ev.message), o,
                         failed_run=ev.runId)
        return replace(s, seq=ev.seq, inbox=_drop(o, s.inbox, ev.runId or "")), frozenset({n})
    fault = NodeFault(errorType=ev.errorType, message=ev.message, runId=ev.runId, details=ev.details)
    return replace(
        s, seq=ev.seq, nodeStatus=_set(o, s.nodeStatus, n, "failed"), faults=_set(o, s.faults, n, fault),
        inbox=_drop(o, s.inbox, ev.runId or ""), waiting=_drop(o, s.waiting, n),
    ), frozenset({n})


def _node_skipped(flow: CompiledFlow, s: RunSnapshot, ev: NodeSkipped, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    n = ev.nodeId or ""
    if ev.item is not None:
        s = _item_result(s, n, ev.item, ItemResult(item=s.forEach[n].items[ev.item], skipped=True), o)
        return replace(s, seq=ev.seq), frozenset({n})
    return replace(s, seq=ev.seq, nodeStatus=_set(o, s.nodeStatus, n, "skipped")), frozenset({n})


def _node_waiting(flow: CompiledFlow, s: RunSnapshot, ev: NodeWaiting, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    n = ev.nodeId or ""
    if s.staged:
        s = _land(s, ev.runId, o)  # the wait is where this node run ends; the reply starts another
    w = Waiting(runId=ev.runId or "", prompt=ev.prompt, schema=ev.schema, since=ev.cause or 0)
    return replace(s, seq=ev.seq, nodeStatus=_set(o, s.nodeStatus, n, "waiting"),
                   waiting=_set(o, s.waiting, n, w)), frozenset({n})


def _edge_fire(flow: CompiledFlow, s: RunSnapshot, ev: EdgeFire, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    for_each = s.forEach
    if ev.items is not None:
        for_each = _set(o, for_each, ev.to, ForEachState(items=ev.items, results=[None] * len(ev.items)))
    # Only the target's prospects change: ``decide`` settles all of a node's edges at once.
    return replace(s, seq=ev.seq, edgeStatus=_set(o, s.edgeStatus, ev.edgeId, "fired"),
                   forEach=for_each), frozenset({ev.to})


def _edge_skip(flow: CompiledFlow, s: RunSnapshot, ev: EdgeSkip, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    return replace(s, seq=ev.seq, edgeStatus=_set(o, s.edgeStatus, ev.edgeId, "skipped")), frozenset({ev.to})


def _loop_iterate(flow: CompiledFlow, s: RunSnapshot, ev: LoopIterate, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    reset = flow.reset_sets[ev.edgeId]
    if s.staged:  # node runs cancelled by the reset never finish
        s = _discard(s, [*(s.nodeRuns.get(n) for n in reset),
                         *(r for n in reset if n in s.forEach for r in s.forEach[n].running.values())], o)
    node_status = dict(s.nodeStatus)
    edge_status = dict(s.edgeStatus)
    for n in reset:
        node_status[n] = "pending"
        for e in flow.outgoing[n]:
            edge_status[e] = "pending"
    return replace(
        s, seq=ev.seq, nodeStatus=node_status, edgeStatus=edge_status,
        loopCounters=_set(o, s.loopCounters, ev.edgeId, ev.iteration),
        forEach=_drop(o, s.forEach, *reset), faults=_drop(o, s.faults, *reset), waiting=_drop(o, s.waiting, *reset),
        attempts=_drop(o, s.attempts, *reset),
    ), frozenset({*reset, flow.edges[ev.edgeId].source})


def _loop_exhausted(flow: CompiledFlow, s: RunSnapshot, ev: LoopExhausted, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    return replace(s, seq=ev.seq), frozenset({flow.edges[ev.edgeId].source})


def _state_patch(flow: CompiledFlow, s: RunSnapshot, ev: StatePatch, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    """A staged patch waits for its node run to finish (``_land``) and is dropped if it never does, so
    a node run that runs again from the start (after a crash, a pause, a failed attempt) changes the
    state once. Other patches (of node types that continue from their own progress) apply at once. A
    rejected patch (it could not apply when it arrived) changes nothing."""
    run_id = ev.runId
    if ev.rejected is not None:
        return replace(s, seq=ev.seq), frozenset()
    if not ev.staged or run_id is None:
        return replace(s, seq=ev.seq, state=apply_patch(s.state, ev.op, ev.path, ev.value)), frozenset()
    patch = StagedPatch(op=ev.op, path=ev.path, value=ev.value)
    return replace(s, seq=ev.seq, staged=_set(o, s.staged, run_id, [*s.staged.get(run_id, ()), patch])), frozenset()


def _command(flow: CompiledFlow, s: RunSnapshot, ev: CommandReceived, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    if not ev.accepted or ev.command not in ("send", "reply") or ev.target is None:
        return replace(s, seq=ev.seq), frozenset()
    msg = InboxMessage(kind=ev.command, content=ev.content, seq=ev.seq)
    inbox = _set(o, s.inbox, ev.target, [*s.inbox.get(ev.target, []), msg])
    node = _node_of_run(s, ev.target)
    return replace(s, seq=ev.seq, inbox=inbox), frozenset({node} if node else ())


def _inbox_consumed(flow: CompiledFlow, s: RunSnapshot, ev: InboxConsumed, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    run_id = ev.runId or ""
    rest = s.inbox.get(run_id, [])[ev.count:]
    inbox = _set(o, s.inbox, run_id, rest) if rest else _drop(o, s.inbox, run_id)
    return replace(s, seq=ev.seq, inbox=inbox), frozenset()


def _flow_paused(flow: CompiledFlow, s: RunSnapshot, ev: FlowPaused, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    budget = None
    if ev.reason == "budget":
        budget = BudgetPause(nodeId=ev.nodeId, costUsd=ev.costUsd or 0.0, limitUsd=ev.limitUsd or 0.0)
    return replace(s, seq=ev.seq, status="paused", budgetPause=budget), frozenset()


def _flow_waiting(flow: CompiledFlow, s: RunSnapshot, ev: FlowWaiting, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    return replace(s, seq=ev.seq, status="waiting"), frozenset()


def _flow_complete(flow: CompiledFlow, s: RunSnapshot, ev: FlowComplete, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    return replace(s, seq=ev.seq, status=ev.status, error=ev.error), frozenset()


def _flow_resumed(flow: CompiledFlow, s: RunSnapshot, ev: FlowResumed, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    """Node runs that were running when the run stopped are interrupted: they start again, each new
    node run continuing the one it replaces (``resumedFrom``), and the resume message goes to each.
    With ``retry``, failed nodes and failed forEach items start again too, continuing their failed node
    runs, and the message goes to them as well."""
    node_status = dict(s.nodeStatus)
    resumed_from = dict(s.resumedFrom)
    inbox = dict(s.inbox)
    faults = dict(s.faults)
    attempts = dict(s.attempts)
    for_each = dict(s.forEach)
    interrupted: list[str] = []
    retried: list[str] = []
    for n, st in s.nodeStatus.items():
        if st == "running":
            fe = for_each.get(n)
            if fe is not None and fe.running:
                interrupted.extend(fe.running.values())
                for_each[n] = ForEachState(items=fe.items, results=fe.results,
                                           resumedFrom={**fe.resumedFrom, **fe.running})
            if n in s.nodeRuns and (fe is None):
                interrupted.append(s.nodeRuns[n])
                resumed_from[n] = s.nodeRuns[n]
                node_status[n] = "pending"
        elif st == "failed" and ev.retry and not flow.nodes[n].policy.continueOnError:
            node_status[n] = "pending"
            faults.pop(n, None)
            attempts.pop(n, None)
            if n in s.nodeRuns:
                resumed_from[n] = s.nodeRuns[n]
                if n not in for_each:
                    retried.append(s.nodeRuns[n])
        if ev.retry and n in for_each:
            fe = for_each[n]
            failed = [i for i, r in enumerate(fe.results) if r is not None and r.error is not UNSET]
            if failed:
                results = [None if i in failed else r for i, r in enumerate(fe.results)]
                for_each[n] = ForEachState(items=fe.items, results=results, running=fe.running,
                                           resumedFrom=fe.resumedFrom)
                retried.extend(fe.resumedFrom[str(i)] for i in failed if str(i) in fe.resumedFrom)
                if node_status[n] == "failed":
                    node_status[n] = "running"
    if ev.message is not None:
        for run_id in (*interrupted, *retried):
            inbox[run_id] = [*inbox.get(run_id, []), InboxMessage(kind="resume", content=ev.message, seq=ev.seq)]
    limits = s.costLimits
    if ev.budgetUsd is not None:
        # The new limit is for what paused the run: a node's, or (paused for anything else) the run's.
        limits = {**limits, budget_key(s): ev.budgetUsd}
    staged = {r: p for r, p in s.staged.items() if r not in interrupted} if s.staged else s.staged
    return replace(s, seq=ev.seq, status="running", staged=staged, error=None, nodeStatus=node_status,
                   resumedFrom=resumed_from, inbox=inbox, faults=faults, attempts=attempts, forEach=for_each,
                   costLimits=limits, budgetPause=None), ALL


def _flow_updated(flow: CompiledFlow, s: RunSnapshot, ev: FlowUpdated, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    """``flow`` is the new flow. Nodes and edges it adds are pending (the scheduler then decides the new
    edges out of nodes that have finished, as events); those it drops had never run nor been decided
    (``flowkernel.core.flow_update`` refuses any other update), so nothing of them is lost."""
    node_status = {n: s.nodeStatus.get(n, "pending") for n in flow.nodes}
    edge_status = {e: s.edgeStatus.get(e, "pending") for e in flow.edges}
    nodes = flow.nodes
    return replace(
        s, seq=ev.seq, flowHash=ev.toHash, nodeStatus=node_status, edgeStatus=edge_status,
        forEach={n: fe for n, fe in s.forEach.items() if n in nodes},
        loopCounters={e: c for e, c in s.loopCounters.items() if e in flow.edges},
    ), ALL


def _agent_start(flow: CompiledFlow, s: RunSnapshot, ev: AgentStart, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    return replace(s, seq=ev.seq, agentSessions=_set(o, s.agentSessions, ev.nodeId or "", ev.sessionId)), frozenset()


def _agent_usage(flow: CompiledFlow, s: RunSnapshot, ev: AgentUsage, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    # Summed in event order, so a replay adds the same floats in the same order: equal to the bit.
    usage = {k: s.usage.get(k, 0) + int(ev.usage.get(k, 0)) for k in USAGE_KEYS}
    node = ev.nodeId or ""
    node_cost = _set(o, s.nodeCostUsd, node, s.nodeCostUsd.get(node, 0.0) + ev.costUsd)
    return replace(s, seq=ev.seq, usage=usage, totalCostUsd=s.totalCostUsd + ev.costUsd,
                   nodeCostUsd=node_cost), frozenset()


def _flow_start(flow: CompiledFlow, s: RunSnapshot, ev: FlowStart, o: bool) -> tuple[RunSnapshot, frozenset[str]]:
    return initial_snapshot(flow, ev), ALL


_HANDLERS: dict[type[BaseEvent], Any] = {
    FlowStart: _flow_start, FlowPaused: _flow_paused, FlowResumed: _flow_resumed, FlowWaiting: _flow_waiting,
    FlowComplete: _flow_complete, FlowUpdated: _flow_updated, NodeStart: _node_start, NodeComplete: _node_complete, NodeError: _node_error,
    NodeSkipped: _node_skipped, NodeWaiting: _node_waiting, EdgeFire: _edge_fire, EdgeSkip: _edge_skip,
    LoopIterate: _loop_iterate, LoopExhausted: _loop_exhausted, StatePatch: _state_patch,
    CommandReceived: _command, InboxConsumed: _inbox_consumed, AgentStart: _agent_start,
    AgentUsage: _agent_usage,
}
