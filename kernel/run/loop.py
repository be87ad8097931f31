"""The run shell: executes node tasks, feeds their events through the reducer, persists.

One ``RunExecution`` per executing run, owning a task group; every node run is a task in it.
The loop is: receive what nodes and commands send → stamp and apply each event → ask the
scheduling rules what follows → commit events and snapshot in one transaction → only then start
the node runs that were decided. Transitions that arrive together are committed together.

The loop holds the run's collaborators and calls them in that order: ``Appender`` (run/append.py:
stamp, encode, apply), ``Decisions`` (run/decisions.py: what the rules are asked next), ``NodeRuns``
(run/node_runs.py: in flight, attempts, retries, timeouts), ``Causes`` (core/causes.py: each decided
event's ``cause``), ``CommitPolicy`` (run/commit_policy.py: when to commit, checkpoints, listeners)
and ``BudgetWatch`` (run/budget_watch.py); messages other than events are in run/mailbox.py.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup
from flowkernel.core.causes import Causes
from flowkernel.core.commands import Command, CommandOutcome, judge_command, refusal
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import (
    AgentUsage,
    BaseEvent,
    EdgeFire,
    EdgeSkip,
    FlowComplete,
    FlowPaused,
    LoopIterate,
    NodeComplete,
    NodeError,
    NodeSkipped,
    NodeStart,
    NodeWaiting,
    StatePatch,
)
from flowkernel.core.expression_scope import Scope, limits_from_env
from flowkernel.core.node_context import ChildRuns
from flowkernel.core.services import RunServices
from flowkernel.core.snapshot import InboxMessage, RunSnapshot
from flowkernel.errors import KernelFault, LeaseLostError, StoreError
from flowkernel.history.agent_runs import AgentRunFold
from flowkernel.ids import new_node_run_id
from flowkernel.plugins.registry import Registry
from flowkernel.run.append import Appender, View
from flowkernel.run.budget_watch import BudgetWatch
from flowkernel.run.commit_policy import CommitPolicy, Durable
from flowkernel.run.commit_policy import EventListener as EventListener  # what the Kernel imports from here
from flowkernel.run.committer import Committer
from flowkernel.run.decisions import Decisions
from flowkernel.run.mailbox import CostCheck, Finished, Incoming, Message, Wake
from flowkernel.run.node_context import ShellNodeContext
from flowkernel.run.node_runs import NodeRuns, first_error
from flowkernel.run.offload import CANCELLED, call_off_loop
from flowkernel.run.tuning import Tuning
from flowkernel.store.base import Lease, Store
from flowkernel.store.fenced import fenced
from flowkernel.telemetry import traces as telemetry

COMMAND_POLL_S = 0.05
YIELD_EVERY_S = 0.01


class RunExecution:
    """Executes one run from its current snapshot until it stops (completes, fails, pauses, waits)."""

    def __init__(self, *, flow: CompiledFlow, snapshot: RunSnapshot, store: Store, registry: Registry,
                 listeners: list[EventListener] | None = None, services: RunServices | None = None,
                 tuning: Tuning | None = None, checkpoint_size: int = 0, lease: Lease | None = None,
                 committer: Committer | None = None,
                 children: Callable[[ShellNodeContext], ChildRuns] | None = None) -> None:
        self.flow = flow
        self.registry = registry
        self.store = store
        # The run's snapshot and what was appended since the last commit. The run's agent runs still
        # open are kept in the agent_runs table by each commit (flows with agents).
        self.appender = Appender(flow, snapshot, agents=AgentRunFold.for_run(flow, snapshot, store, registry))
        self._services = services or RunServices()
        self._tuning = tuning or Tuning()
        self._children = children
        # What node runs and commands hand to the loop, in order; ``_wakeup`` is set while it waits.
        self._queue: deque[Message] = deque()
        self._wakeup: anyio.Event | None = None
        self._nodes = NodeRuns(self, flow, registry)  # in flight, decided, and each one's attempts
        # When appended events are committed and who is told. The committer is shared by the runs a
        # kernel executes at once: their commits share transactions. Every commit is checked against
        # the lease (fencing), and the commit that stops the run with no node run left ends it.
        self._policy = CommitPolicy(committer or Committer(store), lease, self._tuning.observability_commit_ms / 1000,
                                    checkpoint_size, listeners or [], self.snap.usage)
        self._pause = False
        self._pause_event = anyio.Event()
        self._yielded = time.monotonic()
        self._causes = Causes(flow)  # what each decided event's ``cause`` is
        self.stop_reason: str | None = None
        self._tg: TaskGroup | None = None
        self.node_store = fenced(store, lease)
        self._lost: LeaseLostError | None = None  # set once another execution has taken the run over
        # Handing the run over (a worker shutting down): no node run starts; ``_draining`` is set then.
        self._draining = False
        self._limits = self._services.expression_limits or limits_from_env()
        self._decisions = Decisions(flow, self._limits)  # what the scheduling rules are asked next
        self._budget = BudgetWatch(flow, store, self._tuning.budget_poll_s)

    # -- what node contexts use -------------------------------------------------------------

    @property
    def snap(self) -> RunSnapshot:
        return self.appender.snap

    @property
    def lease_released(self) -> bool:
        return self._policy.lease_released

    @property
    def lease_releasing(self) -> bool:
        """A commit that ends the lease is being made (in another thread, with other runs' commits): the
        lease may be gone from the store before ``lease_released`` is set."""
        return self._policy.lease_releasing

    @property
    def services(self) -> RunServices:
        return self._services

    def children_for(self, ctx: ShellNodeContext) -> ChildRuns:
        """The child runs a node run may start (given by the Kernel that executes this run)."""
        if self._children is None:
            raise KernelFault("this execution of the run cannot start child runs (it was made without a Kernel)")
        return self._children(ctx)

    def current_state(self) -> dict[str, Any]:
        return self.snap.state

    def current_snapshot(self) -> RunSnapshot:
        return self.snap

    def current_inbox(self, run_id: str) -> list[InboxMessage]:
        return self.snap.inbox.get(run_id, [])

    def _put(self, msg: Message) -> None:
        self._queue.append(msg)
        if self._wakeup is not None:
            self._wakeup.set()
        if type(msg) is Incoming and msg.command.kind in ("pause", "abort"):
            self._decisions.abandon()

    def finished(self, node_id: str, item: int | None, pause: FlowPaused | None) -> None:
        self._put(Finished(node_id, item, pause))

    def submit(self, draft: BaseEvent) -> None:
        self._put(draft)

    def submit_patch(self, draft: StatePatch, base: dict[str, Any], patched: dict[str, Any]) -> None:
        """A state patch, and the state its node run sees after it (``patched``, computed from the run's
        state ``base``): if the node run finishes while the run's state is still ``base``, the shell
        takes that state instead of applying the staged patches again."""
        run_id, views = draft.runId or "", self.appender.views
        view = views.get(run_id)
        views[run_id] = View(base, patched, (view.count if view else 0) + 1, view is None or view.exact)
        self._put(draft)

    async def submit_durable(self, draft: BaseEvent) -> None:
        req = Durable(draft)
        self._put(req)
        await req.done.wait()
        if req.error is not None:
            raise req.error

    def pause_requested(self) -> bool:
        return self._pause

    async def wait_for_pause(self) -> None:
        await self._pause_event.wait()

    def deliver(self, command: Command, command_id: int | None = None,
                reply: Callable[[CommandOutcome], None] | None = None) -> None:
        """Hand a command to this execution (from this process or the store's command queue)."""
        self._put(Incoming(command, command_id, reply))

    # -- the loop ---------------------------------------------------------------------------

    async def execute(self, first: list[BaseEvent],
                      background: list[Callable[[RunExecution], Coroutine[Any, Any, None]]] | None = None) -> RunSnapshot:
        """Append ``first`` (e.g. ``flow:resumed``), then run until the run stops.

        ``background`` tasks (command polling, lease renewal) live in the run's task group and are
        cancelled when it stops. Traced (``flowkernel.telemetry.traces``) as one ``invoke_workflow`` span.
        """
        with telemetry.run_execution(self._services.tracer_provider, self.store, self.flow.name,
                                     self.snap.runId) as span:
            snap = await self._execute(first, background)
            span.set("flowkernel.run.status", snap.status)
            if snap.status == "failed":
                span.fail("run_failed", snap.error or "")
        return snap

    async def _execute(self, first: list[BaseEvent],
                       background: list[Callable[[RunExecution], Coroutine[Any, Any, None]]] | None) -> RunSnapshot:
        self._policy.committer.executing += 1
        try:
            return await self._run(first, background)
        finally:
            self._policy.committer.executing -= 1

    async def _run(self, first: list[BaseEvent],
                   background: list[Callable[[RunExecution], Coroutine[Any, Any, None]]] | None) -> RunSnapshot:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for task in background or []:
                    tg.start_soon(task, self)
                if self._budget.watches_children(self.snap):
                    tg.start_soon(self._budget.watch_children, self.current_snapshot, functools.partial(
                        self._put, CostCheck()))
                self._decisions.awake_later = True
                try:
                    for draft in first:
                        self._append(draft)
                finally:
                    self._decisions.awake_later = False
                self._decisions.wake(self.snap)
                await self._step()
                while (self.snap.status == "running" or self._nodes.active) and self._lost is None:
                    if self._draining and not self._nodes.active:
                        break  # handed over: the run stays running, for the next executor to continue
                    if self.snap.status != "running":
                        self._stop_tasks()
                        if not self._nodes.active:
                            break
                    now = time.monotonic()
                    if now - self._yielded > YIELD_EVERY_S:
                        # Inline nodes never await: let the command poller and lease renewal run.
                        self._yielded = now
                        await anyio.lowlevel.checkpoint()
                    if not self._queue:
                        self._wakeup = anyio.Event()
                        if self._policy.flush_at is None:
                            await self._wakeup.wait()
                        else:  # observability events are waiting: until they are due, at the latest
                            with anyio.move_on_after(self._policy.flush_at - time.monotonic()):
                                await self._wakeup.wait()
                        self._wakeup = None
                        self._yielded = time.monotonic()
                    batch = list(self._queue)
                    self._queue.clear()
                    for m in batch:
                        if isinstance(m, Incoming) and self._judged_in_thread(m.command):
                            await self._judge_off_loop(m)
                        else:
                            self._handle(m)
                    if self._lost is None:
                        await self._step()
                if self._lost is None:
                    await self._commit(wait=False)
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The task group wraps whatever stopped it; callers (and the CLI's one-line errors) want
            # the error itself.
            raise first_error(group) from None
        if self._lost is not None:
            raise self._lost
        return self.snap

    def lose_lease(self, error: LeaseLostError) -> None:
        """Another execution took the run over (seen when renewing): stop at once, commit nothing more."""
        if self._lost is None:
            self._lost = error
            self.appender.take()
            self._policy.forget()
            self._stop_all()
            if self._tg is not None:
                self._tg.cancel_scope.cancel()

    def hand_over(self) -> None:
        """Stop starting node runs; the execution ends when those in flight have finished (or been
        stopped with ``stop_node_runs``), leaving the run ``running`` for another executor."""
        self._draining = True
        self._decisions.abandon()
        self._put(Wake())

    def stop_node_runs(self, *, cooperative: bool) -> None:
        """While handing over: cancel the node runs in flight, except, with ``cooperative``, those of
        node types that stop at their next step boundary when asked (their step is stored; the next
        executor resumes them)."""
        if cooperative:
            self._pause = True
            self._pause_event.set()
        self._nodes.stop(cooperative=cooperative)
        self._put(Wake())

    def _stop_all(self) -> None:
        self._nodes.stop(cooperative=False)

    def _handle(self, msg: Message) -> None:
        if isinstance(msg, BaseEvent):
            if msg.nodeId is not None and self._nodes.stale(msg, self.snap):
                return  # a node run that was cancelled (run stopped, loop reset): its late words change nothing
            self._append(msg)
            if self._budget.concerns(msg):
                self._check_budget(msg.nodeId if type(msg) is AgentUsage else None)
        elif isinstance(msg, Durable):
            if msg.draft.nodeId is not None and self._nodes.stale(msg.draft, self.snap):
                msg.error = anyio.get_cancelled_exc_class()()
                msg.done.set()
                return
            try:
                self._append(msg.draft)
            except Exception as exc:
                msg.error = exc
                msg.done.set()
                return
            self._policy.waiters.append(msg)
        elif isinstance(msg, Incoming):
            self._handle_command(msg)
        elif isinstance(msg, CostCheck):
            self._check_budget(None)
        elif isinstance(msg, Finished):
            self._nodes.gone(msg.node_id, msg.item)
            if msg.pause is not None and self.snap.status == "running" and not self._draining:
                msg.pause.cause = self.snap.seq
                self._pause_now(msg.pause)
        # Wake: nothing to apply; the loop looks at its state again

    def _takes_messages(self, node_id: str) -> bool:
        node = self.flow.nodes[node_id]
        return self.registry.takes_messages(node.type, node.raw_input)

    def _judged_in_thread(self, cmd: Command) -> bool:
        """Whether judging ``cmd`` validates content against a JSON Schema from the flow: its patterns may
        take up to the expression time limit, which the event loop must not wait out."""
        return cmd.kind in ("reply", "send") and any(w.schema is not None for w in self.snap.waiting.values())

    async def _judge_off_loop(self, msg: Incoming) -> None:
        # Nothing else is applied meanwhile: the judge sees the snapshot the command is handled on.
        judge = functools.partial(judge_command, self.flow, self.snap, msg.command, executing=True,
                                  takes_messages=self._takes_messages)
        judged: CommandOutcome | Exception
        try:
            result = await call_off_loop(Scope(self._limits), judge)
            judged = result if result is not CANCELLED else RuntimeError("the check was cancelled")
        except Exception as exc:
            judged = exc
        self._handle_command(msg, judged)

    def _handle_command(self, msg: Incoming, judged: CommandOutcome | Exception | None = None) -> None:
        try:
            if isinstance(judged, Exception):
                raise judged
            outcome = judged or judge_command(self.flow, self.snap, msg.command, executing=True,
                                                        takes_messages=self._takes_messages)
            if msg.command_id is not None:
                outcome.record.commandId = str(msg.command_id)
            received = self._append(outcome.record)
        except Exception as exc:
            # Whatever a command holds, it must not stop the run (nor, left queued, the next executor):
            # it is refused, with what went wrong, and taken off the queue like any other.
            outcome = refusal(msg.command, f"the command could not be handled: {type(exc).__name__}: {exc}",
                              invalid=True)
            if msg.command_id is not None:
                outcome.record.commandId = str(msg.command_id)
            received = self._append(outcome.record)
        if msg.command_id is not None:
            self._policy.taken.append((msg.command_id, received.seq))
        if outcome.accepted:
            if msg.command.kind == "pause":
                self._pause_now(FlowPaused(reason=msg.command.reason or "pause requested", cause=received.seq))
            elif msg.command.kind == "abort":
                self.stop_reason = "abort"
                self._append(FlowComplete(status="aborted", error=msg.command.reason or "aborted", cause=received.seq))
        if msg.reply is not None:
            msg.reply(outcome)

    def _pause_now(self, paused: FlowPaused) -> None:
        """Pause the run: cooperative node runs finish their step (an agent its model call and tools,
        stored) and stop at their next turn boundary; the others are cancelled."""
        self._pause = True
        self._pause_event.set()
        self.stop_reason = "pause"
        if self._tg is not None:
            self._tg.start_soon(self._end_grace)
        self._append(paused)

    def _check_budget(self, node_id: str | None) -> None:
        """Pause when what was spent reached a limit (``BudgetWatch.over``)."""
        if self.snap.status != "running":
            return
        paused = self._budget.over(self.snap, node_id)
        if paused is not None:
            paused.cause = self.snap.seq
            self._pause_now(paused)

    def _append(self, draft: BaseEvent) -> BaseEvent:
        """Append one event (``Appender.append``), then let the loop's own mechanisms follow it."""
        event, touched, size = self.appender.append(draft)
        self._decisions.follow(event, touched, self.snap)
        cls = type(event)
        if cls in _ENDS:
            self._nodes.ended(event, self.snap)  # type: ignore[arg-type]
        elif cls is LoopIterate:
            self._nodes.cancel(self.flow.reset_sets[event.edgeId])  # type: ignore[attr-defined]
        if cls in _CAUSING:
            self._causes.applied(event)
        self._policy.note(event, size)
        return event

    def _room(self) -> int:
        """How many more node runs may start now; none while the run is handed over."""
        return 0 if self._draining else self.flow.max_concurrency - len(self._nodes.active)

    async def _step(self) -> None:
        decisions, nodes = self._decisions, self._nodes
        while self.snap.status == "running":
            room = self._room()
            candidates = decisions.candidates(room)
            running, finish = self.flow.max_concurrency - room, not decisions.waiting
            decision = decisions.decide(self.snap, candidates, running, finish)
            if decision is None:
                # What is decided so far is saved, shown and started before an open expression computes.
                await self._commit()
                if self._lost is not None:
                    return
                await nodes.launch(self._tg)
                decision = await decisions.decide_off_loop(self._tg, self.snap, candidates, running, finish)
                if decision is None:
                    # A pause, abort or hand-over came in meanwhile: it goes first; these are decided again after.
                    decisions.dirty |= candidates
                    break
            decisions.defer(decision.deferred)
            if not decision.drafts:
                if decisions.waiting and self._room() > 0:
                    continue  # those handed over could not start: hand over the next ones
                break
            starts: list[NodeStart] = []
            for draft in decision.drafts:
                if draft.cause is None:
                    draft.cause = self._causes.cause_of(draft, self.snap.seq)
                if isinstance(draft, NodeStart) and not draft.runId:
                    draft.runId = new_node_run_id()
                    starts.append(draft)
                    nodes.decided(draft, self.snap)
                self._append(draft)
            for s in starts:  # a start followed by its own error (bad binding) or a forEach group: no task
                nodes.to_launch(s, self.snap)
            if not decisions.dirty and nodes.active and not (decisions.waiting and self._room() > 0):
                break  # nothing to look at again, and the run cannot end with node runs in flight
        await self._commit()
        if self._lost is not None:
            return
        await nodes.launch(self._tg)

    async def _commit(self, *, wait: bool = True) -> None:
        """Commit what was appended since the last commit (``CommitPolicy.commit``)."""
        try:
            await self._policy.commit(self.appender, active=bool(self._nodes.active), wait=wait)
        except LeaseLostError as exc:
            self.lose_lease(exc)  # another execution has the run now: stop here, write nothing more
        except StoreError:
            self._stop_tasks()  # never run on with unsaved state: stop every node and surface the failure
            raise

    async def _end_grace(self) -> None:
        """Cooperative nodes get a grace period to finish their step on pause; then they are cancelled."""
        await anyio.sleep(self._tuning.pause_grace_s)
        self.stop_reason = "pause-timeout"
        self._put(Wake())

    def _stop_tasks(self) -> None:
        """Cancel the node runs in flight; on pause, cooperative node types finish their step."""
        if self.stop_reason is None:
            self.stop_reason = "failed" if self.snap.status == "failed" else self.snap.status
        self._nodes.stop(cooperative=self.stop_reason == "pause")


_ENDS = frozenset({NodeComplete, NodeSkipped, NodeError, NodeWaiting})  # a node run is no longer in flight
_CAUSING = frozenset({NodeComplete, NodeSkipped, NodeError, EdgeFire, EdgeSkip, LoopIterate})  # what Causes follows
