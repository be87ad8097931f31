"""Control: commands to runs (delivered to the execution here, queued for the process that executes
the run, or judged and recorded here when none does), the replies and messages that continue a run,
resume and retry, and the hand-back of a pooled run to the workers.

What blocks on the store runs in worker threads, so that a caller's event loop (the server's) never
waits on it; a command to a run executing in this process is delivered on the loop it executes on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import anyio.to_thread
from flowkernel.core.commands import Command, CommandOutcome, judge_command
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import BaseEvent, CommandReceived, FlowComplete, FlowPaused, FlowResumed
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.errors import CommandRejectedError, InvalidInputError, NotPooledError, RunBusyError
from flowkernel.run.execution import Executor
from flowkernel.run.judged import Before, Refused, continue_stopped, raise_if_refused
from flowkernel.run.loop import EventListener


class Accepted(NamedTuple):
    """A command accepted: the seq of the ``command:received`` that accepted it."""

    seq: int


class Control:
    """Commands and continuations of runs, over the executor of this process."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.store, self.reads, self.leases = executor.store, executor.reads, executor.leases
        self.flows, self.setup, self.judge, self.inbox = executor.flows, executor.setup, executor.judge, executor.inbox

    # -- commands ----------------------------------------------------------------------------------

    async def command(self, run_id: str, cmd: Command, *, timeout_s: float = 10.0) -> CommandOutcome:
        """Issue a command to a run. If this process executes it, it is delivered directly; if another
        process does, it goes through the store; if none does, it is judged and recorded here.
        An accepted abort also aborts the run's unfinished child runs."""
        outcome = await self._command(run_id, cmd, timeout_s)
        if cmd.kind == "abort":
            for child in await anyio.to_thread.run_sync(lambda: self.reads.runs(parent=run_id)):
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
        execution = self.executor.executing(run_id)
        if execution is not None:
            result: list[CommandOutcome] = []
            done = anyio.Event()

            def reply(outcome: CommandOutcome) -> None:
                result.append(outcome)
                done.set()

            execution.deliver(cmd, reply=reply)
            with anyio.fail_after(timeout_s):
                await done.wait()
            return raise_if_refused(result[0])
        outcome = await anyio.to_thread.run_sync(self._record_here, run_id, cmd)
        if outcome is None:  # another process executes the run
            outcome = await self.inbox.via_store(run_id, cmd, timeout_s)
        return raise_if_refused(outcome)

    def _record_here(self, run_id: str, cmd: Command) -> CommandOutcome | None:
        """Judge and record ``cmd`` under the run's lease (nobody executes the run); None when a live
        process holds the lease."""
        try:
            lease = self.leases.acquire(run_id)
        except RunBusyError:
            return None
        try:
            snap = self.reads.snapshot(run_id)
            flow = self.flows.of_run(run_id)
            outcome = judge_command(flow, snap, cmd, executing=False, takes_messages=self.flows.message_takers(flow))
            drafts: list[BaseEvent] = [outcome.record]
            if outcome.accepted and cmd.kind == "pause":  # nobody executes the run: it takes effect here
                drafts.append(FlowPaused(reason=cmd.reason or "pause requested"))
            elif outcome.accepted and cmd.kind == "abort":
                drafts.append(FlowComplete(status="aborted", error=cmd.reason or "aborted"))
            if snap.status == "queued":
                if not outcome.accepted:  # nothing is recorded before a run's flow:start
                    return outcome
                # Aborting a queued run starts its log: flow:start, the command, flow:complete.
                snap = self.executor.creation.start_queued(self.flows.of_run(run_id), self.store.get_run(run_id),
                                                           lease).snapshot
            self.judge.append_now(snap, drafts, lease)
            return outcome
        finally:
            self.store.release_lease(run_id, lease)

    async def accept(self, run_id: str, cmd: Command) -> Accepted:
        """Issue ``cmd`` (see ``command``) and continue nothing here: a ``reply`` or ``send`` that lands in
        a run of the worker pool that nobody executes hands the run back to the workers, who carry on
        with it. Returns the seq of the ``command:received`` that accepted it (refusals raise
        CommandRejectedError)."""
        outcome = await self.command(run_id, cmd)
        if cmd.kind in ("reply", "send"):
            await anyio.to_thread.run_sync(self._hand_back, run_id)
        return Accepted(outcome.record.seq)

    def _hand_back(self, run_id: str) -> bool:
        """After a reply or send: a pooled run nobody executes goes back to the workers. True when the
        run is not the workers' and nobody executes it (the caller may continue it)."""
        record = self.store.get_run(run_id)
        if self.executor.executing_here(run_id) or record.leaseOwner is not None:
            return False
        if record.pooled:
            self.hand_to_pool(run_id, continue_stopped)
            return False
        return True

    # -- replies and messages ----------------------------------------------------------------------

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
        return snap if snap is not None else self.reads.snapshot(run_id)

    async def deliver(self, run_id: str, cmd: Command, *, on_event: EventListener | None = None,
                      on_accepted: Callable[[CommandOutcome], None] | None = None,
                      ) -> tuple[CommandOutcome, RunSnapshot | None]:
        """Issue a ``send`` or ``reply``; if no process executes the run, continue it here until it stops
        (a pooled run is handed back to the workers instead).

        Returns the command's outcome and, when this call executed the run, its snapshot then (None
        when another process or the workers execute it). What the run needs to execute here (its settings) is
        checked before the command is recorded."""
        record = self.store.get_run(run_id)
        if not self.reads.executed(record) and not record.pooled:
            # Nobody executes the run: this process will. It must be able to before the command counts.
            self.setup.prepare(record)
        outcome = await self.command(run_id, cmd)
        if on_accepted is not None:
            on_accepted(outcome)
        if not await anyio.to_thread.run_sync(self._hand_back, run_id):
            return outcome, None
        return outcome, await self.executor.continue_run(run_id, on_event=on_event)

    # -- resume, retry, and the worker pool ----------------------------------------------------------

    def resuming(self, run_id: str, message: str | None = "continue", *, budget: float | None = None,
                 flow: CompiledFlow | None = None) -> Before:
        """The judged first events of a resume of ``run_id`` (see ``resume``)."""
        cmd = Command(kind="resume", content=message, budget=budget)
        # (a budget that is not a positive number is refused by the judge before this is appended)
        usd = float(budget) if isinstance(budget, int | float) and not isinstance(budget, bool) else None
        return self.judge.judged(run_id, cmd, lambda snap: FlowResumed(message=message, budgetUsd=usd,
                                                                       retry=snap.status == "failed"), flow)

    def retrying(self, run_id: str, *, message: str | None = None, flow: CompiledFlow | None = None) -> Before:
        """The judged first events of a retry of ``run_id`` (see ``retry``)."""
        return self.judge.judged(run_id, Command(kind="retry"),
                                 lambda snap: FlowResumed(message=message, retry=True), flow)

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
        before = self.resuming(run_id, message, budget=budget, flow=flow)
        if queue:
            return self.hand_to_pool(run_id, before)
        return await self.executor.execute(run_id, on_event=on_event, before=before)

    async def retry(self, run_id: str, *, message: str | None = None, on_event: EventListener | None = None,
                    queue: bool = False, flow: CompiledFlow | None = None) -> RunSnapshot:
        """Re-run the failed nodes of a failed run (fresh attempts; the history stays); ``message`` goes to
        every interrupted node run, as for resume; ``queue`` and ``flow`` as for resume."""
        before = self.retrying(run_id, message=message, flow=flow)
        if queue:
            return self.hand_to_pool(run_id, before)
        return await self.executor.execute(run_id, on_event=on_event, before=before)

    async def continue_in_pool(self, run_id: str, kind: str, *, message: str | None = None,
                               budget: float | None = None,
                               flow: CompiledFlow | str | Path | dict[str, Any] | None = None) -> Accepted:
        """Resume (``kind="resume"``) or retry a run of the worker pool through the workers (one claims
        it); ``flow`` as ``flow_for_run`` takes it. Returns the seq of the accepting ``command:received``.
        A run a ``flowkernel run`` process started raises NotPooledError: that process's kind continues it."""
        return await anyio.to_thread.run_sync(lambda: self._to_pool(run_id, kind, message, budget, flow))

    def _to_pool(self, run_id: str, kind: str, message: str | None, budget: float | None,
                 flow: CompiledFlow | str | Path | dict[str, Any] | None) -> Accepted:
        if not self.store.get_run(run_id).pooled:
            raise NotPooledError(f"run {run_id} was started by a `flowkernel run` process, not queued for the "
                                 f"workers: continue it with `flowkernel {kind} {run_id}`")
        if flow is not None and not isinstance(flow, CompiledFlow):
            flow = self.setup.flow_for_run(run_id, flow)
        before = self.resuming(run_id, message, budget=budget, flow=flow) if kind == "resume" else \
            self.retrying(run_id, message=message, flow=flow)
        _, appended = self._to_workers(run_id, before)
        # The drafts were stamped as they were appended: the command's own seq, not one counted back.
        seq = next(d.seq for d in appended if isinstance(d, CommandReceived))
        return Accepted(seq)

    def hand_to_pool(self, run_id: str, before: Before) -> RunSnapshot:
        """Continue a stopped pooled run through the workers instead of in this process: append the
        events ``before`` returns (a resume, a retry, the ``flow:resumed`` after a reply) and leave the
        run ``running`` with no lease, so that a worker claims it and carries on."""
        return self._to_workers(run_id, before)[0]

    def _to_workers(self, run_id: str, before: Before) -> tuple[RunSnapshot, list[BaseEvent]]:
        lease = self.leases.acquire(run_id)
        try:
            snap = self.reads.snapshot(run_id)
            if snap.status == "queued":
                self.executor.refuse_queued(self.store.get_run(run_id))
            try:
                drafts = before(snap)
            except Refused as refused:
                self.judge.append_now(snap, [refused.outcome.record], lease)
                raise_if_refused(refused.outcome)
            if not drafts:
                return snap, []
            snap = self.judge.append_now(snap, drafts, lease, release=True)
            self.flows.follow(snap, self.store.get_run(run_id))
            return snap, drafts
        finally:
            self.store.release_lease(run_id, lease)
