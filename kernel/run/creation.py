"""Run creation: a new run stored with its ``flow:start`` (or queued for the workers, once per
idempotency key), and the ``flow:start`` of a queued run a worker starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import Event, FlowStart
from flowkernel.core.inputs import check_input
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.errors import StoreError
from flowkernel.ids import new_run_id, now_ms
from flowkernel.run.append import Appender
from flowkernel.run.committer import Committer
from flowkernel.run.flow_cache import FlowCache
from flowkernel.run.leases import Leases
from flowkernel.run.settings import RunSettings
from flowkernel.store.base import CreateRequest, EventRow, Lease, RunRecord, Store
from flowkernel.store.checkpoint import encode_checkpoint


class First(NamedTuple):
    """A run's ``flow:start``: the event, its stored row, the snapshot after it and its checkpoint."""

    event: Event
    row: EventRow
    snapshot: RunSnapshot
    skeleton: bytes
    blobs: dict[str, bytes]


def first_event(flow: CompiledFlow, run_id: str, value: Any, parent_run_id: str | None,
                parent_node_run_id: str | None) -> First:
    """The ``flow:start`` of run ``run_id`` (seq 1, through the one append path), and the snapshot it starts."""
    started = Appender.start(flow, FlowStart(flowName=flow.name, flowHash=flow.hash, input=value,
                                             parentRunId=parent_run_id, parentNodeRunId=parent_node_run_id), run_id)
    skeleton, blobs = encode_checkpoint(started.snapshot)
    return First(started.event, started.row, started.snapshot, skeleton, blobs)


class Created(NamedTuple):
    """A run just stored: its id, its ``flow:start``, its snapshot and the size of its checkpoint."""

    run_id: str
    first: Event
    snapshot: RunSnapshot
    checkpoint_size: int
    lease: Lease | None


class Enqueued(NamedTuple):
    """A queued run's id, and whether this call created it (False: an earlier one with its key did)."""

    run_id: str
    created: bool


class Creation:
    """Stores new runs, with the settings they execute with (``settings``: this process's)."""

    def __init__(self, store: Store, flows: FlowCache, leases: Leases, committer: Committer,
                 settings: RunSettings) -> None:
        self.store, self.flows, self.leases, self.committer = store, flows, leases, committer
        self.settings = settings

    def create(self, flow: CompiledFlow, input: Any, *, parent_run_id: str | None = None,
               parent_node_run_id: str | None = None, run_id: str | None = None, leased: bool = False) -> Created:
        """Validate the input and store a new run (``flow:start``) with its flow in one transaction;
        nothing executes yet. ``leased``: this process holds its lease from the start (it executes the
        run next)."""
        created, request = self.new_run(flow, input, parent_run_id=parent_run_id,
                                        parent_node_run_id=parent_node_run_id, run_id=run_id, leased=leased)
        self.store.create_run(request.record, request.events, request.checkpoint, request.blobs,
                              document=request.document)
        self.flows.remember(flow)
        return created

    def new_run(self, flow: CompiledFlow, input: Any, *, parent_run_id: str | None = None,
                parent_node_run_id: str | None = None, run_id: str | None = None,
                leased: bool = False) -> tuple[Created, CreateRequest]:
        """A new run, and what stores it (see ``create``)."""
        value = {} if input is None else input
        check_input(flow, value)
        run_id = run_id or new_run_id()
        # A child run executes as its parent does.
        settings = self.store.get_run(parent_run_id).settings if parent_run_id else self.settings.to_json()
        first = first_event(flow, run_id, value, parent_run_id, parent_node_run_id)
        owner = self.leases.owner
        record = RunRecord(runId=run_id, flowName=flow.name, flowHash=flow.hash, status="running", seq=1,
                           input=value, createdAt=first.event.timestamp, updatedAt=first.event.timestamp,
                           parentRunId=parent_run_id, parentNodeRunId=parent_node_run_id,
                           flowSource=str(Path(flow.source).resolve()) if flow.base_dir else None,
                           leaseOwner=owner if leased else None,
                           leaseExpiresAt=first.event.timestamp + self.leases.ttl_ms if leased else None,
                           leaseEpoch=1 if leased else 0, settings=settings)
        request = CreateRequest(record=record, events=[first.row], checkpoint=first.skeleton, blobs=first.blobs,
                                document=flow.canonical)
        return Created(run_id, first.event, first.snapshot, len(first.skeleton),
                       Lease(owner, 1) if leased else None), request

    def enqueue(self, flow: CompiledFlow, input: Any = None, *, run_id: str | None = None,
                idempotency_key: str | None = None, settings: RunSettings | None = None) -> str:
        """Validate the input and store a ``queued`` run for the workers (DESIGN §11); returns its id at
        once. It has no events until a worker claims it and writes its ``flow:start``. A second run
        with the same ``idempotency_key`` is refused by the store (``find_idempotent`` finds the first).
        ``settings``: the run's own (default: this kernel's)."""
        value = {} if input is None else input
        check_input(flow, value)
        run_id = run_id or new_run_id()
        now = now_ms()
        record = RunRecord(runId=run_id, flowName=flow.name, flowHash=flow.hash, status="queued", seq=0,
                           input=value, createdAt=now, updatedAt=now,
                           flowSource=str(Path(flow.source).resolve()) if flow.base_dir else None,
                           pooled=True, maxRuns=flow.max_concurrent_runs, idempotencyKey=idempotency_key,
                           settings=(settings or self.settings).to_json())
        self.store.create_run(record, [], b"", document=flow.canonical)
        self.flows.remember(flow)
        return run_id

    def enqueue_once(self, flow: CompiledFlow, input: Any = None, idempotency_key: str | None = None) -> Enqueued:
        """``enqueue``, once per ``idempotency_key``: a key already used gives the run it made (also when
        two calls with one key race: the store lets one create the run, and the other gets it)."""
        key = idempotency_key
        if key is not None and (found := self.store.find_idempotent(key)) is not None:
            return Enqueued(found.runId, False)
        try:
            return Enqueued(self.enqueue(flow, input, idempotency_key=key), True)
        except StoreError:
            if key is not None and (found := self.store.find_idempotent(key)) is not None:
                return Enqueued(found.runId, False)
            raise

    def start_queued(self, flow: CompiledFlow, record: RunRecord, lease: Lease) -> Created:
        """Write the ``flow:start`` of a queued run, under the lease of the execution that starts it."""
        first = first_event(flow, record.runId, record.input, record.parentRunId, record.parentNodeRunId)
        self.store.commit(record.runId, [first.row], "running", 1, None, first.skeleton, first.blobs, lease=lease)
        self.committer.committed()
        return Created(record.runId, first.event, first.snapshot, len(first.skeleton), lease)
