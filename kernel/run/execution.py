"""Execution under leases: a run loaded (or started, if queued) and executed here until it stops,
with its lease renewed and the commands other processes store for it delivered; a worker's claim
recovered; a fault recorded as the run's end; a parent waiting on a finished child told."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import BaseEvent, FlowComplete, FlowUpdated
from flowkernel.core.node_context import ChildRuns
from flowkernel.core.services import RunServices
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.errors import (
    CommandRejectedError,
    FlowkernelError,
    InvalidInputError,
    KernelFault,
    LeaseLostError,
    RunBusyError,
    StoreError,
)
from flowkernel.flowfiles.tree import first_unavailable
from flowkernel.ids import new_run_id
from flowkernel.plugins.registry import Registry
from flowkernel.run.committer import Committer
from flowkernel.run.creation import Creation
from flowkernel.run.flow_cache import FlowCache
from flowkernel.run.inbox import CommandInbox
from flowkernel.run.judged import Before, Judge, Refused, continue_stopped, raise_if_refused
from flowkernel.run.leases import Leases
from flowkernel.run.loop import EventListener, RunExecution
from flowkernel.run.node_context import ShellNodeContext
from flowkernel.run.reads import Reads
from flowkernel.run.setup import RunSetup
from flowkernel.run.tuning import Tuning
from flowkernel.store.base import Lease, RunRecord, Store

Reply = Callable[[str, str | None, Any], Awaitable[RunSnapshot]]  # Kernel.reply: answer a waiting node run


class Ready(NamedTuple):
    """A run about to execute under a lease: what ``Executor.execute_ready`` takes."""

    flow: CompiledFlow
    snap: RunSnapshot
    drafts: list[BaseEvent]
    checkpoint_size: int
    services: RunServices


class Executor:
    """The runs executing in this process (each under its lease), and what starts and ends them."""

    def __init__(self, store: Store, registry: Registry, tuning: Tuning, *, flows: FlowCache, setup: RunSetup,
                 creation: Creation, reads: Reads, leases: Leases, inbox: CommandInbox, committer: Committer,
                 judge: Judge, children: Callable[[ShellNodeContext], ChildRuns], reply: Reply) -> None:
        self.store, self.registry, self.tuning = store, registry, tuning
        self.flows, self.setup, self.creation, self.reads = flows, setup, creation, reads
        self.leases, self.inbox, self.committer, self.judge = leases, inbox, committer, judge
        self._children_of, self._reply = children, reply
        self._executing: dict[str, RunExecution] = {}

    def executing_here(self, run_id: str) -> bool:
        """Whether this process executes ``run_id`` now."""
        return run_id in self._executing

    async def run(self, flow: CompiledFlow, input: Any = None, *, on_event: EventListener | None = None,
                  run_id: str | None = None) -> RunSnapshot:
        """Create a run and execute it until it stops; returns its final snapshot."""
        run_id = run_id or new_run_id()
        services = self.setup.services_for(run_id, self.setup.settings, new=True)  # checked before anything is stored
        unavailable = first_unavailable(flow.document, flow.source, flow.base_dir, self.registry.node_types, services)
        if unavailable is not None:
            raise InvalidInputError(f"{unavailable}; nothing was run")
        created, request = self.creation.new_run(flow, input, run_id=run_id, leased=True)
        # Created through the committer: runs started together share the transactions that store them.
        self.committer.executing += 1
        try:
            await self.committer.commit(request)
        finally:
            self.committer.executing -= 1
        self.flows.remember(flow)
        if on_event is not None:
            on_event(created.first)
        # Created leased, with the snapshot in hand: nothing to take or load before executing.
        assert created.lease is not None
        return await self.execute_ready(flow, created.snapshot, [], on_event, created.checkpoint_size, created.lease,
                                   services)

    async def execute(self, run_id: str, *, on_event: EventListener | None = None,
                      first: list[BaseEvent] | None = None,
                      before: Before | None = None,
                      lease: Lease | None = None,
                      on_execution: Callable[[RunExecution], None] | None = None) -> RunSnapshot:
        """Take the run's lease (or use ``lease``, taken already) and execute the run from its stored
        snapshot until it stops; a queued run is started first.

        ``before`` sees the loaded snapshot and returns the first events to append (it may raise to refuse).
        """
        lease = lease or self.leases.acquire(run_id)
        try:
            ready = self.ready(run_id, lease, on_event, first, before)
        except BaseException:
            self.store.release_lease(run_id, lease)
            raise
        return await self.go(ready, lease, on_event, on_execution)

    def ready(self, run_id: str, lease: Lease, on_event: EventListener | None, first: list[BaseEvent] | None,
               before: Before | None) -> Ready | RunSnapshot:
        """Everything ``execute`` does under the lease before the run executes (a queued run is started);
        the snapshot alone when the run is stopped and nothing asks it to go on. The caller releases the
        lease if this raises."""
        record = self.store.get_run(run_id)
        services = self.setup.prepare(record)  # first: the run's plugins may register what its flow uses
        flow = self.flows.of_run(run_id)
        if record.status == "queued":
            if before is not None:  # resume, retry, continue: none applies to a run not started
                self.refuse_queued(record)
            created = self.creation.start_queued(flow, record, lease)
            if on_event is not None:
                on_event(created.first)
            snap, checkpoint_size = created.snapshot, created.checkpoint_size
        else:
            snap, checkpoint_size = self.reads.load_snapshot(run_id)
            flow = self.flows.follow(snap, record)
        drafts = list(first or [])
        if before is not None:
            try:
                drafts = before(snap) + drafts
            except Refused as refused:
                self.judge.append_now(snap, [refused.outcome.record], lease)
                raise_if_refused(refused.outcome)
        updated = next((i for i, d in enumerate(drafts) if isinstance(d, FlowUpdated)), None)
        if updated is not None:
            # The runner executes one flow: the switch to the new one is committed before it starts.
            seq = snap.seq
            snap = self.judge.append_now(snap, drafts[:updated + 1], lease)
            drafts = drafts[updated + 1:]
            if on_event is not None:
                for ev in self.reads.events(run_id, after=seq):
                    on_event(ev)
            flow = self.flows.follow(snap, self.store.get_run(run_id))
        if snap.status != "running" and not drafts:
            return snap
        return Ready(flow, snap, drafts, checkpoint_size, services)

    async def go(self, ready: Ready | RunSnapshot, lease: Lease, on_event: EventListener | None,
                  on_execution: Callable[[RunExecution], None] | None) -> RunSnapshot:
        if isinstance(ready, RunSnapshot):  # stopped, and nothing asks it to go on
            self.store.release_lease(ready.runId, lease)
            return ready
        return await self.execute_ready(ready.flow, ready.snap, ready.drafts, on_event, ready.checkpoint_size, lease,
                                   ready.services, on_execution)

    @staticmethod
    def refuse_queued(record: RunRecord) -> None:
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
                before = self.judge.resume_interrupted(run_id)
            ready = self.ready(run_id, lease, on_event, None, before)
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
        return await self.go(ready, lease, on_event, on_execution)

    def fail_to_start(self, run_id: str, exc: Exception, lease: Lease) -> FlowkernelError:
        """A worker claimed ``run_id`` but cannot execute it here (a setting it cannot provide, a flow it
        cannot load, a kernel error): end the run ``failed`` with the reason, so that it is not claimed
        again and again, and say what continues it once that is fixed. A queued run's log is started
        first (``flow:start``, then ``flow:complete``), as an abort of a queued run does."""
        what = str(exc) if isinstance(exc, FlowkernelError) else f"internal error: {type(exc).__name__}: {exc}"
        what = " ".join(what.split())[:1000]  # one line, bounded
        reason = (f"worker {self.leases.owner} cannot execute the run: {what}; once that is fixed, "
                  f"`flowkernel retry {run_id}` continues it")
        try:
            snap = self.reads.snapshot(run_id)
            if snap.status == "queued":
                snap = self.creation.start_queued(self.flows.of_run(run_id), self.store.get_run(run_id), lease).snapshot
            if snap.status != "running":
                return KernelFault(f"run {run_id} cannot be executed here: {what}")
            self.judge.append_now(snap, [FlowComplete(status="failed", error=reason)], lease)
        except FlowkernelError as record_exc:
            kind = StoreError if isinstance(record_exc, StoreError) else KernelFault
            return kind(f"run {run_id} cannot be executed here ({what}), and it could not be marked failed: "
                        f"{record_exc}")
        return KernelFault(f"run {run_id} failed: {reason}")

    async def execute_ready(self, flow: CompiledFlow, snap: RunSnapshot, drafts: list[BaseEvent],
                       on_event: EventListener | None, checkpoint_size: int, lease: Lease,
                       services: RunServices,
                       on_execution: Callable[[RunExecution], None] | None = None) -> RunSnapshot:
        """Execute a run whose ``lease`` this kernel holds, from ``snap``; the lease ends when it stops."""
        run_id = snap.runId
        execution = RunExecution(flow=flow, snapshot=snap, store=self.store, registry=self.registry,
                                 listeners=[on_event] if on_event else [], services=services, tuning=self.tuning,
                                 children=self._children_of,
                                 checkpoint_size=checkpoint_size, lease=lease, committer=self.committer)
        self._executing[run_id] = execution
        if on_execution is not None:
            on_execution(execution)
        try:
            final = await execution.execute(drafts, background=[self.inbox.poll, self.leases.keeper(lease)])
        except Exception as exc:
            self._executing.pop(run_id, None)
            if isinstance(exc, (StoreError, LeaseLostError)):
                failure: FlowkernelError = exc  # the run stays as last saved (or goes on elsewhere)
            else:
                failure = self.record_fault(run_id, exc, lease)
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
            await self.wake_parent(final)
        return final

    def executing(self, run_id: str) -> RunExecution | None:
        """The execution of ``run_id`` in this kernel, if there is one."""
        return self._executing.get(run_id)

    def record_fault(self, run_id: str, exc: Exception, lease: Lease) -> FlowkernelError:
        """The kernel failed while executing ``run_id``: end the run ``failed`` with the error, on top of
        what was last saved (events applied but not saved are dropped), so it is never left ``running``."""
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        what = " ".join(what.split())[:500]  # one line, bounded
        reason = f"internal error: {what}"
        try:
            snap = self.reads.snapshot(run_id)
            if snap.status == "running":
                self.judge.append_now(snap, [FlowComplete(status="failed", error=reason)], lease)
        except FlowkernelError as store_exc:
            return StoreError(f"run {run_id} stopped on an {reason}, and it could not be marked failed: "
                              f"{store_exc}")
        return KernelFault(f"run {run_id} failed on an {reason} (a bug in flowkernel or in a node type); "
                           f"the run is marked failed: `flowkernel show {run_id}`")

    async def wake_parent(self, child: RunSnapshot) -> None:
        """A child finished while its parent waited on it: tell the parent's flow.call node run."""
        parent_id = child.parentRunId or ""
        if parent_id in self._executing:
            return  # the parent's flow.call node is driving this child in-process
        parent = self.reads.snapshot(parent_id)
        record = self.store.get_run(child.runId)
        for w in parent.waiting.values():
            if isinstance(w.prompt, dict) and w.prompt.get("childRunId") == child.runId:
                try:
                    await self._reply(parent_id, w.runId, {"childRunId": child.runId, "status": record.status})
                except (CommandRejectedError, RunBusyError):
                    pass  # someone else is handling the parent
                return

    async def continue_run(self, run_id: str, *, on_event: EventListener | None = None) -> RunSnapshot:
        """Execute a stored run that no process is executing (after a reply or send landed in it)."""
        return await self.execute(run_id, on_event=on_event, before=continue_stopped)

