"""The Python API: load flows, start runs, follow their events, command and resume them.

The CLI is a thin layer over this module::

    kernel = Kernel("runs.db")
    flow = kernel.load_flow("flows/hello.json")
    snapshot = anyio.run(kernel.run, flow, {"name": "Ada"})
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
import msgspec
from flowkernel.core.budgets import run_limit
from flowkernel.core.commands import Command, CommandOutcome, judge_command, unstorable_at
from flowkernel.core.compiler import CompiledFlow, compile_flow
from flowkernel.core.events import (
    BaseEvent,
    CommandReceived,
    Event,
    FlowComplete,
    FlowPaused,
    FlowResumed,
    FlowStart,
    FlowUpdated,
    decode,
    encode,
    encoder,
)
from flowkernel.core.nesting import MAX_DEPTH
from flowkernel.core.node_context import ChildRuns
from flowkernel.core.nonfinite import loads_strict
from flowkernel.core.reducer import FlowLookup, fold, initial_snapshot
from flowkernel.core.services import RunServices
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.errors import (
    CommandRejectedError,
    FlowkernelError,
    FlowUpdateError,
    InvalidInputError,
    KernelFault,
    LeaseLostError,
    PatternTimeoutError,
    RunBusyError,
    RunInputError,
    StoreError,
)
from flowkernel.flowfiles.load import load_flow
from flowkernel.flowfiles.tree import first_unavailable
from flowkernel.history.agent_runs import AgentRunBackfill
from flowkernel.ids import new_run_id, now_ms
from flowkernel.plugins.registry import Registry, default_registry
from flowkernel.run.append import append_now
from flowkernel.run.children import KernelChildren
from flowkernel.run.committer import Committer
from flowkernel.run.gc_pause import collector_paused
from flowkernel.run.loop import COMMAND_POLL_S, EventListener, RunExecution
from flowkernel.run.node_context import ShellNodeContext
from flowkernel.run.settings import RunSettings, import_plugins
from flowkernel.run.setup import query_for, services_of
from flowkernel.run.tuning import Tuning
from flowkernel.store.base import AgentRun, CreateRequest, EventRow, Lease, RunRecord, Store
from flowkernel.store.checkpoint import decode_checkpoint, encode_checkpoint
from flowkernel.workers.defaults import DEFAULT_LEASE_S
from msgspec.structs import replace

if TYPE_CHECKING:
    from flowkernel.history.conversations import Page
    from flowkernel.history.summaries import RunSummary
from flowkernel.store.open import open_store

LEASE_TTL_MS = int(DEFAULT_LEASE_S * 1000)
ENDED = frozenset({"completed", "failed", "aborted"})  # the statuses a run's flow:complete leaves


def _owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


def owner_dead(owner: str) -> bool:
    """True if ``owner`` was a process on this host that no longer exists (so its lease is void)."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    # A zombie child still "exists" until reaped; treat it as dead.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False


class _First(NamedTuple):
    """A run's ``flow:start``: the event, its stored row, the snapshot after it and its checkpoint."""

    event: Event
    row: EventRow
    snapshot: RunSnapshot
    skeleton: bytes
    blobs: dict[str, bytes]


def _first_event(flow: CompiledFlow, run_id: str, value: Any, parent_run_id: str | None,
                 parent_node_run_id: str | None) -> _First:
    start = FlowStart(seq=1, timestamp=now_ms(), flowRunId=run_id, flowName=flow.name, flowHash=flow.hash,
                      input=value, parentRunId=parent_run_id, parentNodeRunId=parent_node_run_id)
    body = encode(start)
    first = decode(body)
    snap = initial_snapshot(flow, first)  # type: ignore[arg-type]
    # The initial state's lists and maps are the flow document's: the run gets its own.
    snap = replace(snap, state=msgspec.json.decode(msgspec.json.encode(snap.state)))
    skeleton, blobs = encode_checkpoint(snap)
    return _First(first, (1, start.timestamp, body), snap, skeleton, blobs)


class _Refused(Exception):
    """A ``before`` hook refused the command that would continue the run: record it, then raise."""

    def __init__(self, outcome: CommandOutcome) -> None:
        super().__init__(outcome.reason)
        self.outcome = outcome


class _Ready(NamedTuple):
    """A run about to execute under a lease: what ``Kernel._execute`` takes."""

    flow: CompiledFlow
    snap: RunSnapshot
    drafts: list[BaseEvent]
    checkpoint_size: int
    services: RunServices


class _Created(NamedTuple):
    """A run just stored: its id, its ``flow:start``, its snapshot and the size of its checkpoint."""

    run_id: str
    first: Event
    snapshot: RunSnapshot
    checkpoint_size: int
    lease: Lease | None


class Kernel:
    """One store, one registry, and the runs executing in this process."""

    def __init__(self, store: Store | str | None = None, *, registry: Registry | None = None,
                 services: RunServices | Mapping[str, Any] | None = None, lease_ttl_ms: int = LEASE_TTL_MS,
                 settings: RunSettings | None = None, tuning: Tuning | None = None) -> None:
        """``services``: what runs use (``RunServices``, or the documented mapping of it); ``tuning``: how
        the shell runs them. ``settings``: how this process was told to execute runs (``--fixtures``,
        ``--plugin``). Runs it creates keep them; runs it continues keep theirs, with these replacing what
        they set."""
        # A database from before agent runs were stored gets them folded from its logs as it opens.
        self.registry = registry or default_registry()
        self.store: Store = store if store is not None and not isinstance(store, str) else \
            open_store(store, backfill=AgentRunBackfill(self.registry))
        # Read (and checked) before any run is created: a bad FLOWKERNEL_EXPR_* is an input error.
        self.services, self.tuning = services_of(services, tuning)
        self.settings = settings or RunSettings()
        self._mocks: dict[str, Any] = {}
        self.owner = _owner_id()
        self.lease_ttl_ms = lease_ttl_ms
        self._executing: dict[str, RunExecution] = {}
        self._committer = Committer(self.store)  # the runs executing here share transactions
        self._flows: dict[str, CompiledFlow] = {}
        self._token_read: tuple[float, int] = (float("-inf"), 0)  # (when, value) of the last change token read

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the event loop, without arguments) after each commit of the runs this
        kernel executes: a server's event feed reads new events then, not at its next poll."""
        self._committer.on_commit.append(callback)

    # -- flows ------------------------------------------------------------------------------

    def load_flow(self, path: str | Path) -> CompiledFlow:
        """Read and validate a flow file (every problem at once, with JSON paths)."""
        reg = self.registry
        return load_flow(path, node_types=reg.node_types, functions=reg.functions, tools=reg.tools)

    def compile(self, document: dict[str, Any], source: str = "<flow>", base_dir: Path | None = None,
                *, trusted: bool = False, stored: tuple[str, str] | None = None) -> CompiledFlow:
        reg = self.registry
        return compile_flow(document, source=source, base_dir=base_dir, node_types=reg.node_types,
                            trusted=trusted, functions=reg.functions, tools=reg.tools, stored=stored)

    def flow_of(self, run_id: str) -> CompiledFlow:
        """The flow the run follows now (the last one a ``flow:updated`` switched it to, if any)."""
        record = self.store.get_run(run_id)
        return self.stored_flow(record.flowHash, record)

    def message_takers(self, flow: CompiledFlow) -> Callable[[str], bool]:
        """Whether each node of ``flow`` (by id) reads ``send`` messages, as this kernel's registry says."""
        def takes(node_id: str) -> bool:
            node = flow.nodes[node_id]
            return self.registry.takes_messages(node.type, node.raw_input)
        return takes

    def stored_flow(self, flow_hash: str, record: RunRecord) -> CompiledFlow:
        """The flow stored under ``flow_hash``, compiled; ``record``: the run it is for (where its file is)."""
        cached = self._flows.get(flow_hash)
        if cached is not None:
            return cached
        text = self.store.get_flow(flow_hash)
        source = record.flowSource or f"<flow {record.flowName}>"
        base = Path(record.flowSource).parent if record.flowSource else None
        # The hash matched when it was stored, and it was validated then: compile without re-checking,
        # and without computing again the canonical text and hash it was stored under.
        with collector_paused():
            flow = self.compile(msgspec.json.decode(text), source=source, base_dir=base, trusted=True,
                                stored=(text, flow_hash))
        self._flows[flow_hash] = flow
        return flow

    def flows_of(self, record: RunRecord) -> FlowLookup:
        """The lookup a fold of ``record``'s run switches flows with (``flow:updated``)."""
        return lambda flow_hash: self.stored_flow(flow_hash, record)

    def flow_for_run(self, run_id: str, source: str | Path | dict[str, Any]) -> CompiledFlow:
        """A flow to continue ``run_id`` on (``resume``/``retry`` with ``flow=``): a flow file's path or a
        flow document, validated with the plugins the run executes with loaded first (their functions
        and tools are names the flow may use)."""
        self.load_plugins_of(run_id)
        if isinstance(source, dict):
            return self.compile(source, source="flowDocument")
        return self.load_flow(source)

    def load_plugins_of(self, run_id: str) -> None:
        """Import the plugin modules ``run_id`` executes with (its own, and this kernel's), as an
        execution of it would: what reads its flow file again (``rerun``, ``--flow``) then knows the
        functions, tools and node types the flow names. Raises SettingUnavailableError naming a module
        that does not import here."""
        record = self.store.get_run(run_id)
        settings = RunSettings.from_json(record.settings).overridden_by(self.settings)
        import_plugins(run_id, settings)
        if settings.plugins and self.registry is not default_registry():
            self._adopt_plugins()

    @staticmethod
    def check_input(flow: CompiledFlow, value: Any) -> None:
        """Raise RunInputError if ``value`` does not satisfy the flow's ``inputs`` schema (or is not JSON
        that can be stored: text that is not UTF-8, nesting deeper than the encoder goes)."""
        found = unstorable_at(value, "input")
        if found is None:
            try:
                encoder.encode(value)
            except (TypeError, ValueError, RecursionError, msgspec.EncodeError) as exc:
                found = ("input", f"is not JSON that can be stored: {exc}")
        if found is not None:
            where, problem = found
            raise RunInputError(f"{flow.source}: {where} {problem}", [(where, problem)])
        schema = flow.inputs_schema
        if schema is None:
            return
        from flowkernel.core.jsonschemas import instance_errors

        try:
            errors = instance_errors(schema, value, schema_at="$.inputs")
        except PatternTimeoutError as exc:
            problems = [(f"input{exc.where}", str(exc))]
            raise RunInputError(f"{flow.source}: input{exc.where}: {exc}", problems) from None
        if errors:
            problems = [(f"input{where}", message) for where, message in errors]
            raise RunInputError(f"{flow.source}: run input does not match `inputs`: "
                                + "; ".join(f"{where}: {message}" for where, message in problems), problems)

    # -- runs -------------------------------------------------------------------------------

    def create_run(self, flow: CompiledFlow, input: Any = None, *, parent_run_id: str | None = None,
                   parent_node_run_id: str | None = None, run_id: str | None = None) -> str:
        """Validate the input and store a new run (``flow:start``); nothing executes yet."""
        return self._create(flow, input, parent_run_id=parent_run_id, parent_node_run_id=parent_node_run_id,
                            run_id=run_id).run_id

    def enqueue(self, flow: CompiledFlow, input: Any = None, *, run_id: str | None = None,
                idempotency_key: str | None = None, settings: RunSettings | None = None) -> str:
        """Validate the input and store a ``queued`` run for the workers (DESIGN §11); returns its id at
        once. It has no events until a worker claims it and writes its ``flow:start``. A second run
        with the same ``idempotency_key`` is refused by the store (``find_idempotent`` finds the first).
        ``settings``: the run's own (default: this kernel's)."""
        value = {} if input is None else input
        self.check_input(flow, value)
        run_id = run_id or new_run_id()
        now = now_ms()
        record = RunRecord(runId=run_id, flowName=flow.name, flowHash=flow.hash, status="queued", seq=0,
                           input=value, createdAt=now, updatedAt=now,
                           flowSource=str(Path(flow.source).resolve()) if flow.base_dir else None,
                           pooled=True, maxRuns=flow.max_concurrent_runs, idempotencyKey=idempotency_key,
                           settings=(settings or self.settings).to_json())
        self.store.create_run(record, [], b"", document=flow.canonical)
        self._flows[flow.hash] = flow
        return run_id

    def _create(self, flow: CompiledFlow, input: Any, *, parent_run_id: str | None = None,
                parent_node_run_id: str | None = None, run_id: str | None = None, leased: bool = False) -> _Created:
        """Store a new run with its flow in one transaction; ``leased``: this kernel holds its lease
        from the start (it executes the run next)."""
        created, request = self._new_run(flow, input, parent_run_id=parent_run_id,
                                         parent_node_run_id=parent_node_run_id, run_id=run_id, leased=leased)
        self.store.create_run(request.record, request.events, request.checkpoint, request.blobs,
                              document=request.document)
        self._flows[flow.hash] = flow
        return created

    def _new_run(self, flow: CompiledFlow, input: Any, *, parent_run_id: str | None = None,
                 parent_node_run_id: str | None = None, run_id: str | None = None,
                 leased: bool = False) -> tuple[_Created, CreateRequest]:
        """A new run, and what stores it (see ``_create``)."""
        value = {} if input is None else input
        self.check_input(flow, value)
        run_id = run_id or new_run_id()
        # A child run executes as its parent does.
        settings = self.store.get_run(parent_run_id).settings if parent_run_id else self.settings.to_json()
        first = _first_event(flow, run_id, value, parent_run_id, parent_node_run_id)
        record = RunRecord(runId=run_id, flowName=flow.name, flowHash=flow.hash, status="running", seq=1,
                           input=value, createdAt=first.event.timestamp, updatedAt=first.event.timestamp,
                           parentRunId=parent_run_id, parentNodeRunId=parent_node_run_id,
                           flowSource=str(Path(flow.source).resolve()) if flow.base_dir else None,
                           leaseOwner=self.owner if leased else None,
                           leaseExpiresAt=first.event.timestamp + self.lease_ttl_ms if leased else None,
                           leaseEpoch=1 if leased else 0, settings=settings)
        request = CreateRequest(record=record, events=[first.row], checkpoint=first.skeleton, blobs=first.blobs,
                                document=flow.canonical)
        return _Created(run_id, first.event, first.snapshot, len(first.skeleton),
                        Lease(self.owner, 1) if leased else None), request

    def _start(self, flow: CompiledFlow, record: RunRecord, lease: Lease) -> _Created:
        """Write the ``flow:start`` of a queued run, under the lease of the execution that starts it."""
        first = _first_event(flow, record.runId, record.input, record.parentRunId, record.parentNodeRunId)
        self.store.commit(record.runId, [first.row], "running", 1, None, first.skeleton, first.blobs, lease=lease)
        self._committer.committed()
        return _Created(record.runId, first.event, first.snapshot, len(first.skeleton), lease)

    async def run(self, flow: CompiledFlow, input: Any = None, *, on_event: EventListener | None = None,
                  run_id: str | None = None) -> RunSnapshot:
        """Create a run and execute it until it stops; returns its final snapshot."""
        run_id = run_id or new_run_id()
        services = self._services(run_id, self.settings, new=True)  # checked before anything is stored
        unavailable = first_unavailable(flow.document, flow.source, flow.base_dir, self.registry.node_types, services)
        if unavailable is not None:
            raise InvalidInputError(f"{unavailable}; nothing was run")
        created, request = self._new_run(flow, input, run_id=run_id, leased=True)
        # Created through the committer: runs started together share the transactions that store them.
        self._committer.executing += 1
        try:
            await self._committer.commit(request)
        finally:
            self._committer.executing -= 1
        self._flows[flow.hash] = flow
        if on_event is not None:
            on_event(created.first)
        # Created leased, with the snapshot in hand: nothing to take or load before executing.
        assert created.lease is not None
        return await self._execute(flow, created.snapshot, [], on_event, created.checkpoint_size, created.lease,
                                   services)

    def snapshot(self, run_id: str, at: int | None = None) -> RunSnapshot:
        """The run's snapshot now, or as it was right after event ``at``. A queued run's is the
        snapshot it will start from, with status ``queued`` and seq 0."""
        if at is not None:
            self.check_seq(run_id, at)
        return self._load_snapshot(run_id, at)[0]

    def _load_snapshot(self, run_id: str, at: int | None = None) -> tuple[RunSnapshot, int]:
        """``snapshot``, and the size of the stored checkpoint it starts from (0: none)."""
        record = self.store.get_run(run_id)
        flows = self.flows_of(record)
        with collector_paused():
            checkpoint = self.store.read_checkpoint(run_id, at_most=at)
            if checkpoint is None:
                events = self.events(run_id, until=at)
                if not events:
                    return self._queued_snapshot(self.flow_of(run_id), record), 0
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
    def _queued_snapshot(flow: CompiledFlow, record: RunRecord) -> RunSnapshot:
        start = FlowStart(seq=0, timestamp=record.createdAt, flowRunId=record.runId, flowName=flow.name,
                          flowHash=flow.hash, input=record.input, parentRunId=record.parentRunId,
                          parentNodeRunId=record.parentNodeRunId)
        return replace(initial_snapshot(flow, start), status="queued")

    def events(self, run_id: str, after: int = 0, until: int | None = None) -> list[Event]:
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
        # msgspec writes the tag first: an event's type is the start of its body, no decoding needed.
        prefixes = tuple(b'{"type":"' + t.encode() + b'"' for t in types) if types is not None else None
        out: list[bytes] = []
        seq = after
        chunk = limit if prefixes is None else max(limit, 1000)
        while True:
            bodies = self.store.read_events(run_id, after=seq, until=seq + chunk)  # seqs are gapless
            for body in bodies:
                seq += 1
                if prefixes is None or body.startswith(prefixes):
                    out.append(body)
                    if len(out) == limit:
                        return out, seq
            if len(bodies) < chunk:
                return out, None

    def runs(self, status: str | None = None, parent: str | None = None, limit: int = 1000) -> list[RunRecord]:
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
        flow = self.stored_flow(snap.flowHash, record) if snap.flowHash else self.flow_of(run_id)
        takes = self.message_takers(flow)
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

    # -- executing --------------------------------------------------------------------------

    async def execute(self, run_id: str, *, on_event: EventListener | None = None,
                      first: list[BaseEvent] | None = None,
                      before: Callable[[RunSnapshot], list[BaseEvent]] | None = None,
                      lease: Lease | None = None,
                      on_execution: Callable[[RunExecution], None] | None = None) -> RunSnapshot:
        """Take the run's lease (or use ``lease``, taken already) and execute the run from its stored
        snapshot until it stops; a queued run is started first.

        ``before`` sees the loaded snapshot and returns the first events to append (it may raise to refuse).
        """
        lease = lease or self._acquire(run_id)
        try:
            ready = self._ready(run_id, lease, on_event, first, before)
        except BaseException:
            self.store.release_lease(run_id, lease)
            raise
        return await self._go(ready, lease, on_event, on_execution)

    def _ready(self, run_id: str, lease: Lease, on_event: EventListener | None, first: list[BaseEvent] | None,
               before: Callable[[RunSnapshot], list[BaseEvent]] | None) -> _Ready | RunSnapshot:
        """Everything ``execute`` does under the lease before the run executes (a queued run is started);
        the snapshot alone when the run is stopped and nothing asks it to go on. The caller releases the
        lease if this raises."""
        record = self.store.get_run(run_id)
        services = self._prepare(record)  # first: the run's plugins may register what its flow uses
        flow = self.flow_of(run_id)
        if record.status == "queued":
            if before is not None:  # resume, retry, continue: none applies to a run not started
                self._refuse_queued(record)
            created = self._start(flow, record, lease)
            if on_event is not None:
                on_event(created.first)
            snap, checkpoint_size = created.snapshot, created.checkpoint_size
        else:
            snap, checkpoint_size = self._load_snapshot(run_id)
            flow = self._follow_flow(snap, record)
        drafts = list(first or [])
        if before is not None:
            try:
                drafts = before(snap) + drafts
            except _Refused as refused:
                self._append_now(snap, [refused.outcome.record], lease)
                _raise_if_refused(refused.outcome)
        updated = next((i for i, d in enumerate(drafts) if isinstance(d, FlowUpdated)), None)
        if updated is not None:
            # The runner executes one flow: the switch to the new one is committed before it starts.
            seq = snap.seq
            snap = self._append_now(snap, drafts[:updated + 1], lease)
            drafts = drafts[updated + 1:]
            if on_event is not None:
                for ev in self.events(run_id, after=seq):
                    on_event(ev)
            flow = self._follow_flow(snap, self.store.get_run(run_id))
        if snap.status != "running" and not drafts:
            return snap
        return _Ready(flow, snap, drafts, checkpoint_size, services)

    async def _go(self, ready: _Ready | RunSnapshot, lease: Lease, on_event: EventListener | None,
                  on_execution: Callable[[RunExecution], None] | None) -> RunSnapshot:
        if isinstance(ready, RunSnapshot):  # stopped, and nothing asks it to go on
            self.store.release_lease(ready.runId, lease)
            return ready
        return await self._execute(ready.flow, ready.snap, ready.drafts, on_event, ready.checkpoint_size, lease,
                                   ready.services, on_execution)

    @staticmethod
    def _refuse_queued(record: RunRecord) -> None:
        raise CommandRejectedError(f"run {record.runId} is queued and has not started: a worker starts it "
                                   "(`flowkernel worker`), or `flowkernel abort` it")

    async def recover(self, run_id: str, lease: Lease, *, on_event: EventListener | None = None,
                      on_execution: Callable[[RunExecution], None] | None = None) -> RunSnapshot:
        """Execute a pooled run under ``lease`` (a worker's claim): a queued run is started; a run
        whose executor is gone with node runs in flight is resumed exactly as ``resume`` would (they
        run again, told "continue"); one left with nothing in flight (handed over, or handed back to
        the pool after a reply) simply continues."""
        try:
            before = None
            if self.store.get_run(run_id).status != "queued":
                before = self._resume_interrupted(run_id)
            ready = self._ready(run_id, lease, on_event, None, before)
        except (StoreError, LeaseLostError, RunBusyError):
            # Passing faults: the run stays as it was for a worker to claim again (after a pause).
            with contextlib.suppress(FlowkernelError):
                self.store.release_lease(run_id, lease)
            raise
        except Exception as exc:
            try:
                failure = self.fail_to_start(run_id, exc, lease)
            finally:
                with contextlib.suppress(FlowkernelError):
                    self.store.release_lease(run_id, lease)
            raise failure from None
        except BaseException:
            with contextlib.suppress(FlowkernelError):
                self.store.release_lease(run_id, lease)
            raise
        return await self._go(ready, lease, on_event, on_execution)

    def _resume_interrupted(self, run_id: str) -> Callable[[RunSnapshot], list[BaseEvent]]:
        """``recover``'s first events: a resume when node runs were in flight as the executor went away."""
        resume = self._judged(run_id, Command(kind="resume", content="continue"),
                             lambda snap: FlowResumed(message="continue"))
        return lambda snap: resume(snap) if _interrupted(snap) else []

    def fail_to_start(self, run_id: str, exc: Exception, lease: Lease) -> FlowkernelError:
        """A worker claimed ``run_id`` but cannot execute it here (a setting it cannot provide, a flow it
        cannot load, a kernel error): end the run ``failed`` with the reason, so that it is not claimed
        again and again, and say what continues it once that is fixed. A queued run's log is started
        first (``flow:start``, then ``flow:complete``), as an abort of a queued run does."""
        what = str(exc) if isinstance(exc, FlowkernelError) else f"internal error: {type(exc).__name__}: {exc}"
        what = " ".join(what.split())[:1000]  # one line, bounded
        reason = (f"worker {self.owner} cannot execute the run: {what}; once that is fixed, "
                  f"`flowkernel retry {run_id}` continues it")
        try:
            snap = self.snapshot(run_id)
            if snap.status == "queued":
                snap = self._start(self.flow_of(run_id), self.store.get_run(run_id), lease).snapshot
            if snap.status != "running":
                return KernelFault(f"run {run_id} cannot be executed here: {what}")
            self._append_now(snap, [FlowComplete(status="failed", error=reason)], lease)
        except FlowkernelError as record_exc:
            kind = StoreError if isinstance(record_exc, StoreError) else KernelFault
            return kind(f"run {run_id} cannot be executed here ({what}), and it could not be marked failed: "
                        f"{record_exc}")
        return KernelFault(f"run {run_id} failed: {reason}")

    def hand_to_pool(self, run_id: str, before: Callable[[RunSnapshot], list[BaseEvent]]) -> RunSnapshot:
        """Continue a stopped pooled run through the workers instead of in this process: append the
        events ``before`` returns (a resume, a retry, the ``flow:resumed`` after a reply) and leave the
        run ``running`` with no lease, so that a worker claims it and carries on."""
        lease = self._acquire(run_id)
        try:
            snap = self.snapshot(run_id)
            if snap.status == "queued":
                self._refuse_queued(self.store.get_run(run_id))
            try:
                drafts = before(snap)
            except _Refused as refused:
                self._append_now(snap, [refused.outcome.record], lease)
                _raise_if_refused(refused.outcome)
            if not drafts:
                return snap
            snap = self._append_now(snap, drafts, lease, release=True)
            self._follow_flow(snap, self.store.get_run(run_id))
            return snap
        finally:
            self.store.release_lease(run_id, lease)

    def _follow_flow(self, snap: RunSnapshot, record: RunRecord) -> CompiledFlow:
        """The flow ``snap`` follows; the run row is made to name it too, if it does not yet (right
        after a ``flow:updated``, or when a crash came between that commit and this)."""
        flow = self.stored_flow(snap.flowHash, record)
        if record.flowHash != snap.flowHash:
            source = str(Path(flow.source).resolve()) if flow.base_dir else record.flowSource
            self.store.update_run_flow(record.runId, flow.hash, flow.name, flow.canonical, source)
        return flow

    def _prepare(self, record: RunRecord) -> RunServices:
        """The services to execute ``record``'s run with: its settings, with this kernel's replacing what
        they set (and kept for the run). Raises SettingUnavailableError, before anything is recorded,
        when the run needs what this process cannot provide."""
        stored = RunSettings.from_json(record.settings)
        effective = stored.overridden_by(self.settings)
        services = self._services(record.runId, effective)
        if effective != stored:
            self.store.set_run_settings(record.runId, effective.to_json())
        return services

    def _services(self, run_id: str, settings: RunSettings, *, new: bool = False) -> RunServices:
        import_plugins(run_id, settings)
        if settings.plugins and self.registry is not default_registry():
            self._adopt_plugins()
        return query_for(run_id, self.services, settings, self._mocks, new=new)

    def _adopt_plugins(self) -> None:
        """Plugins register in the default registry: give this kernel's own registry what it lacks of it."""
        default = default_registry()
        for mine, theirs in ((self.registry.functions, default.functions), (self.registry.tools, default.tools),
                             (self.registry.node_types, default.node_types)):
            for name in list(theirs.keys()):
                if name not in mine:
                    mine[name] = theirs[name]  # type: ignore[assignment]

    async def _execute(self, flow: CompiledFlow, snap: RunSnapshot, drafts: list[BaseEvent],
                       on_event: EventListener | None, checkpoint_size: int, lease: Lease,
                       services: RunServices,
                       on_execution: Callable[[RunExecution], None] | None = None) -> RunSnapshot:
        """Execute a run whose ``lease`` this kernel holds, from ``snap``; the lease ends when it stops."""
        run_id = snap.runId
        execution = RunExecution(flow=flow, snapshot=snap, store=self.store, registry=self.registry,
                                 listeners=[on_event] if on_event else [], services=services, tuning=self.tuning,
                                 children=self._children_of,
                                 checkpoint_size=checkpoint_size, lease=lease, committer=self._committer)
        self._executing[run_id] = execution
        if on_execution is not None:
            on_execution(execution)
        try:
            final = await execution.execute(drafts, background=[self._poll_commands, self._keep_lease(lease)])
        except Exception as exc:
            self._executing.pop(run_id, None)
            if isinstance(exc, (StoreError, LeaseLostError)):
                failure: FlowkernelError = exc  # the run stays as last saved (or goes on elsewhere)
            else:
                failure = self._record_fault(run_id, exc, lease)
            if not execution.lease_released:
                with contextlib.suppress(FlowkernelError):  # the store may be what failed
                    self.store.release_lease(run_id, lease)
            raise failure from None
        except BaseException:  # cancelled, interrupted: the run stays as last saved, to be resumed
            self._executing.pop(run_id, None)
            if not execution.lease_released:
                with contextlib.suppress(FlowkernelError):
                    self.store.release_lease(run_id, lease)
            raise
        self._executing.pop(run_id, None)
        if not execution.lease_released:
            self.store.release_lease(run_id, lease)
        if final.parentRunId and final.status in ("completed", "failed", "aborted"):
            await self._wake_parent(final)
        return final

    def _children_of(self, ctx: ShellNodeContext) -> ChildRuns:
        """``ctx.children``: the child runs of one node run, over this kernel."""
        return KernelChildren(self, run_id=ctx.flow_run_id, node_id=ctx.node_id, node_run_id=ctx.run_id,
                              item=ctx.item, resumed_from=ctx.resumed_from)

    def executing(self, run_id: str) -> RunExecution | None:
        """The execution of ``run_id`` in this kernel, if there is one."""
        return self._executing.get(run_id)

    def _record_fault(self, run_id: str, exc: Exception, lease: Lease) -> FlowkernelError:
        """The kernel failed while executing ``run_id``: end the run ``failed`` with the error, on top of
        what was last saved (events applied but not saved are dropped), so it is never left ``running``."""
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        what = " ".join(what.split())[:500]  # one line, bounded
        reason = f"internal error: {what}"
        try:
            snap = self.snapshot(run_id)
            if snap.status == "running":
                self._append_now(snap, [FlowComplete(status="failed", error=reason)], lease)
        except FlowkernelError as store_exc:
            return StoreError(f"run {run_id} stopped on an {reason}, and it could not be marked failed: "
                              f"{store_exc}")
        return KernelFault(f"run {run_id} failed on an {reason} (a bug in flowkernel or in a node type); "
                           f"the run is marked failed: `flowkernel show {run_id}`")

    async def _wake_parent(self, child: RunSnapshot) -> None:
        """A child finished while its parent waited on it: tell the parent's flow.call node run."""
        parent_id = child.parentRunId or ""
        if parent_id in self._executing:
            return  # the parent's flow.call node is driving this child in-process
        parent = self.snapshot(parent_id)
        record = self.store.get_run(child.runId)
        for w in parent.waiting.values():
            if isinstance(w.prompt, dict) and w.prompt.get("childRunId") == child.runId:
                try:
                    await self._deliver(parent_id, Command(kind="reply", target=w.runId,
                                                           content={"childRunId": child.runId,
                                                                    "status": record.status}), None)
                except (CommandRejectedError, RunBusyError):
                    pass  # someone else is handling the parent
                return

    async def reply(self, run_id: str, node_run_id: str | None, content: Any, *,
                    on_event: EventListener | None = None) -> RunSnapshot:
        """Answer a waiting node run; if no process executes the run, continue it here."""
        return await self._deliver(run_id, Command(kind="reply", target=node_run_id, content=content), on_event)

    async def send(self, run_id: str, node_run_id: str | None, message: Any, *,
                   on_event: EventListener | None = None) -> RunSnapshot:
        """Send a message to a live node run's inbox; if no process executes the run, continue it here."""
        return await self._deliver(run_id, Command(kind="send", target=node_run_id, content=message), on_event)

    async def _deliver(self, run_id: str, cmd: Command, on_event: EventListener | None) -> RunSnapshot:
        _, snap = await self.deliver(run_id, cmd, on_event=on_event)
        return snap if snap is not None else self.snapshot(run_id)

    async def deliver(self, run_id: str, cmd: Command, *, on_event: EventListener | None = None,
                      on_accepted: Callable[[CommandOutcome], None] | None = None,
                      ) -> tuple[CommandOutcome, RunSnapshot | None]:
        """Issue a ``send`` or ``reply``; if no process executes the run, continue it here until it stops
        (a pooled run is handed back to the workers instead).

        Returns the command's outcome and, when this call executed the run, its snapshot then (None
        when another process or the workers execute it). What the run needs to execute here (its settings) is
        checked before the command is recorded."""
        record = self.store.get_run(run_id)
        if run_id not in self._executing and not self._held(record) and not record.pooled:
            # Nobody executes the run: this process will. It must be able to before the command counts.
            self._prepare(record)
        outcome = await self.command(run_id, cmd)
        if on_accepted is not None:
            on_accepted(outcome)
        record = self.store.get_run(run_id)
        if run_id in self._executing or record.leaseOwner is not None:
            return outcome, None
        if record.pooled:  # the workers execute it: hand it back to them
            self.hand_to_pool(run_id, continue_stopped)
            return outcome, None
        return outcome, await self.continue_run(run_id, on_event=on_event)

    async def continue_run(self, run_id: str, *, on_event: EventListener | None = None) -> RunSnapshot:
        """Execute a stored run that no process is executing (after a reply or send landed in it)."""
        return await self.execute(run_id, on_event=on_event, before=continue_stopped)

    def interrupted(self, record: RunRecord) -> bool:
        """Whether the run is ``running`` with no process executing it (its executor was killed, or
        stopped by Ctrl-C): it shows as ``interrupted``, and ``resume`` continues it. The stored status
        stays ``running``: this is read from the lease, which a dead executor no longer holds. A pooled
        run without one is not: a worker claims it (DESIGN §11)."""
        return record.status == "running" and not record.pooled and not self.executed(record)

    def executed(self, record: RunRecord) -> bool:
        """Whether a live process (this one or another) executes the run now."""
        return record.runId in self._executing or self._held(record)

    def _held(self, record: RunRecord) -> bool:
        """Whether a live process holds the run's lease."""
        owner = record.leaseOwner
        return owner is not None and (record.leaseExpiresAt or 0) > now_ms() and not owner_dead(owner)

    def _acquire(self, run_id: str) -> Lease:
        lease = self.store.acquire_lease(run_id, self.owner, now_ms(), self.lease_ttl_ms)
        if lease.owner != self.owner and owner_dead(lease.owner):
            # The holder died on this host: its lease is void, take the run over now.
            lease = self.store.acquire_lease(run_id, self.owner, now_ms(), self.lease_ttl_ms, steal_from=lease.owner)
        if lease.owner != self.owner:
            raise RunBusyError(f"run {run_id} is being executed by {lease.owner}; wait for it to stop, "
                               f"or `flowkernel pause {run_id}`")
        return lease

    def _keep_lease(self, lease: Lease) -> Callable[[RunExecution], Coroutine[Any, Any, None]]:
        async def renew(execution: RunExecution) -> None:
            run_id = execution.snap.runId
            while True:
                await anyio.sleep(self.lease_ttl_ms / 3000)
                if execution.lease_released:
                    return
                try:
                    held = self.store.renew_lease(run_id, lease, now_ms(), self.lease_ttl_ms)
                except StoreError:
                    continue  # the store is unreachable for now: the run's next commit says so, or this retries
                if not held:
                    if execution.lease_released or execution.lease_releasing:
                        return  # its own last commit ended the lease, just now
                    try:
                        holder = self.store.get_run(run_id).leaseOwner
                    except StoreError:
                        holder = None
                    execution.lose_lease(LeaseLostError(run_id, holder))
                    return
        return renew

    def _change_token(self) -> int:
        """The store's change token, read at most once per poll interval however many runs execute here."""
        now = time.monotonic()
        if now - self._token_read[0] >= COMMAND_POLL_S / 2:
            self._token_read = (now, self.store.change_token())
        return self._token_read[1]

    async def _poll_commands(self, execution: RunExecution) -> None:
        """Deliver commands that other processes stored for this run (checked every 50 ms, cheaply)."""
        run_id = execution.snap.runId
        token: int | None = None
        seen: set[int] = set()
        while True:
            try:
                current = self._change_token()
                if current != token:
                    rows = self.store.pending_commands(run_id)
                    token = current
                    for row in rows:
                        if row.id not in seen:
                            seen.add(row.id)
                            execution.deliver(Command.from_json(row.body), row.id)
            except StoreError:
                pass  # a dropped connection is replaced on the next poll; a store that stays down fails the next commit
            await anyio.sleep(COMMAND_POLL_S)

    async def resume(self, run_id: str, message: str | None = "continue", *,
                     on_event: EventListener | None = None, queue: bool = False,
                     budget: float | None = None, flow: CompiledFlow | None = None) -> RunSnapshot:
        """Continue a paused, waiting, interrupted or failed run; ``message`` goes to every interrupted node
        run, and on a failed run to every failed node it runs again (a failed agent takes it as the next
        user turn of its conversation). ``budget``: the new limit in USD for what paused the run for its
        budget (a node's ``policy.maxCostUsd``), or else for the run's ``budget.maxCostUsd``; recorded in
        ``flow:resumed``. With ``queue``, a worker continues it (``hand_to_pool``); the snapshot after the
        resume returns. ``flow``: continue on this flow instead (see ``flowkernel.core.flow_update``;
        ``FlowUpdateError`` lists why it cannot be, and nothing is recorded then)."""
        cmd = Command(kind="resume", content=message, budget=budget)
        # (a budget that is not a positive number is refused by the judge before this is appended)
        usd = float(budget) if isinstance(budget, int | float) and not isinstance(budget, bool) else None
        before = self._judged(run_id, cmd, lambda snap: FlowResumed(message=message, budgetUsd=usd,
                                                                    retry=snap.status == "failed"), flow)
        if queue:
            return self.hand_to_pool(run_id, before)
        return await self.execute(run_id, on_event=on_event, before=before)

    async def retry(self, run_id: str, *, message: str | None = None, on_event: EventListener | None = None,
                    queue: bool = False, flow: CompiledFlow | None = None) -> RunSnapshot:
        """Re-run the failed nodes of a failed run (fresh attempts; the history stays); ``message`` goes to
        every interrupted node run, as for resume; ``queue`` and ``flow`` as for resume."""
        cmd = Command(kind="retry")
        before = self._judged(run_id, cmd, lambda snap: FlowResumed(message=message, retry=True), flow)
        if queue:
            return self.hand_to_pool(run_id, before)
        return await self.execute(run_id, on_event=on_event, before=before)

    def _judged(self, run_id: str, cmd: Command, then: Callable[[RunSnapshot], BaseEvent],
                update: CompiledFlow | None = None) -> Callable[[RunSnapshot], list[BaseEvent]]:
        def before(snap: RunSnapshot) -> list[BaseEvent]:
            current = self.stored_flow(snap.flowHash, self.store.get_run(run_id))
            below = 0.0
            if cmd.kind in ("resume", "retry") and (run_limit(current, snap) is not None or cmd.budget is not None):
                totals = self.store.descendant_totals([run_id]).get(run_id)
                below = totals.totalCostUsd if totals is not None else 0.0
            outcome = judge_command(current, snap, cmd, executing=False, below=below,
                                    takes_messages=self.message_takers(current))
            if not outcome.accepted:
                raise _Refused(outcome)  # recorded by ``execute``, under the lease it holds
            if update is None or update.hash == current.hash:
                return [outcome.record, then(snap)]
            self._check_update(current, update, snap)
            # Stored before the event that names it, so that no reader folds a flow:updated it cannot follow.
            self.store.put_flow(update.hash, update.name, update.canonical)
            self._flows[update.hash] = update
            return [outcome.record, FlowUpdated(fromHash=current.hash, toHash=update.hash), then(snap)]
        return before

    def _check_update(self, current: CompiledFlow, update: CompiledFlow, snap: RunSnapshot) -> None:
        """Raise FlowUpdateError, listing every problem, unless the run in ``snap`` can follow ``update``."""
        from flowkernel.core.flow_update import incompatibilities

        problems = incompatibilities(current, update, snap)
        try:
            self.check_input(update, snap.input)
        except RunInputError as exc:
            problems += [f"the run's {where} does not match the new flow's `inputs`: {message}"
                         for where, message in exc.problems]
        if problems:
            raise FlowUpdateError(snap.runId, update.source, problems)

    async def command(self, run_id: str, cmd: Command, *, timeout_s: float = 10.0) -> CommandOutcome:
        """Issue a command to a run. If this process executes it, it is delivered directly; if another
        process does, it goes through the store; if none does, it is judged and recorded here.
        An accepted abort also aborts the run's unfinished child runs."""
        outcome = await self._command(run_id, cmd, timeout_s)
        if cmd.kind == "abort":
            for child in self.runs(parent=run_id):
                if child.status not in ("completed", "aborted", "failed"):
                    try:
                        await self.command(child.runId, Command(kind="abort", reason=f"parent {run_id} aborted"))
                    except CommandRejectedError:
                        pass
        return outcome

    async def _command(self, run_id: str, cmd: Command, timeout_s: float) -> CommandOutcome:
        if cmd.kind in ("resume", "retry"):
            raise InvalidInputError(f"{cmd.kind} continues a run in the calling process: use Kernel.{cmd.kind}() "
                                    f"(flowkernel {cmd.kind} RUN)")
        execution = self._executing.get(run_id)
        if execution is not None:
            result: list[CommandOutcome] = []
            done = anyio.Event()

            def reply(outcome: CommandOutcome) -> None:
                result.append(outcome)
                done.set()

            execution.deliver(cmd, reply=reply)
            with anyio.fail_after(timeout_s):
                await done.wait()
            return _raise_if_refused(result[0])
        try:
            lease = self._acquire(run_id)
        except RunBusyError:
            return await self._via_store(run_id, cmd, timeout_s)
        try:
            snap = self.snapshot(run_id)
            flow = self.flow_of(run_id)
            outcome = judge_command(flow, snap, cmd, executing=False, takes_messages=self.message_takers(flow))
            drafts: list[BaseEvent] = [outcome.record]
            if outcome.accepted and cmd.kind == "pause":  # nobody executes the run: it takes effect here
                drafts.append(FlowPaused(reason=cmd.reason or "pause requested"))
            elif outcome.accepted and cmd.kind == "abort":
                drafts.append(FlowComplete(status="aborted", error=cmd.reason or "aborted"))
            if snap.status == "queued":
                if not outcome.accepted:  # nothing is recorded before a run's flow:start
                    return _raise_if_refused(outcome)
                # Aborting a queued run starts its log: flow:start, the command, flow:complete.
                snap = self._start(self.flow_of(run_id), self.store.get_run(run_id), lease).snapshot
            self._append_now(snap, drafts, lease)
            return _raise_if_refused(outcome)
        finally:
            self.store.release_lease(run_id, lease)

    def _append_now(self, snap: RunSnapshot, drafts: list[BaseEvent], lease: Lease, *,
                    release: bool = False) -> RunSnapshot:
        record = self.store.get_run(snap.runId)
        return append_now(self.store, snap, drafts, lease, flows=lambda h: self.stored_flow(h, record),
                          agent_types=self.registry, release=release)

    async def _via_store(self, run_id: str, cmd: Command, timeout_s: float) -> CommandOutcome:
        """Queue the command for the process executing the run, and wait for its verdict."""
        cid = self.store.enqueue_command(run_id, cmd.to_json())
        with anyio.fail_after(timeout_s):
            while True:
                rows = {r.id for r in self.store.pending_commands(run_id)}
                if cid not in rows:
                    break
                await anyio.sleep(COMMAND_POLL_S)
        for ev in reversed(self.events(run_id)):
            if isinstance(ev, CommandReceived) and ev.commandId == str(cid):
                return _raise_if_refused(CommandOutcome(ev.accepted, ev, ev.reason, invalid=ev.refusal == "invalid"))
        raise StoreError(f"run {run_id}: command {cmd.kind} was taken but its record is missing")

    def close(self) -> None:
        self.store.close()


def continue_stopped(snap: RunSnapshot) -> list[BaseEvent]:
    """What continues a run that nobody executes after a reply or send landed in it."""
    if snap.status in ("waiting", "running"):
        return [FlowResumed(message=None)]
    return []


def _interrupted(snap: RunSnapshot) -> bool:
    """Node runs were in flight when the run's executor went away (they need a resume). A forEach
    group stays ``running`` across a ``flow:resumed``, which moved its items in flight to
    ``resumedFrom`` (they start again, with the resume's message, as the run goes on): only items still
    ``running`` were cut short. A run handed to the workers by a resume must not be resumed twice."""
    if snap.status != "running":
        return False
    for node_id, status in snap.nodeStatus.items():
        if status == "running":
            group = snap.forEach.get(node_id)
            if group is None or group.running:
                return True
    return False


def _raise_if_refused(outcome: CommandOutcome) -> CommandOutcome:
    if not outcome.accepted:
        raise CommandRejectedError(outcome.reason or "command refused", invalid=outcome.invalid)
    return outcome


def parse_inputs(flow: CompiledFlow, pairs: list[str], json_file: str | None) -> dict[str, Any]:
    """``--input k=v`` pairs (JSON values unless the schema wants a string) and ``--input-json FILE``."""
    value: dict[str, Any] = {}
    if json_file:
        path = Path(json_file)
        try:
            loaded = loads_strict(path.read_text(encoding="utf-8"))
        except RecursionError:
            raise InvalidInputError(f"--input-json {json_file}: nested too deeply to read (flowkernel takes at most "
                                    f"{MAX_DEPTH} levels of lists and objects)") from None
        except FileNotFoundError:
            raise InvalidInputError(f"--input-json {json_file}: no such file") from None
        except (OSError, ValueError) as exc:  # ValueError: not JSON, or NaN or Infinity (JSON has neither)
            raise InvalidInputError(f"--input-json {json_file}: not valid JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise InvalidInputError(f"--input-json {json_file}: must hold a JSON object")
        value.update(loaded)
    props = (flow.inputs_schema or {}).get("properties", {})
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise InvalidInputError(f"--input {pair!r}: expected KEY=VALUE")
        want = props.get(key, {}).get("type") if isinstance(props.get(key), dict) else None
        if want == "string":
            value[key] = raw
            continue
        try:
            value[key] = loads_strict(raw)
        except RecursionError:
            raise InvalidInputError(f"--input {key}=…: nested too deeply to read (flowkernel takes at most "
                                    f"{MAX_DEPTH} levels of lists and objects)") from None
        except json.JSONDecodeError:
            value[key] = raw
        except ValueError as exc:  # NaN or Infinity: not JSON, and not to be stored as text by surprise
            raise InvalidInputError(f"--input {key}=…: {exc}; quote it as a JSON string to pass the text") from None
    return value

