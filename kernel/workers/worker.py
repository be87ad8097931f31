"""Workers (DESIGN §11): claim queued and orphaned runs from the store and execute them, N at once.

``flowkernel worker`` runs one ``Worker``; ``flowkernel serve`` runs the same class inside its own
event loop. A worker is a ``Kernel`` (its owner id is the worker id) plus a claim loop::

    worker = Worker(Kernel("postgresql://…"), concurrency=8)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)      # returns once the worker is registered and claiming
        ...
        worker.stop()                   # hand over gracefully (what SIGTERM does); run() then returns

Each claim is one store transaction (PostgreSQL: ``SELECT … FOR UPDATE SKIP LOCKED``; SQLite: one
``BEGIN IMMEDIATE``) that leases runs to this worker with a new lease epoch. A queued run is
started (its ``flow:start`` written under that lease); a run whose executor died is recovered
exactly as ``flowkernel resume`` would. Every commit is fenced by the lease, so a worker that was
frozen past its lease can never write to a run another worker has taken over.

Wake-ups: on PostgreSQL, ``LISTEN/NOTIFY`` (a queued run, a handed-over run, a command) with a
slow poll as fallback; elsewhere, a poll every ``poll_s``. Dead workers on this host are noticed on
every poll (their pid is gone) and their runs are taken over at once; elsewhere a run is taken over
when its lease expires.

What a worker does is logged on ``flowkernel.worker``, one line per event: each run claimed (queued, or
recovered from an executor that is gone), how each run it executed ended here (completed, failed,
aborted, paused, waiting, handed over), and what goes wrong (a lost lease, a store it cannot reach).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.errors import FlowkernelError, LeaseLostError
from flowkernel.ids import now_ms
from flowkernel.run.kernel import Kernel, owner_dead
from flowkernel.run.loop import RunExecution
from flowkernel.run.timetravel import execute_rerun, is_rerun
from flowkernel.store.base import Claim, WorkerRecord
from flowkernel.workers.defaults import DEFAULT_CONCURRENCY, DEFAULT_GRACE_S

# After the grace period, node types that stop at a step boundary (agents, flow.call) get this long
# to finish the step they are in before everything left is cancelled.
STEP_GRACE_S = 5.0
POLL_S = 0.1  # stores without notifications: how often an idle worker looks for work
FALLBACK_POLL_S = 0.25  # with LISTEN/NOTIFY: the poll that catches dead workers, expired leases, lost notifications
# After a claim or a run that failed for a reason the run's log could not take (the store unreachable), the
# next claim waits: FIRST_BACKOFF_S, doubled with each such fault in a row, at most MAX_BACKOFF_S.
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0

log = logging.getLogger("flowkernel.worker")


class Worker:
    """Claims runs for ``kernel`` and executes them, up to ``concurrency`` at once, until stopped."""

    def __init__(self, kernel: Kernel, *, concurrency: int = DEFAULT_CONCURRENCY,
                 grace_s: float = DEFAULT_GRACE_S, poll_s: float | None = None) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.kernel = kernel
        self.concurrency = concurrency
        self.grace_s = grace_s
        self._poll_s = poll_s
        self._claimed: dict[str, Claim] = {}  # run id -> the claim being executed
        self._wake = anyio.Event()
        self._stopping = False
        self._stopped = anyio.Event()
        self._step_stop = False  # the grace has ended: cooperative node runs stop at their step boundary
        self._cancel_all = False  # and then everything left is cancelled
        self.started = 0  # runs claimed since the worker started (for tests and the benchmark)
        self._faults = 0  # claims and runs in a row that failed without the run recording why

    @property
    def id(self) -> str:
        """The worker id: the owner recorded on the leases it holds (``host:pid:…``)."""
        return self.kernel.owner

    @property
    def stopping(self) -> bool:
        """True once ``stop()`` was called: no run is claimed any more."""
        return self._stopping

    @property
    def running(self) -> list[str]:
        """Ids of the runs this worker executes now."""
        return list(self._claimed)

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Register, claim and execute until ``stop()`` (then hand over and return)."""
        store = self.kernel.store
        listener = store.listen()
        now = now_ms()
        store.register_worker(WorkerRecord(workerId=self.id, host=socket.gethostname(), pid=os.getpid(),
                                           startedAt=now, heartbeatAt=now, concurrency=self.concurrency,
                                           leaseMs=self.kernel.lease_ttl_ms))
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._heartbeat)
                if listener is not None:
                    tg.start_soon(self._listen, listener)
                task_status.started()
                poll_s = self._poll_s or (POLL_S if listener is None else FALLBACK_POLL_S)
                await self._claim_loop(tg, poll_s)
                await self._hand_over()
                tg.cancel_scope.cancel()
        finally:
            if listener is not None:
                listener.close()
            with anyio.CancelScope(shield=True):
                store.remove_worker(self.id)
            self._stopped.set()

    def stop(self) -> None:
        """Stop claiming and hand the runs over (SIGTERM): no node run starts any more; those in flight
        have ``grace_s`` to finish, then agent and flow.call node runs stop at their next step boundary
        (``STEP_GRACE_S`` at most) and the rest are cancelled. Leases are released as each run is left,
        so other workers continue the runs at once. ``run()`` returns when all are handed over."""
        if not self._stopping:
            self._stopping = True
            for run_id in self._claimed:
                execution = self.kernel.executing(run_id)
                if execution is not None:
                    execution.hand_over()
            self._wake.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # -- claiming -----------------------------------------------------------------------------

    async def _claim_loop(self, tg: anyio.abc.TaskGroup, poll_s: float) -> None:
        while not self._stopping:
            if self._faults:
                await self._back_off()
                if self._stopping:
                    break
            self._wake = anyio.Event()
            free = self.concurrency - len(self._claimed)
            if free > 0:
                try:
                    claims = self.kernel.store.claim_runs(self.id, now_ms(), self.kernel.lease_ttl_ms, free,
                                                          dead=self._dead_owners())
                except FlowkernelError as exc:
                    log.warning("cannot claim runs: %s", exc)
                    self._faults += 1
                    continue
                if not claims:
                    self._faults = 0
                for claim in claims:
                    self._claimed[claim.runId] = claim
                    self.started += 1
                    tg.start_soon(self._execute, claim)
                if len(claims) == free:
                    continue  # there may be more: claim again before waiting
            with anyio.move_on_after(poll_s):
                await self._wake.wait()

    async def _back_off(self) -> None:
        """Wait before claiming again after faults in a row (stop() cuts it short): a run that cannot be
        executed here for a passing reason stays claimable, and is not claimed again and again meanwhile."""
        delay = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (self._faults - 1))
        deadline = anyio.current_time() + delay
        while not self._stopping and anyio.current_time() < deadline:
            self._wake = anyio.Event()
            with anyio.move_on_after(deadline - anyio.current_time()):
                await self._wake.wait()

    def _dead_owners(self) -> list[str]:
        """Workers on this host whose process is gone: their leases are void now, not at expiry."""
        dead = []
        for w in self.kernel.store.list_workers():
            if w.workerId != self.id and owner_dead(w.workerId):
                dead.append(w.workerId)
        return dead

    async def _execute(self, claim: Claim) -> None:
        kernel = self.kernel
        run_id = claim.runId
        if claim.status == "queued":
            log.info("claimed %s (queued)", run_id)
        else:
            log.info("claimed %s to recover it: the process that executed it is gone", run_id)
        began = time.monotonic()
        try:
            if claim.status == "queued" and is_rerun(kernel.store.get_run(run_id)):
                snap = await execute_rerun(kernel, run_id, claim.lease)
            else:
                snap = await kernel.recover(run_id, claim.lease, on_execution=self._watch)
            _ended(snap, time.monotonic() - began, stopping=self._stopping)
        except LeaseLostError as exc:
            log.warning("%s: %s", run_id, exc)
        except FlowkernelError as exc:
            # Recorded in the run (it ended failed, saying why) or not (the store is unreachable): either
            # way the next claim waits a little, longer with each such run in a row.
            self._faults += 1
            log.error("%s", exc if run_id in str(exc) else f"{run_id}: {exc}")
        except Exception as exc:  # a bug in a node type or the kernel must not take the worker down
            self._faults += 1
            log.error("%s stopped by an unexpected error: %r", run_id, exc)
        finally:
            self._claimed.pop(claim.runId, None)
            self._wake.set()

    def _watch(self, execution: RunExecution) -> None:
        """Called as each claimed run starts executing: a worker that is stopping hands it over at once."""
        self._faults = 0
        if self._stopping:
            execution.hand_over()
            if self._step_stop:
                execution.stop_node_runs(cooperative=not self._cancel_all)

    # -- background ---------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        store = self.kernel.store
        while True:
            await anyio.sleep(self.kernel.lease_ttl_ms / 3000)
            try:
                now = now_ms()
                store.heartbeat(self.id, now)
                for w in store.list_workers():
                    # A dead worker's row goes once none of its runs is left to take over (the row is
                    # how the others know its leases are void); a silent one's after ten lease times.
                    gone = w.workerId != self.id and (owner_dead(w.workerId) or now - w.heartbeatAt > 10 * w.leaseMs)
                    if gone and not w.runs:
                        store.remove_worker(w.workerId)
            except FlowkernelError as exc:
                log.warning("heartbeat failed: %s", exc)

    async def _listen(self, listener: Any) -> None:
        lost = 0  # failed attempts in a row: said once, retried less and less often, said again when back
        while True:
            try:
                got = await anyio.to_thread.run_sync(listener.wait, FALLBACK_POLL_S, abandon_on_cancel=True)
            except FlowkernelError as exc:
                if not lost:
                    log.warning("lost the notification connection (%s); polling meanwhile", exc)
                lost += 1
                await anyio.sleep(min(MAX_BACKOFF_S, FALLBACK_POLL_S * 2 ** (lost - 1)))
                continue
            if lost:
                log.info("notification connection back")
                lost = 0
            if got:
                self._wake.set()

    async def _hand_over(self) -> None:
        """Wait for the claimed runs to be left: grace for node runs, then a step for cooperative ones."""
        with anyio.move_on_after(self.grace_s):
            await self._until_idle()
        if not self._claimed:
            return
        self._step_stop = True
        self._each(lambda ex: ex.stop_node_runs(cooperative=True))
        with anyio.move_on_after(STEP_GRACE_S):
            await self._until_idle()
        self._cancel_all = True
        self._each(lambda ex: ex.stop_node_runs(cooperative=False))
        await self._until_idle()

    def _each(self, action: Callable[[RunExecution], None]) -> None:
        for run_id in list(self._claimed):
            execution = self.kernel.executing(run_id)
            if execution is not None:
                action(execution)

    async def _until_idle(self) -> None:
        while self._claimed:
            self._wake = anyio.Event()
            await self._wake.wait()


def _ended(snap: RunSnapshot, seconds: float, *, stopping: bool) -> None:
    """One line: how the execution of a claimed run ended here."""
    run_id, status = snap.runId, snap.status
    if status == "running":  # left for another executor: the worker stopped (or lost interest)
        log.info("handed %s over after %.2f s%s", run_id, seconds, " (stopping)" if stopping else "")
    elif status == "failed":
        log.warning("%s failed after %.2f s: %s", run_id, seconds, snap.error)
    elif status == "waiting":
        log.info("%s waits for a reply (after %.2f s); a reply hands it back to the workers", run_id, seconds)
    else:
        log.info("%s %s after %.2f s", run_id, status, seconds)
