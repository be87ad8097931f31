"""Reads of runs: snapshots (now or after any event), events and pages of them, run lists and
summaries, agent conversations, and following a run's log. They take no lease and execute nothing:
the server serves them from any process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import Event, FlowStart, decode, event_type
from flowkernel.core.reducer import fold, initial_snapshot
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.errors import InvalidInputError
from flowkernel.run.flow_cache import FlowCache
from flowkernel.run.gc_pause import collector_paused
from flowkernel.run.leases import Leases
from flowkernel.run.loop import COMMAND_POLL_S
from flowkernel.store.base import AgentRun, RunRecord, Store
from flowkernel.store.checkpoint import decode_checkpoint
from msgspec.structs import replace

if TYPE_CHECKING:
    from flowkernel.history.conversations import Page
    from flowkernel.history.summaries import RunSummary

ENDED = frozenset({"completed", "failed", "aborted"})  # the statuses a run's flow:complete leaves


class Reads:
    """What a run's store says of it (``executing_here``: whether this process executes a run now)."""

    def __init__(self, store: Store, flows: FlowCache, leases: Leases,
                 executing_here: Callable[[str], bool]) -> None:
        self.store, self.flows, self.leases = store, flows, leases
        self._executing_here = executing_here

    def snapshot(self, run_id: str, at: int | None = None) -> RunSnapshot:
        """The run's snapshot now, or as it was right after event ``at``. A queued run's is the
        snapshot it will start from, with status ``queued`` and seq 0."""
        if at is not None:
            self.check_seq(run_id, at)
        return self.load_snapshot(run_id, at)[0]

    def load_snapshot(self, run_id: str, at: int | None = None) -> tuple[RunSnapshot, int]:
        """``snapshot``, and the size of the stored checkpoint it starts from (0: none)."""
        record = self.store.get_run(run_id)
        flows = self.flows.lookup(record)
        with collector_paused():
            checkpoint = self.store.read_checkpoint(run_id, at_most=at)
            if checkpoint is None:
                events = self.events(run_id, until=at)
                if not events:
                    return self.queued_snapshot(self.flows.of_run(run_id), record), 0
                # Folded from the flow the run started with: a later flow:updated switches it.
                return fold(flows(getattr(events[0], "flowHash", record.flowHash)), events, flows=flows), 0
            seq, skeleton = checkpoint
            snap = decode_checkpoint(skeleton, self.store.read_blobs)
            return (fold(flows(snap.flowHash), self.events(run_id, after=seq, until=at), snap, flows=flows),
                    len(skeleton))

    def check_seq(self, run_id: str, at: int) -> None:
        """Raise InvalidInputError unless ``at`` is the seq of one of the run's events."""
        last = self.store.get_run(run_id).seq
        if not 1 <= at <= last:
            raise InvalidInputError(f"run {run_id}: there is no event {at}; its events are 1 to {last}")

    @staticmethod
    def queued_snapshot(flow: CompiledFlow, record: RunRecord) -> RunSnapshot:
        # A queued run has no event yet: this ``flow:start`` (seq 0) is never stored, it only gives the
        # snapshot a queued run reads as; the stored one is written when a worker starts it (``Creation``).
        start = FlowStart(seq=0, timestamp=record.createdAt, flowRunId=record.runId, flowName=flow.name,
                          flowHash=flow.hash, input=record.input, parentRunId=record.parentRunId,
                          parentNodeRunId=record.parentNodeRunId)
        return replace(initial_snapshot(flow, start), status="queued")

    def events(self, run_id: str, after: int = 0, until: int | None = None) -> list[Event]:
        """The run's events after seq ``after`` (up to ``until``), decoded."""
        if after < 0:
            raise InvalidInputError(f"run {run_id}: events after {after}: the first event is 1 (after 0)")
        return [decode(b) for b in self.store.read_events(run_id, after=after, until=until)]

    def stored_events(self, run_id: str, until: int | None = None) -> list[bytes]:
        """The run's events as stored: JSON objects, ``type`` first, for readers that decode only some."""
        return self.store.read_events(run_id, until=until)

    def event_page(self, run_id: str, *, after: int = 0, types: frozenset[str] | None = None,
                   limit: int = 100) -> tuple[list[bytes], int | None]:
        """Up to ``limit`` stored events after seq ``after`` (of the given ``types`` only), each as the
        bytes ``events --json`` prints, and the seq to pass as ``after`` for the next page (None once
        the end of the stored log is reached). Unknown runs raise ``UnknownRunError``."""
        self.store.get_run(run_id)
        out: list[bytes] = []
        seq = after
        chunk = limit if types is None else max(limit, 1000)
        while True:
            bodies = self.store.read_events(run_id, after=seq, until=seq + chunk)  # seqs are gapless
            for body in bodies:
                seq += 1
                if types is None or event_type(body) in types:
                    out.append(body)
                    if len(out) == limit:
                        return out, seq
            if len(bodies) < chunk:
                return out, None

    def runs(self, status: str | None = None, parent: str | None = None, limit: int = 1000) -> list[RunRecord]:
        """Up to ``limit`` stored runs (of ``status``, children of ``parent``)."""
        return self.store.list_runs(status=status, parent=parent, limit=limit)

    def summary(self, run_id: str) -> RunSummary:
        """The run's ``RunSummary``: status, times, and usage and cost with its child runs' added."""
        from flowkernel.history.summaries import summaries

        return summaries(self.store, [self.store.get_run(run_id)], self.interrupted)[0]

    def detail(self, run_id: str, at: int | None = None) -> dict[str, Any]:
        """``{run, snapshot, children, nodes}`` as ``show --json`` prints it: the run's summary and details,
        its snapshot (after event ``at``, or now), its child runs' summaries, and each node of the flow
        that snapshot follows with its type and whether it takes ``send`` messages."""
        from flowkernel.history.summaries import detail_view, summaries

        record = self.store.get_run(run_id)
        snap = self.snapshot(run_id, at=at)
        children = self.store.list_runs(parent=run_id, limit=100_000)
        [run, *kids] = summaries(self.store, [record, *children], self.interrupted)
        flow = self.flows.stored(snap.flowHash, record) if snap.flowHash else self.flows.of_run(run_id)
        takes = self.flows.message_takers(flow)
        return {"run": detail_view(record, run), "snapshot": msgspec.to_builtins(snap),
                "children": [msgspec.to_builtins(k) for k in kids],
                "nodes": {n: {"type": node.type, "takesMessages": takes(n)} for n, node in flow.nodes.items()}}

    def run_page(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                 before: int | None = None, limit: int = 50, oldest: bool = False, id_prefix: str | None = None,
                 error: str | None = None) -> tuple[list[RunSummary], int | None]:
        """A page of run summaries, newest first (``oldest``: oldest first, the order workers claim queued
        runs in), and the key to pass as ``before`` for the next page (None at the end). Runs created
        meanwhile never shift a later page: keys only grow. ``id_prefix`` and ``error`` filter as
        ``Store.page_runs`` does."""
        from flowkernel.history.summaries import summaries

        records, key = self.run_records(status=status, flow=flow, parent=parent, before=before, limit=limit,
                                        oldest=oldest, id_prefix=id_prefix, error=error)
        return summaries(self.store, records, self.interrupted), key

    def run_records(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                    before: int | None = None, limit: int = 50, oldest: bool = False,
                    id_prefix: str | None = None, error: str | None = None) -> tuple[list[RunRecord], int | None]:
        """The runs of ``run_page`` (``before`` is the key of the page before, in either order). ``status``
        is a stored status or ``interrupted`` (stored as ``running``, no process executes it: see
        ``interrupted``); ``running`` then means the runs that are executing, as their summaries say, so
        each run is listed under the status it shows."""
        def page(stored: str | None, key: int | None, size: int) -> list[RunRecord]:
            return self.store.page_runs(status=stored, flow=flow, parent=parent, limit=size, oldest=oldest,
                                        before=None if oldest else key, after=key if oldest else None,
                                        id_prefix=id_prefix, error=error)

        if status not in ("running", "interrupted"):
            records = page(status, before, limit + 1)
            return records[:limit], (records[limit - 1].runNo if len(records) > limit else None)
        wanted = status == "interrupted"
        chunk_size = max(limit + 1, 100)
        out: list[RunRecord] = []
        while True:  # told apart by their leases, not in the query: read on until the page is full
            chunk = page("running", before, chunk_size)
            for record in chunk:
                if self.interrupted(record) == wanted:
                    if len(out) == limit:
                        return out, out[-1].runNo  # one more matches: there is a next page
                    out.append(record)
            if len(chunk) < chunk_size:
                return out, None
            before = chunk[-1].runNo

    def count_runs(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                   before: int | None = None) -> int:
        """How many runs ``run_records`` lists with these filters and no limit (``before``: those after
        the page that gave this key)."""
        if status not in ("running", "interrupted"):
            return self.store.count_runs(status=status, flow=flow, parent=parent, before=before)
        count, key = 0, before
        while True:  # told apart by their leases, not in the query (runs that execute are few)
            records, key = self.run_records(status=status, flow=flow, parent=parent, before=key, limit=1000)
            count += len(records)
            if key is None:
                return count

    def messages(self, *, run_id: str | None = None, flow_run_id: str | None = None,
                 session_id: str | None = None, after: int = 0, limit: int = 100, node_id: str | None = None) -> Page:
        """A page of stored agent messages (of a node run, a run or a session); pass
        ``nextCursor`` back as ``after`` for the next page."""
        from flowkernel.history.conversations import list_messages

        return list_messages(self.store, run_id=run_id, flow_run_id=flow_run_id, session_id=session_id,
                             after=after, limit=limit, node_id=node_id)

    def tool_calls(self, *, run_id: str | None = None, flow_run_id: str | None = None,
                   session_id: str | None = None, tool_name: str | None = None, status: str | None = None,
                   after: int = 0, limit: int = 100, node_id: str | None = None) -> Page:
        """A page of stored tool calls, filtered by tool name and status (``completed`` | ``error``)."""
        from flowkernel.history.conversations import list_tool_calls

        return list_tool_calls(self.store, run_id=run_id, flow_run_id=flow_run_id, session_id=session_id,
                               tool_name=tool_name, status=status, after=after, limit=limit, node_id=node_id)

    def agent_run_page(self, *, run_id: str | None = None, status: str | None = None, agent_id: str | None = None,
                       parent_run_id: str | None = None, before: int | None = None,
                       limit: int = 50) -> tuple[list[AgentRun], int | None]:
        """A page of agent runs (node runs of agent nodes), newest first, and the key to pass as
        ``before`` for the next page (None at the end)."""
        found = self.store.list_agent_runs(run_id=run_id, status=status, agent_id=agent_id,
                                           parent_run_id=parent_run_id, before=before, limit=limit + 1)
        more = len(found) > limit
        found = found[:limit]
        return [r for _, r in found], (found[-1][0] if more and found else None)

    def agent_run(self, agent_run_id: str, run_id: str | None = None) -> AgentRun | None:
        """One agent run by its node run id. A fork copies the node runs of the history it replays,
        ids and all: without ``run_id``, the one of the run that executed it first."""
        found = self.store.list_agent_runs(agent_run_id=agent_run_id, run_id=run_id, limit=2**31)
        return found[-1][1] if found else None

    async def follow(self, run_id: str, after: int = 0, poll_s: float = COMMAND_POLL_S) -> AsyncIterator[Event]:
        """Yield the run's events as they are stored (from ``after``), until the run ends (its
        ``flow:complete``): through waits and pauses, whichever process executes it meanwhile."""
        seq = after
        while True:
            stopped = self.store.get_run(run_id).status in ENDED
            # Read after the status: the commit that stops a run carries its last events.
            batch = self.events(run_id, after=seq)
            for ev in batch:
                seq = ev.seq
                yield ev
            if stopped:
                return
            if not batch:
                await anyio.sleep(poll_s)

    def interrupted(self, record: RunRecord) -> bool:
        """Whether the run is ``running`` with no process executing it (its executor was killed, or
        stopped by Ctrl-C): it shows as ``interrupted``, and ``resume`` continues it. The stored status
        stays ``running``: this is read from the lease, which a dead executor no longer holds. A pooled
        run without one is not: a worker claims it (DESIGN §11)."""
        return record.status == "running" and not record.pooled and not self.executed(record)

    def executed(self, record: RunRecord) -> bool:
        """Whether a live process (this one or another) executes the run now."""
        return self._executing_here(record.runId) or self.leases.held(record)
