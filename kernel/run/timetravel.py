"""Time travel over stored runs: re-execute a run from its own recording (``rerun``) and start a new
run from the snapshot after any event (``fork``).

``rerun`` turns a run into a regression test: the flow as it is *now* runs again, in memory, with the
run's own model calls as fixtures (``flowkernel.fixtures``) and its human replies given back in
order; the report names the first point where the two executions part (a changed prompt, an extra
or missing model call, a different edge decision, another output) or says they match.

``fork`` copies the run's events up to SEQ (and the agent conversations as they were then) into a new
run whose ``flow:start`` records ``forkedFrom`` and ``forkedAt``, so the fork's own log folds to its
own snapshot and both runs stay inspectable. Interrupted node runs continue as after a resume.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from flowkernel.core.events import (
    AgentError,
    AgentStart,
    AgentTool,
    BaseEvent,
    CommandReceived,
    EdgeFire,
    Event,
    FlowComplete,
    FlowResumed,
    FlowStart,
    LoopIterate,
    NodeComplete,
    NodeError,
    NodeStart,
    NodeWaiting,
    RerunDivergence,
    RerunOutcome,
    decode,
    encode,
    to_dict,
)
from flowkernel.core.reducer import fold
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.errors import FlowkernelError, InvalidInputError, LeaseLostError, StoreError
from flowkernel.history.agent_runs import fold_agent_runs
from flowkernel.ids import new_run_id
from flowkernel.run.append import Appender
from flowkernel.run.settings import RunSettings
from flowkernel.store.base import EventRow, Lease, RunRecord, RunTotals, Store
from flowkernel.store.checkpoint import encode_checkpoint

if TYPE_CHECKING:
    from flowkernel.core.compiler import CompiledFlow
    from flowkernel.run.kernel import Kernel

_ID = re.compile(r"\b(run|nr|ses)_[0-9a-z]{20}")
_VOLATILE_KEYS = frozenset({"seq", "timestamp", "flowRunId", "runId", "cause", "durationMs", "resumedFrom",
                            "rerun"})
# Bookkeeping of how a run was driven (commands, resumes), not what it did.
_IGNORED = frozenset({"flow:start", "flow:resumed", "flow:paused", "flow:waiting", "command:received",
                      "inbox:consumed"})


def comparable(ev: BaseEvent) -> dict[str, Any]:
    """The event without what differs between two executions of the same thing: seq, timestamps,
    durations, run / node-run / session ids."""
    d = {k: v for k, v in to_dict(ev).items() if k not in _VOLATILE_KEYS}
    result: dict[str, Any] = json.loads(_ID.sub(lambda m: f"{m.group(1)}_*", json.dumps(d, sort_keys=True)))
    return result


def _tool_use_id(ev: Event) -> str | None:
    """The tool call an agent event reports on (``agent:tool``, or its ``error_tool_use``), if any."""
    if isinstance(ev, AgentTool):
        return ev.toolUseId
    if isinstance(ev, AgentError) and isinstance(ev.details, dict):
        use_id = ev.details.get("toolUseId")
        return use_id if isinstance(use_id, str) else None
    return None


def _lanes(events: list[Event]) -> dict[tuple[str, ...], list[Event]]:
    """Events grouped by what orders them: one node (and forEach item), one tool call, one edge, or
    the run.

    Across node runs events may interleave differently in two executions; within a lane they may not.
    The tool calls of one model turn run concurrently, so each has a lane of its own: they may finish
    in either order (the model's ids for them come from the same recorded answer in both executions).
    """
    item_of: dict[str, int | None] = {}
    lanes: dict[tuple[str, ...], list[Event]] = {}
    for ev in events:
        if ev.type in _IGNORED:
            continue
        if isinstance(ev, NodeStart) and ev.runId:
            item_of[ev.runId] = ev.item
        edge = getattr(ev, "edgeId", None)
        if edge is not None:
            key: tuple[str, ...] = ("edge", edge)
        elif ev.nodeId is not None:
            item = getattr(ev, "item", None)
            if item is None and ev.runId:
                item = item_of.get(ev.runId)
            key = ("node", ev.nodeId, "" if item is None else str(item))
            use_id = _tool_use_id(ev)
            if use_id is not None:
                key = (*key, use_id)
        else:
            key = ("run",)
        lanes.setdefault(key, []).append(ev)
    return lanes


@dataclass(frozen=True, slots=True)
class Divergence:
    kind: str  # request | extra_call | missing_call | event | extra_event | missing_event
    message: str
    seq: int | None = None  # where, in the recorded run


@dataclass(slots=True)
class RerunReport:
    run_id: str
    rerun_id: str
    snapshot: RunSnapshot
    divergence: Divergence | None
    replay: Store  # the in-memory store the re-execution ran on: its events, messages and tool calls

    @property
    def matches(self) -> bool:
        return self.divergence is None

    def describe(self) -> str:
        if self.divergence is None:
            return (f"run {self.run_id}: the re-execution matches the recording "
                    f"({self.snapshot.status}, same events and outputs)")
        where = f" at seq {self.divergence.seq}" if self.divergence.seq is not None else ""
        return f"run {self.run_id}: diverges{where} ({self.divergence.kind}): {self.divergence.message}"


def _brief(ev: Event) -> str:
    d = comparable(ev)
    d.pop("type", None)
    text = json.dumps(d, ensure_ascii=False, sort_keys=True)
    return f"{ev.type} {text if len(text) <= 300 else text[:299] + '…'}"


def first_divergence(recorded: list[Event], rerun: list[Event]) -> Divergence | None:
    """The earliest (in the recorded log) event where the two executions differ, or None."""
    a, b = _lanes(recorded), _lanes(rerun)
    best: tuple[float, Divergence] | None = None
    for key in [*a, *(k for k in b if k not in a)]:
        xs, ys = a.get(key, []), b.get(key, [])
        for i in range(max(len(xs), len(ys))):
            x = xs[i] if i < len(xs) else None
            y = ys[i] if i < len(ys) else None
            if x is not None and y is not None and comparable(x) == comparable(y):
                continue
            at = float(x.seq) if x is not None else (xs[-1].seq + 0.5 if xs else float("inf"))
            div = _explain(key, x, y, ys[i:])
            if best is None or at < best[0]:
                best = (at, div)
            break
    return best[1] if best else None


def _explain(key: tuple[str, ...], x: Event | None, y: Event | None, rest: list[Event]) -> Divergence:
    seq = x.seq if x is not None else None
    who = key[1] + (f"[{key[2]}]" if len(key) > 2 and key[2] else "") if len(key) > 1 else "the run"
    if len(key) > 3:
        who += f" tool call {key[3]}"
    for ev in rest:  # a changed node input shows first, but the model call it changes says more
        if isinstance(ev, NodeError) and ev.errorType in ("fixture_mismatch", "fixture_missing"):
            kind = "request" if ev.errorType == "fixture_mismatch" else "extra_call"
            return Divergence(kind, ev.message, seq)
    if x is None and y is not None:
        return Divergence("extra_event", f"{who}: the re-execution has an extra event: {_brief(y)}", seq)
    if y is None and x is not None:
        return Divergence("missing_event", f"{who}: the re-execution lacks the recorded event: {_brief(x)}", seq)
    assert x is not None and y is not None
    return Divergence("event", f"{who}: recorded {_brief(x)}\n  but the re-execution has {_brief(y)}", seq)


def _recorded_replies(events: list[Event]) -> dict[str, list[Any]]:
    """Accepted replies and messages of the run, per node id (and item), in order."""
    node_of: dict[str, str] = {}
    out: dict[str, list[Any]] = {}
    for ev in events:
        if isinstance(ev, NodeStart) and ev.runId:
            node_of[ev.runId] = f"{ev.nodeId}" if ev.item is None else f"{ev.nodeId}[{ev.item}]"
        elif isinstance(ev, CommandReceived) and ev.accepted and ev.command == "reply" and ev.target:
            out.setdefault(node_of.get(ev.target, ""), []).append(ev.content)
    return out


async def rerun(kernel: Kernel, run_id: str, *, flow: CompiledFlow | None = None,
                on_event: Callable[[BaseEvent], None] | None = None, rerun_id: str | None = None) -> RerunReport:
    """Execute ``run_id``'s flow again (the file as it is now, else the stored definition) on an
    in-memory store, from the run's own recorded model calls and replies; report the first divergence.
    ``rerun_id``: the id the re-execution runs under (``execute_rerun`` stores it under that id)."""
    from flowkernel.fixtures import MockQuery, fixtures_from_run, write_fixtures
    from flowkernel.run.kernel import Kernel as KernelClass
    from flowkernel.store.memory import MemoryStore

    record = kernel.store.get_run(run_id)
    kernel.load_plugins_of(run_id)  # the flow may name the functions and tools of the run's plugins
    if flow is None:
        flow = _current_flow(kernel, record)
    recorded = kernel.events(run_id)
    with tempfile.TemporaryDirectory(prefix="flowkernel-rerun-") as tmp:
        write_fixtures(fixtures_from_run(kernel.store, run_id, node_types=kernel.registry.node_types,
                                         tools=kernel.registry.tools), tmp)
        mock = MockQuery(tmp)
        services = msgspec.structs.replace(kernel.services, query_fn=mock)
        replay = KernelClass(MemoryStore(), registry=kernel.registry, services=services, tuning=kernel.tuning)
        snap = await replay.run(flow, record.input, on_event=on_event, run_id=rerun_id)
        replies = _recorded_replies(recorded)
        while snap.status == "waiting":
            delivered = False
            for node, waiting in sorted(snap.waiting.items()):
                queue = replies.get(node, [])
                if queue:
                    snap = await replay.reply(snap.runId, waiting.runId, queue.pop(0), on_event=on_event)
                    delivered = True
                    break
            if not delivered:
                break
        again = replay.events(snap.runId)
        divergence = first_divergence(recorded, again)
        if divergence is None:
            unused = mock.unused()
            if unused:
                node, call = unused[0]
                item = "" if call.item is None else f" item {call.item}"
                divergence = Divergence("missing_call", f"node {node!r}{item}: recorded model call "
                                        f"calls[{call.index}] was not made by the re-execution")
        return RerunReport(run_id=run_id, rerun_id=snap.runId, snapshot=snap, divergence=divergence,
                           replay=replay.store)


def is_rerun(record: RunRecord) -> bool:
    """Whether ``record`` is a rerun ``create_rerun`` queued (``execute_rerun`` executes it)."""
    return RunSettings.from_json(record.settings).rerunOf is not None


def create_rerun(kernel: Kernel, run_id: str) -> str:
    """Queue a rerun of ``run_id`` for the workers (``POST /runs/{id}/rerun``); returns its id. A worker
    executes it with ``execute_rerun``: ``rerun`` itself, kept as a run of the store."""
    record = kernel.store.get_run(run_id)
    if record.seq == 0:
        raise InvalidInputError(f"run {run_id} has not started: there is no recording to rerun yet")
    kernel.load_plugins_of(run_id)
    flow = _current_flow(kernel, record)
    plugins = RunSettings.from_json(record.settings).plugins
    return kernel.enqueue(flow, record.input, settings=RunSettings(plugins=plugins, rerunOf=run_id))


async def execute_rerun(kernel: Kernel, rerun_id: str, lease: Lease) -> RunSnapshot:
    """Execute the rerun ``create_rerun`` queued, under the worker's ``lease``: ``rerun`` in memory under
    its id, then its whole log stored at once, its messages and tool calls with it. Its ``flow:start``
    names the run it replays (``rerunOf``) and its ``flow:complete`` carries the verdict (``rerun``); a
    re-execution that stops before the end (waiting for a reply the recording does not have, paused) is
    ended there, ``aborted``: a rerun does not go on past its recording."""
    record = kernel.store.get_run(rerun_id)
    of = RunSettings.from_json(record.settings).rerunOf
    assert of is not None
    try:
        report = await rerun(kernel, of, flow=kernel.flow_of(rerun_id), rerun_id=rerun_id)
    except (StoreError, LeaseLostError):
        with contextlib.suppress(FlowkernelError):
            kernel.store.release_lease(rerun_id, lease)
        raise
    except Exception as exc:  # the recording is gone, the flow cannot be loaded here: the rerun ends failed
        try:
            failure = kernel.fail_to_start(rerun_id, exc, lease)
        finally:
            with contextlib.suppress(FlowkernelError):
                kernel.store.release_lease(rerun_id, lease)
        raise failure from None
    events = [decode(body) for body in report.replay.read_events(rerun_id)]
    d = report.divergence
    verdict = RerunOutcome(of=of, matches=d is None,
                           divergence=None if d is None else RerunDivergence(kind=d.kind, message=d.message, seq=d.seq))
    # The log is the one the re-execution appended in memory, copied: its events keep their seq and
    # timestamp; its first and last are annotated (what it replays, the verdict) before they are stored.
    first, last = events[0], events[-1]
    if isinstance(first, FlowStart):
        first.rerunOf = of
    if isinstance(last, FlowComplete):
        last.rerun = verdict
    flows = kernel.flows_of(record)
    started = first.flowHash if isinstance(first, FlowStart) else record.flowHash
    snap = fold(flows(started), events, flows=flows)
    rows: list[EventRow] = [(e.seq, e.timestamp, encode(e)) for e in events]
    if not isinstance(last, FlowComplete):  # a new event, appended as every event is
        end = Appender(flows(snap.flowHash), snap, agents=None, flows=flows)
        ended, _, _ = end.append(FlowComplete(status="aborted", rerun=verdict,
                                              error=f"a rerun ends where its recording does: the re-execution "
                                                    f"stopped {report.snapshot.status} here"))
        assert isinstance(ended, FlowComplete)
        events.append(ended)
        rows += end.rows
        snap = end.snap
    _copy_history(report.replay, kernel.store, rerun_id)  # before the commit: a reader of its end finds them
    skeleton, blobs = encode_checkpoint(snap)
    kernel.store.commit(rerun_id, rows, snap.status, snap.seq,
                        snap.error, skeleton, blobs, lease=lease, release=True,
                        totals=RunTotals(usage=dict(snap.usage), totalCostUsd=snap.totalCostUsd),
                        agent_runs=fold_agent_runs(flows(started), events, flows=flows,
                                                  agent_types=kernel.registry))
    return snap


def _copy_history(source: Store, target: Store, run_id: str) -> None:
    """The agent messages and tool calls of ``run_id`` in ``source``, added to ``target``."""
    for lister, adder in ((source.list_agent_messages, target.add_agent_message),
                          (source.list_tool_calls, target.add_tool_call)):
        after = 0
        while True:
            page = lister(flow_run_id=run_id, after=after, limit=1000)
            for row in page:
                adder({k: v for k, v in row.items() if k != "id"})
            if len(page) < 1000:
                break
            after = int(page[-1]["id"])


def _current_flow(kernel: Kernel, record: RunRecord) -> CompiledFlow:
    from pathlib import Path

    if record.flowSource and Path(record.flowSource).is_file():
        return kernel.load_flow(record.flowSource)
    return kernel.flow_of(record.runId)


def create_fork(kernel: Kernel, run_id: str, at: int, *, input: dict[str, Any] | None = None,
                pooled: bool = False) -> str:
    """Store a new run holding ``run_id``'s history up to event ``at``; returns its id (nothing runs yet).

    ``input`` replaces keys of the run input from here on (nodes already finished keep their outputs).
    Agent conversations are copied as they stood at ``at``, so agents continue where they were.
    ``pooled``: the workers' to execute (``queue_fork``); it is created leased to ``kernel``, so none
    takes it before it is handed to them.
    """
    kernel.check_seq(run_id, at)
    record = kernel.store.get_run(run_id)
    flow = kernel.flow_of(run_id)  # a fired edge keeps its kind through an update: the current flow tells
    flows = kernel.flows_of(record)
    events = kernel.events(run_id, until=at + 1)
    if len(events) > at and _loop_fire(flow, events[at - 1]) and isinstance(events[at], LoopIterate):
        # A loop edge's edge:fire and its loop:iterate are one transition (committed together): a
        # fork between them would have a fired loop edge that never resets its loop.
        at += 1
    events = events[:at]
    first = events[0]
    started = first.flowHash if isinstance(first, FlowStart) else record.flowHash
    value = record.input
    if input:
        if not isinstance(value, dict):
            raise InvalidInputError(f"fork {run_id}: the run input is not an object; --input cannot change it")
        value = {**value, **input}
    fork_id = new_run_id()
    old, new = run_id.removeprefix("run_"), fork_id.removeprefix("run_")
    start, first_row = Appender.first(FlowStart(flowName=record.flowName, flowHash=started, input=value,
                                                forkedFrom=run_id, forkedAt=at), fork_id)
    rows: list[EventRow] = [first_row]
    copied: list[Event] = [start]
    finished: set[str] = set()
    # The rest are copies of events the original run stamped and applied: they keep their seq and
    # timestamp (the fork's history is the original's), so they are re-encoded under the fork's id, not
    # appended (``Appender.append`` would stamp them anew); the fold below makes the fork's snapshot.
    for ev in events[1:]:
        body = encode(ev).replace(f"ses_{old}".encode(), f"ses_{new}".encode())
        copy = decode(body)
        copy.flowRunId = fork_id
        body = encode(copy)
        copied.append(copy)
        rows.append((copy.seq, copy.timestamp, body))
        if isinstance(copy, NodeComplete | NodeError | NodeWaiting) and copy.runId:
            finished.add(copy.runId)
    snap = fold(flows(started), copied, flows=flows)
    # Against the flow the run followed at ``at`` (a later flow:updated is not part of the fork's history).
    kernel.check_input(flows(snap.flowHash), value)
    cutoff = events[-1].timestamp
    fork_record = RunRecord(runId=fork_id, flowName=record.flowName, flowHash=snap.flowHash, status=snap.status,
                            seq=snap.seq, input=value, createdAt=start.timestamp, updatedAt=start.timestamp,
                            error=snap.error, forkedFrom=run_id, forkedAt=at, flowSource=record.flowSource,
                            usage=snap.usage, totalCostUsd=snap.totalCostUsd, settings=record.settings,
                            pooled=pooled, leaseOwner=kernel.owner if pooled else None,
                            leaseExpiresAt=start.timestamp + kernel.lease_ttl_ms if pooled else None,
                            leaseEpoch=1 if pooled else 0)
    skeleton, blobs = encode_checkpoint(snap)
    kernel.store.create_run(fork_record, rows, skeleton, blobs,
                            agent_runs=fold_agent_runs(flows(started), copied, flows=flows,
                                                       agent_types=kernel.registry))
    _copy_conversations(kernel, run_id, fork_id, finished, cutoff, {e.runId for e in copied
                                                                    if isinstance(e, AgentStart) and e.runId})
    return fork_id


def _loop_fire(flow: CompiledFlow, ev: Event) -> bool:
    return isinstance(ev, EdgeFire) and ev.edgeId in flow.edges and flow.edges[ev.edgeId].is_loop


def _copy_conversations(kernel: Kernel, run_id: str, fork_id: str, finished: set[str], cutoff: int,
                        started: set[str]) -> None:
    old, new = f"ses_{run_id.removeprefix('run_')}", f"ses_{fork_id.removeprefix('run_')}"

    def keep(row: dict[str, Any]) -> bool:
        # Rows of node runs finished by the cut are all in; of runs still going, those written by then.
        return row["runId"] in finished or (row["runId"] in started and int(row["createdAt"]) <= cutoff)

    def moved(row: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in row.items() if k != "id"}
        out["flowRunId"] = fork_id
        out["sessionId"] = str(row["sessionId"]).replace(old, new)
        return out

    store = kernel.store
    for lister, adder in ((store.list_agent_messages, store.add_agent_message),
                          (store.list_tool_calls, store.add_tool_call)):
        after = 0
        while True:
            page = lister(flow_run_id=run_id, after=after, limit=1000)
            for row in page:
                if keep(row):
                    adder(moved(row))
            if len(page) < 1000:
                break
            after = int(page[-1]["id"])


async def fork(kernel: Kernel, run_id: str, at: int, *, input: dict[str, Any] | None = None,
               on_event: Callable[[BaseEvent], None] | None = None) -> RunSnapshot:
    """``create_fork`` and execute the fork until it stops."""
    fork_id = create_fork(kernel, run_id, at, input=input)
    if on_event is not None:
        for ev in kernel.events(fork_id):
            on_event(ev)
    return await kernel.execute(fork_id, on_event=on_event, first=[FlowResumed(message=None)])


def queue_fork(kernel: Kernel, run_id: str, at: int, *, input: dict[str, Any] | None = None) -> str:
    """``create_fork``, then handed to the workers with the ``flow:resumed`` that ``fork`` starts it with
    (``POST /runs/{id}/fork``); returns its id."""
    fork_id = create_fork(kernel, run_id, at, input=input, pooled=True)
    kernel.hand_to_pool(fork_id, lambda snap: [FlowResumed(message=None)])
    return fork_id
