"""The run shell: executes node tasks, feeds their events through the reducer, persists.

One ``RunExecution`` per executing run, owning a task group; every node run is a task in it.
The loop is: receive what nodes and commands send → stamp and apply each event → ask the
scheduling rules what follows → commit events and snapshot in one transaction → only then start
the node runs that were decided. Transitions that arrive together are committed together.
"""

from __future__ import annotations

import functools
import heapq
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
from anyio.abc import TaskGroup
from flowkernel.core.budgets import has_budgets, over_budget, run_limit
from flowkernel.core.commands import Command, CommandOutcome, judge_command, refusal
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import (
    AgentCompaction,
    AgentError,
    AgentText,
    AgentTextDelta,
    AgentThinking,
    AgentThinkingDelta,
    AgentTool,
    AgentUsage,
    BaseEvent,
    EdgeFire,
    EdgeSkip,
    FlowComplete,
    FlowPaused,
    FlowResumed,
    FlowWaiting,
    LoopExhausted,
    LoopIterate,
    NodeComplete,
    NodeError,
    NodeSkipped,
    NodeStart,
    NodeWaiting,
    StatePatch,
    decode,
    encoder,
)
from flowkernel.core.expression_scope import INLINE_ONLY, NeedsThread, Scope, limits_from_env, set_scope
from flowkernel.core.expressions import is_constant
from flowkernel.core.node import Interrupted, WaitFor
from flowkernel.core.node_context import ChildRuns
from flowkernel.core.nonfinite import check_encoded, refuse_non_finite
from flowkernel.core.reducer import ALL, apply, own
from flowkernel.core.scheduling import Decision, Progress, awake, decide
from flowkernel.core.services import RunServices
from flowkernel.core.snapshot import InboxMessage, RunSnapshot
from flowkernel.errors import FlowkernelError, KernelFault, LeaseLostError, NodeFailure, StoreError
from flowkernel.history.agent_runs import FOLDED, AgentRunFold
from flowkernel.ids import new_node_run_id
from flowkernel.plugins.registry import Registry
from flowkernel.redaction import holds_secret, redact_bytes
from flowkernel.run.committer import Committer
from flowkernel.run.node_context import ShellNodeContext
from flowkernel.run.offload import CANCELLED, call_off_loop
from flowkernel.run.tuning import Tuning
from flowkernel.store.base import CommitRequest, EventRow, Lease, RunTotals, Store
from flowkernel.store.checkpoint import encode_checkpoint
from flowkernel.store.fenced import fenced
from flowkernel.store.packing import LEAF, PACKED_PREFIX, Packer
from flowkernel.telemetry import traces as telemetry
from msgspec.structs import replace

# Called with each committed event. A listener with a ``batch(events)`` method gets the events of each
# commit in one call instead (a view that writes to a stream flushes it once per commit, not per line).
EventListener = Callable[[BaseEvent], None]

CHECKPOINT_MIN_BYTES = 64 * 1024
# A new checkpoint once the events since the last one weigh this many times its size: checkpoints
# then cost at most half of what the events cost, and resume folds at most that much log.
CHECKPOINT_SPACING = 2
COMMAND_POLL_S = 0.05
# Events that only show what a node is doing (a model's streamed text, its tool calls, what a call
# cost) are committed at most once per ``Tuning.observability_commit_ms`` per run, with whatever follows
# them; a transition (node, edge, loop, flow, command or state event) is committed at once, with every
# event before it.
YIELD_EVERY_S = 0.01


# The loop's messages are msgspec structs: a dataclass costs each process that imports it half a
# millisecond to build, a struct a twentieth of that.
class _Durable(msgspec.Struct):
    draft: BaseEvent
    done: anyio.Event = msgspec.field(default_factory=anyio.Event)
    error: BaseException | None = None


class _Incoming(msgspec.Struct):
    command: Command
    command_id: int | None = None
    reply: Callable[[CommandOutcome], None] | None = None


class _Finished(msgspec.Struct):
    """A node run ended without an event (interrupted at a step boundary by a pause)."""

    node_id: str
    item: int | None
    pause: FlowPaused | None = None  # it stopped of its own accord: the run pauses (node.Interrupted)


class _View(msgspec.Struct):
    """The state a node run sees after its patches (``patched``), computed from the run's ``base``."""

    base: dict[str, Any]
    patched: dict[str, Any]
    count: int  # patches it has submitted
    exact: bool  # every one was applied as submitted (no JSON normalisation changed it)


class _Wake(msgspec.Struct):
    """Nothing to apply: makes the loop look at its state again."""


class _CostCheck(msgspec.Struct):
    """Look at what the run's child runs have spent so far (``_watch_children``)."""


_Message = BaseEvent | _Durable | _Incoming | _Finished | _Wake | _CostCheck


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
        self.snap = own(snapshot)  # applied in place from here on: nobody else holds its maps
        self._services = services or RunServices()
        self._tuning = tuning or Tuning()
        self._children = children
        self._listeners = listeners or []
        # What node runs and commands hand to the loop, in order; ``_wakeup`` is set while it waits.
        self._queue: deque[_Message] = deque()
        self._wakeup: anyio.Event | None = None
        self._rows: list[EventRow] = []
        self._applied: list[BaseEvent] = []
        self._waiters: list[_Durable] = []
        self._dirty: set[str] = set()
        # Ready nodes waiting for a free slot, lowest node index first (``decide`` is handed as many
        # as there are slots, not all of them on every step), and the counts ``decide`` judges by.
        self._ready: list[tuple[int, str]] = []
        self._queued: set[str] = set()
        self._progress = Progress()
        self._active: dict[tuple[str, int | None], anyio.CancelScope | None] = {}
        self._to_launch: list[NodeStart] = []
        self._finished_commands: list[tuple[int, int]] = []
        self._bytes_since_checkpoint = 0
        self._checkpoint_size = checkpoint_size
        self._packer = Packer()  # large payloads and checkpoints, packed in proportion to what changed
        # Shared by the runs a kernel executes at once: their commits share transactions.
        self._committer = committer or Committer(store)
        self._window = self._tuning.observability_commit_ms / 1000
        self._loud = False  # an event not in _OBSERVABILITY waits to be committed
        self._last_commit = 0.0
        self._flush_at: float | None = None  # when the observability events waiting are committed
        self._pause = False
        self._pause_event = anyio.Event()
        self._yielded = time.monotonic()
        self._finished_at: dict[str, int] = {}  # node -> seq of its last finish (for ``cause``)
        self._decided_at: dict[str, int] = {}  # edge -> seq of its last decision
        self._reset_at: dict[str, int] = {}  # node -> seq of the loop:iterate that last reset it
        self.stop_reason: str | None = None
        self._tg: TaskGroup | None = None
        # While the first events are appended: the nodes they wake are looked for once, after all of them
        # (``awake`` goes over every node of the flow).
        self._awake_later = False
        self._views: dict[str, _View] = {}  # node run id -> the state it sees (see submit_patch)
        self._inline_of: dict[str, bool] = {}  # node -> runs inline (for nodes whose input has no binding)
        # The lease this execution holds: every commit is checked against it (fencing), and the commit
        # that stops the run with no node run left ends it.
        self._lease = lease
        self.node_store = fenced(store, lease)
        self.lease_released = False
        # A commit that ends the lease is being made (in another thread, with other runs' commits): the
        # lease may be gone from the store before ``lease_released`` is set.
        self.lease_releasing = False
        # The usage map the run row holds (the reducer replaces it on every agent:usage: an identity check).
        self._usage_stored = self.snap.usage
        self._lost: LeaseLostError | None = None  # set once another execution has taken the run over
        # Handing the run over (a worker shutting down): no node run starts; ``_draining`` is set then.
        self._draining = False
        # The run's agent runs still open, kept in the agent_runs table by each commit (flows with agents).
        self._agents = AgentRunFold.for_run(flow, self.snap, store, registry)
        self._limits = self._services.expression_limits or limits_from_env()
        self._deciding: tuple[Scope, anyio.Event] | None = None  # a decision computing in a worker thread
        # Budgets are checked after each model call and, when child runs count, after each node run.
        self._budgets = has_budgets(flow)
        self._children_count = any(n.type == "flow.call" for n in flow.nodes.values())

    # -- what node contexts use -------------------------------------------------------------

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

    def _put(self, msg: _Message) -> None:
        self._queue.append(msg)
        if self._wakeup is not None:
            self._wakeup.set()
        if type(msg) is _Incoming and msg.command.kind in ("pause", "abort"):
            self._abandon_decision()

    def _abandon_decision(self) -> None:
        """A decision computing off the loop must not hold a pause, abort or hand-over up: abandon it
        (see _decide_off_loop); it is made again afterwards if the run goes on."""
        if self._deciding is not None:
            scope, ready = self._deciding
            scope.cancel()
            ready.set()

    def submit(self, draft: BaseEvent) -> None:
        self._put(draft)

    def submit_patch(self, draft: StatePatch, base: dict[str, Any], patched: dict[str, Any]) -> None:
        """A state patch, and the state its node run sees after it (``patched``, computed from the run's
        state ``base``): if the node run finishes while the run's state is still ``base``, the shell
        takes that state instead of applying the staged patches again."""
        run_id = draft.runId or ""
        view = self._views.get(run_id)
        self._views[run_id] = _View(base, patched, (view.count if view else 0) + 1, view is None or view.exact)
        self._put(draft)

    async def submit_durable(self, draft: BaseEvent) -> None:
        req = _Durable(draft)
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
        self._put(_Incoming(command, command_id, reply))

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
        self._committer.executing += 1
        try:
            return await self._run(first, background)
        finally:
            self._committer.executing -= 1

    async def _run(self, first: list[BaseEvent],
                   background: list[Callable[[RunExecution], Coroutine[Any, Any, None]]] | None) -> RunSnapshot:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for task in background or []:
                    tg.start_soon(task, self)
                if self._children_count and run_limit(self.flow, self.snap) is not None:
                    tg.start_soon(self._watch_children)
                self._awake_later = True
                try:
                    for draft in first:
                        self._append(draft)
                finally:
                    self._awake_later = False
                self._dirty |= awake(self.flow, self.snap)
                await self._step()
                while (self.snap.status == "running" or self._active) and self._lost is None:
                    if self._draining and not self._active:
                        break  # handed over: the run stays running, for the next executor to continue
                    if self.snap.status != "running":
                        self._stop_tasks()
                        if not self._active:
                            break
                    now = time.monotonic()
                    if now - self._yielded > YIELD_EVERY_S:
                        # Inline nodes never await: let the command poller and lease renewal run.
                        self._yielded = now
                        await anyio.lowlevel.checkpoint()
                    if not self._queue:
                        self._wakeup = anyio.Event()
                        if self._flush_at is None:
                            await self._wakeup.wait()
                        else:  # observability events are waiting: until they are due, at the latest
                            with anyio.move_on_after(self._flush_at - time.monotonic()):
                                await self._wakeup.wait()
                        self._wakeup = None
                        self._yielded = time.monotonic()
                    batch = list(self._queue)
                    self._queue.clear()
                    for m in batch:
                        if isinstance(m, _Incoming) and self._judged_in_thread(m.command):
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
            raise _first_error(group) from None
        if self._lost is not None:
            raise self._lost
        return self.snap

    def lose_lease(self, error: LeaseLostError) -> None:
        """Another execution took the run over (seen when renewing): stop at once, commit nothing more."""
        if self._lost is None:
            self._lost = error
            self._rows, self._applied, self._finished_commands = [], [], []
            self._stop_all()
            if self._tg is not None:
                self._tg.cancel_scope.cancel()

    def hand_over(self) -> None:
        """Stop starting node runs; the execution ends when those in flight have finished (or been
        stopped with ``stop_node_runs``), leaving the run ``running`` for another executor."""
        self._draining = True
        self._abandon_decision()
        self._put(_Wake())

    def stop_node_runs(self, *, cooperative: bool) -> None:
        """While handing over: cancel the node runs in flight, except, with ``cooperative``, those of
        node types that stop at their next step boundary when asked (their step is stored; the next
        executor resumes them)."""
        if cooperative:
            self._pause = True
            self._pause_event.set()
        for key, scope in list(self._active.items()):
            if not (cooperative and scope is not None and self._cooperative(key[0])):
                if scope is not None:
                    scope.cancel()
                self._active.pop(key, None)
        self._put(_Wake())

    def _stop_all(self) -> None:
        for key, scope in list(self._active.items()):
            if scope is not None:
                scope.cancel()
            self._active.pop(key, None)

    def _handle(self, msg: _Message) -> None:
        if isinstance(msg, BaseEvent):
            if msg.nodeId is not None and self._stale(msg):
                return  # a node run that was cancelled (run stopped, loop reset): its late words change nothing
            self._append(msg)
            if self._budgets and (type(msg) is AgentUsage or (self._children_count and type(msg) in _NODE_ENDS)):
                self._check_budget(msg.nodeId if type(msg) is AgentUsage else None)
        elif isinstance(msg, _Durable):
            if msg.draft.nodeId is not None and self._stale(msg.draft):
                msg.error = anyio.get_cancelled_exc_class()()
                msg.done.set()
                return
            try:
                self._append(msg.draft)
            except Exception as exc:
                msg.error = exc
                msg.done.set()
                return
            self._waiters.append(msg)
        elif isinstance(msg, _Incoming):
            self._handle_command(msg)
        elif isinstance(msg, _CostCheck):
            self._check_budget(None)
        elif isinstance(msg, _Finished):
            self._active.pop((msg.node_id, msg.item), None)
            if msg.pause is not None and self.snap.status == "running" and not self._draining:
                msg.pause.cause = self.snap.seq
                self._pause_now(msg.pause)
        # _Wake: nothing to apply; the loop looks at its state again

    def _stale(self, ev: BaseEvent) -> bool:
        """Whether a node's event comes from a node run that is no longer the live one."""
        key = self._active_key(ev)
        if key not in self._active:
            return True
        if isinstance(ev, NodeStart):
            return False  # a retry announcing its new node run
        n, item = key
        if item is not None:
            fe = self.snap.forEach.get(n)
            return fe is None or fe.running.get(str(item)) != ev.runId
        return self.snap.nodeRuns.get(n) != ev.runId

    def _active_key(self, ev: BaseEvent) -> tuple[str, int | None]:
        n, item = ev.nodeId or "", getattr(ev, "item", None)
        if item is None and n in self.snap.forEach and ev.runId and not isinstance(ev, NodeStart):
            # Agent and state events of a forEach item carry no ``item``: find it by the node run.
            for key, run_id in self.snap.forEach[n].running.items():
                if run_id == ev.runId:
                    return (n, int(key))
        return (n, item)

    def _takes_messages(self, node_id: str) -> bool:
        node = self.flow.nodes[node_id]
        return self.registry.takes_messages(node.type, node.raw_input)

    def _judged_in_thread(self, cmd: Command) -> bool:
        """Whether judging ``cmd`` validates content against a JSON Schema from the flow: its patterns may
        take up to the expression time limit, which the event loop must not wait out."""
        return cmd.kind in ("reply", "send") and any(w.schema is not None for w in self.snap.waiting.values())

    async def _judge_off_loop(self, msg: _Incoming) -> None:
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

    def _handle_command(self, msg: _Incoming, judged: CommandOutcome | Exception | None = None) -> None:
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
            self._finished_commands.append((msg.command_id, received.seq))
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
        """Pause when what was spent reached a limit (flowkernel.core.budgets): after a model call of
        ``node_id``, or after a node run finished (a child run may have spent)."""
        if self.snap.status != "running":
            return
        below = 0.0
        if self._children_count and run_limit(self.flow, self.snap) is not None:
            totals = self.store.descendant_totals([self.snap.runId]).get(self.snap.runId)
            below = totals.totalCostUsd if totals is not None else 0.0
        paused = over_budget(self.flow, self.snap, node_id=node_id, below=below)
        if paused is not None:
            paused.cause = self.snap.seq
            self._pause_now(paused)

    async def _watch_children(self) -> None:
        """While a child run executes, its model calls are in its own log: look at what the run's
        children have spent every ``budget_poll_s`` (default 1 s), so that the run pauses (and its
        children with it, at their next turn boundary) soon after they spend its budget, not only
        when a child finishes."""
        interval = self._tuning.budget_poll_s
        calls = {n for n, node in self.flow.nodes.items() if node.type == "flow.call"}
        while True:
            await anyio.sleep(interval)
            if self.snap.status == "running" and any(self.snap.nodeStatus.get(n) == "running" for n in calls):
                self._put(_CostCheck())

    def _append(self, draft: BaseEvent) -> BaseEvent:
        """Stamp, normalise (JSON round trip), apply and buffer one event."""
        snap = self.snap
        draft.seq = snap.seq + 1
        draft.timestamp = int(time.time() * 1000)  # ids.now_ms, inlined: this runs for every event
        draft.flowRunId = snap.runId
        field = _PAYLOAD_OF.get(type(draft))
        large = field is not None and type(payload := getattr(draft, field)) in _WHOLE and _large(payload)
        try:
            if large:
                self._packer.nulls = False
                body, event = self._pack(draft, field)  # type: ignore[arg-type]
                if self._packer.nulls or _NULL in body:
                    refuse_non_finite(payload)
            else:
                body = _encode(draft)
                if field is not None:
                    check_encoded(getattr(draft, field), body)
                if holds_secret(body):  # an error that echoed a request's headers, say: never stored
                    body = redact_bytes(body)
                    event = decode(body)
                else:
                    event = draft if _json_already(draft) else decode(body)
        except (TypeError, ValueError, RecursionError, msgspec.EncodeError) as exc:
            # Not JSON: a set, a key that is not a string, text with a lone surrogate (a ValueError),
            # nesting deeper than the encoder goes (a RecursionError), a NaN or Infinity (which the
            # encoder would write as null: a ValueError naming where it is).
            if isinstance(draft, NodeComplete):
                draft = NodeError(nodeId=draft.nodeId, runId=draft.runId, item=draft.item,
                                  errorType="invalid_output", message=f"output is not JSON: {exc}",
                                  attempt=snap.attempts.get(draft.nodeId or "", 1))
                return self._append(draft)
            raise
        if self._agents is not None and type(event) in FOLDED:
            self._agents.apply(snap, event)  # before the reducer, which changes ``snap`` in place
        if self._views:
            snap = self._landed(snap, draft, event)
        try:
            self.snap, touched = apply(self.flow, snap, event, owned=True)
        except NodeFailure as exc:
            if isinstance(event, StatePatch):
                print(f"flowkernel: dropped state patch from {event.nodeId}: {exc}", file=sys.stderr)
                return event
            raise
        if touched:
            if touched is not ALL:
                self._dirty |= touched
            elif not self._awake_later:
                self._dirty |= awake(self.flow, self.snap)
        if type(event) in _PROGRESS and (type(event) is not NodeStart or event.item is not None):
            self._progress.follow(self.flow, event)
        after = _AFTER_APPLY.get(type(event))
        if after is not None:
            after(self, event)
        self._rows.append((event.seq, event.timestamp, body))
        self._applied.append(event)
        if type(event) not in _OBSERVABILITY:
            self._loud = True
        self._bytes_since_checkpoint += len(body)
        return event

    def _pack(self, draft: BaseEvent, field: str) -> tuple[bytes, BaseEvent]:
        """The stored body of an event whose payload ``field`` is large: it refers to blobs, so a
        transcript that grew by one message costs that message, not the transcript. And the event to
        apply, whose payload is rebuilt from the packer's own objects (as a JSON round trip would give)."""
        packer = self._packer
        packed = packer.pack_inline(getattr(draft, field))
        skeleton = _encode(replace(draft, **{field: packed}))
        data = msgspec.json.decode(skeleton)
        payload = data.pop(field, None)
        event: BaseEvent = msgspec.convert(data, type(draft))  # its own type: converting to the union costs ~18 µs
        value = packer.resolver().unpack(payload)
        packer.remember(value, packed)
        setattr(event, field, value)
        return PACKED_PREFIX + skeleton[1:], event

    def _landed(self, snap: RunSnapshot, draft: BaseEvent, event: BaseEvent) -> RunSnapshot:
        """``snap`` with the staged patches of the node run that ``event`` finishes already in its
        state, when the node computed that state itself (equal to what the reducer would make)."""
        if isinstance(event, StatePatch):
            view = self._views.get(event.runId or "")
            if view is not None and event is not draft and event.value != getattr(draft, "value", None):
                view.exact = False  # the JSON round trip changed the value: the node's view is not the log's
            return snap
        if not isinstance(event, NodeComplete | NodeWaiting | NodeError):
            return snap
        view = self._views.pop(event.runId or "", None)
        if view is None or not view.exact or isinstance(event, NodeError) or view.base is not snap.state:
            return snap
        staged = snap.staged.get(event.runId or "")
        if staged is None or len(staged) != view.count:
            return snap
        del snap.staged[event.runId or ""]  # owned: see __init__
        return replace(snap, state=view.patched)

    # What the shell keeps track of besides the snapshot: node runs in flight, and the last event of
    # each kind of decision (what ``cause`` points at).

    def _node_finished(self, ev: NodeComplete | NodeSkipped | NodeError | NodeWaiting) -> None:
        if isinstance(ev, NodeError) and ev.willRetry:
            return
        if not isinstance(ev, NodeSkipped):
            self._active.pop(self._active_key(ev), None)  # a skipped node never ran
        if isinstance(ev, NodeWaiting):
            return  # waits: it has not finished
        if ev.item is None:
            self._finished_at[ev.nodeId or ""] = ev.seq

    def _edge_decided(self, ev: EdgeFire | EdgeSkip) -> None:
        self._decided_at[ev.edgeId] = ev.seq

    def _loop_reset(self, ev: LoopIterate) -> None:
        reset = self.flow.reset_sets[ev.edgeId]
        self._cancel_nodes(reset)
        for n in reset:
            self._reset_at[n] = ev.seq

    def _room(self) -> int:
        """How many more node runs may start now; none while the run is handed over."""
        return 0 if self._draining else self.flow.max_concurrency - len(self._active)

    async def _step(self) -> None:
        ready, queued, nodes = self._ready, self._queued, self.flow.nodes
        while self.snap.status == "running":
            candidates = self._dirty
            room = self._room()
            for _ in range(min(room, len(ready))):
                n = heapq.heappop(ready)[1]
                queued.discard(n)
                candidates.add(n)
            running, finish = self.flow.max_concurrency - room, not ready
            self._dirty = set()
            decision = self._decide(candidates, running, finish)
            if decision is None:
                # What is decided so far is saved, shown and started before an open expression computes.
                await self._commit()
                if self._lost is not None:
                    return
                await self._launch()
                decision = await self._decide_off_loop(candidates, running, finish)
                if decision is None:
                    # A pause, abort or hand-over came in meanwhile: it goes first; these are decided again after.
                    self._dirty |= candidates
                    break
            for n in decision.deferred:
                if n not in queued:
                    queued.add(n)
                    heapq.heappush(ready, (nodes[n].index, n))
            if not decision.drafts:
                if ready and self._room() > 0:
                    continue  # those handed over could not start: hand over the next ones
                break
            starts: list[NodeStart] = []
            for draft in decision.drafts:
                if draft.cause is None:
                    draft.cause = self._cause_of(draft)
                if isinstance(draft, NodeStart) and not draft.runId:
                    draft.runId = new_node_run_id()
                    starts.append(draft)
                    self._active[self._active_key(draft)] = None
                self._append(draft)
            for s in starts:  # a start followed by its own error (bad binding) or a forEach group: no task
                if self._launchable(s):
                    self._to_launch.append(s)
                else:
                    self._active.pop(self._active_key(s), None)
            if not self._dirty and self._active and not (ready and self._room() > 0):
                break  # nothing to look at again, and the run cannot end with node runs in flight
        await self._commit()
        if self._lost is not None:
            return
        await self._launch()

    async def _launch(self) -> None:
        """Start the node runs decided (and saved)."""
        launch, self._to_launch = self._to_launch, []
        if self.snap.status == "running" and self._tg is not None:
            for s in launch:
                if self._inline(s):
                    # Finishes without awaiting anything: no task needed; its events arrive like any other's.
                    await self._attempts(s)
                    continue
                scope = anyio.CancelScope()
                self._active[self._active_key(s)] = scope
                self._tg.start_soon(self._run_node, s, scope)

    def _decide(self, candidates: set[str], running: int, finish: bool) -> Decision | None:
        """What the scheduling rules decide now, or None if that needs an open expression (one that
        is not bounded by construction): those are not evaluated on the event loop."""
        previous = set_scope(INLINE_ONLY)
        try:
            return decide(self.flow, self.snap, candidates, running, finish, self._progress)
        except NeedsThread:
            return None
        finally:
            set_scope(previous)

    async def _decide_off_loop(self, candidates: set[str], running: int, finish: bool) -> Decision | None:
        """The same pure decision, made in a worker thread on a copy of the snapshot, under the run's
        expression limits, while the loop goes on receiving node events and commands. A pause or abort
        abandons it (None): its thread stops at the evaluation's next step, and the run's task group
        waits for it. A limit that fires is part of the decision (a binding error, a failed run), so it
        is recorded as events like any other outcome. Without the shell's ``Progress`` (the loop keeps
        it up to date meanwhile): the rules count from the snapshot's copy instead, with the same result."""
        scope, ready = Scope(self._limits), anyio.Event()
        outcome: list[Decision] = []
        snap, candidates = own(self.snap), set(candidates)

        async def work() -> None:
            try:
                decision = await call_off_loop(scope, decide, self.flow, snap, candidates, running, finish)
                if decision is not CANCELLED:
                    outcome.append(decision)
            finally:
                ready.set()

        assert self._tg is not None
        self._deciding = (scope, ready)
        self._tg.start_soon(work)
        try:
            await ready.wait()
        finally:
            self._deciding = None
        return outcome[0] if outcome else None

    def _cause_of(self, draft: BaseEvent) -> int:
        """The event that made the rules decide ``draft``: an edge decision is caused by its source
        finishing; a start or skip by the last decision on the node's incoming edges."""
        edge = getattr(draft, "edgeId", None)
        if edge is not None:
            return self._finished_at.get(self.flow.edges[edge].source, self.snap.seq)
        node = draft.nodeId
        if node is not None and node in self.flow.nodes:
            seqs = [self._decided_at[e] for e in self.flow.incoming[node] if e in self._decided_at]
            if node in self._reset_at:
                seqs.append(self._reset_at[node])
            if getattr(draft, "item", None) is None and seqs:
                return max(seqs)
        return self.snap.seq

    def _inline(self, s: NodeStart) -> bool:
        """Node runs that complete synchronously (no timeout, no retry) run in the shell's own task."""
        n = s.nodeId or ""
        known = self._inline_of.get(n)
        if known is not None:
            return known
        node = self.flow.nodes[n]
        if node.policy.timeoutMs or (node.policy.retry and node.policy.retry.maxAttempts > 1):
            inline = False
        else:
            node_type = self.registry.node_types.get(node.type)
            probe = getattr(node_type, "runs_inline", None)
            inline = bool(probe(s.input, self.registry)) if probe is not None else False
        if is_constant(node.input):  # the same input on every run of this node: the same answer
            self._inline_of[n] = inline
        return inline

    def _launchable(self, s: NodeStart) -> bool:
        n = s.nodeId or ""
        if s.item is not None:
            fe = self.snap.forEach.get(n)
            return fe is not None and fe.running.get(str(s.item)) == s.runId
        return self.snap.nodeStatus.get(n) == "running" and self.snap.nodeRuns.get(n) == s.runId \
            and n not in self.snap.forEach

    async def _commit(self, *, wait: bool = True) -> None:
        """Commit what was applied since the last commit, with the snapshot's status (and a checkpoint
        when one is due); with ``wait``, observability events alone may wait for their window."""
        if not self._rows and not self._finished_commands:
            return
        now = time.monotonic()
        if wait and not self._loud and not self._waiters and not self._finished_commands \
                and self.snap.status == "running" and now - self._last_commit < self._window:
            if self._flush_at is None:
                self._flush_at = self._last_commit + self._window
            return
        self._loud, self._flush_at, self._last_commit = False, None, now
        checkpoint = None
        blobs: dict[str, bytes] | None
        stopped = self.snap.status != "running"
        if stopped or self._bytes_since_checkpoint >= max(CHECKPOINT_SPACING * self._checkpoint_size,
                                                          CHECKPOINT_MIN_BYTES):
            # The packer knows every value and block packed before: a checkpoint costs its skeleton and
            # what is new, so they are spaced by that.
            checkpoint, blobs = encode_checkpoint(self.snap, self._packer)
            self._checkpoint_size = len(checkpoint) + sum(len(b) for b in blobs.values())
            self._bytes_since_checkpoint = 0
        else:
            blobs = self._packer.take_blobs() if self._packer.blobs else None  # those of packed events
        rows, applied, waiters = self._rows, self._applied, self._waiters
        self._rows, self._applied, self._waiters = [], [], []
        # Nothing can follow a stop with no node run in flight: that commit ends the lease too.
        release = stopped and not self._active and self._lease is not None
        taken, self._finished_commands = self._finished_commands, []
        snap = self.snap
        totals = None if snap.usage is self._usage_stored else RunTotals(snap.usage, snap.totalCostUsd)
        agent_runs = self._agents.changed() if self._agents is not None else ()
        self.lease_releasing = release
        try:
            await self._committer.commit(CommitRequest(
                runId=snap.runId, events=rows, status=snap.status, seq=snap.seq, error=snap.error,
                checkpoint=checkpoint, blobs=blobs or None, lease=self._lease, release=release, taken=taken,
                totals=totals, agent_runs=agent_runs))
            self._usage_stored = snap.usage
            if release:
                self.lease_released = True
        except LeaseLostError as exc:
            # Another execution has the run now: this one stops where it is and writes nothing more.
            for w in waiters:
                w.error = exc
                w.done.set()
            self.lose_lease(exc)
            return
        except FlowkernelError as exc:
            # Never run on with unsaved state: stop every node and surface the failure.
            for w in waiters:
                w.error = exc
                w.done.set()
            self._stop_tasks()
            raise StoreError(f"run {self.snap.runId}: cannot save the snapshot, stopping: {exc}; nothing saved is "
                             f"lost: `flowkernel resume {self.snap.runId}` continues the run from there") from exc
        for w in waiters:
            w.done.set()
        for listener in list(self._listeners) if applied else ():
            try:
                batch = getattr(listener, "batch", None)
                if batch is not None:
                    batch(applied)
                else:
                    for ev in applied:
                        listener(ev)
            except Exception as exc:
                # Watching a run must never break it: drop the listener and say so once.
                self._listeners.remove(listener)
                print(f"flowkernel: stopped showing events of run {self.snap.runId}: {exc!r}", file=sys.stderr)

    async def _end_grace(self) -> None:
        """Cooperative nodes get a grace period to finish their step on pause; then they are cancelled."""
        await anyio.sleep(self._tuning.pause_grace_s)
        self.stop_reason = "pause-timeout"
        self._put(_Wake())

    def _cancel_nodes(self, nodes: tuple[str, ...]) -> None:
        """A loop reset these nodes: node runs of theirs still in flight are cancelled."""
        reset = set(nodes)
        for key, scope in list(self._active.items()):
            if key[0] in reset:
                if scope is not None:
                    scope.cancel()
                del self._active[key]
        # Decided in this same step but not launched yet: never launch them.
        self._to_launch = [s for s in self._to_launch if s.nodeId not in reset]

    def _stop_tasks(self) -> None:
        """Cancel the node runs in flight; on pause, cooperative node types finish their step."""
        if self.stop_reason is None:
            self.stop_reason = "failed" if self.snap.status == "failed" else self.snap.status
        for key, scope in list(self._active.items()):
            if self.stop_reason == "pause" and scope is not None and self._cooperative(key[0]):
                continue
            if scope is not None:
                scope.cancel()
            self._active.pop(key, None)

    def _cooperative(self, node_id: str) -> bool:
        node_type = self.registry.node_types.get(self.flow.nodes[node_id].type)
        return bool(getattr(node_type, "cooperative_pause", False))

    # -- one node run -----------------------------------------------------------------------

    async def _run_node(self, start: NodeStart, scope: anyio.CancelScope) -> None:
        with scope:
            await self._attempts(start)

    async def _attempts(self, start: NodeStart) -> None:
        node = self.flow.nodes[start.nodeId or ""]
        node_type = self.registry.node_types[node.type]
        policy = node.policy
        max_attempts = policy.retry.maxAttempts if policy.retry else 1
        backoff_ms = policy.retry.backoffMs if policy.retry else 0
        attempt, run_id, start_seq = start.attempt, start.runId or "", start.seq
        while True:
            ctx = ShellNodeContext(self, node_id=node.id, run_id=run_id, flow_run_id=self.snap.runId, attempt=attempt,
                              input=start.input, item=start.item, resumed_from=start.resumedFrom)
            began = time.monotonic()
            try:
                with telemetry.node_span(node.id, node.type, run_id, attempt, start.item):
                    if policy.timeoutMs:
                        with anyio.fail_after(policy.timeoutMs / 1000):
                            result = await node_type.run(ctx)
                    else:
                        result = await node_type.run(ctx)
            except BaseException as exc:
                if not _is_node_failure(exc):
                    raise
                error_type, message = _describe(exc, policy.timeoutMs)
                will_retry = attempt < max_attempts and not self._pause
                self.submit(NodeError(nodeId=node.id, runId=run_id, item=start.item, errorType=error_type,
                                      message=message, attempt=attempt, willRetry=will_retry,
                                      details=_traceback(exc, policy.timeoutMs)))
                if not will_retry:
                    return
                await anyio.sleep(backoff_ms * (2 ** (attempt - 1)) / 1000)
                attempt += 1
                run_id = new_node_run_id()
                again = NodeStart(nodeId=node.id, runId=run_id, attempt=attempt, input=start.input, item=start.item)
                await self.submit_durable(again)
                start_seq = again.seq
                continue
            duration = int((time.monotonic() - began) * 1000)
            if isinstance(result, Interrupted):
                self._put(_Finished(node.id, start.item, result.pause))
            elif isinstance(result, WaitFor):
                # ``cause``: the node:start of the run that now waits. It saw its inbox as of then, so
                # only messages that came after wake it again (a node type that waits on, ignoring a
                # message, must not be restarted for it forever).
                self.submit(NodeWaiting(nodeId=node.id, runId=run_id, prompt=result.prompt, schema=result.schema,
                                        cause=start_seq))
            else:
                self.submit(NodeComplete(nodeId=node.id, runId=run_id, item=start.item, output=result,
                                         durationMs=duration))
            return


_NODE_ENDS = frozenset({NodeComplete, NodeError})  # a child run may have spent: look at the run's budget
_OBSERVABILITY = frozenset({AgentTextDelta, AgentThinkingDelta, AgentText, AgentThinking, AgentTool, AgentError,
                            AgentUsage, AgentCompaction})
_PROGRESS = frozenset({EdgeFire, EdgeSkip, NodeStart, NodeComplete, NodeSkipped, NodeError, LoopIterate, FlowResumed})
_AFTER_APPLY: dict[type[BaseEvent], Callable[[RunExecution, Any], None]] = {
    NodeComplete: RunExecution._node_finished, NodeSkipped: RunExecution._node_finished,
    NodeError: RunExecution._node_finished, NodeWaiting: RunExecution._node_finished,
    EdgeFire: RunExecution._edge_decided, EdgeSkip: RunExecution._edge_decided,
    LoopIterate: RunExecution._loop_reset,
}


# Events whose fields the kernel fills with strings and integers only, and the one field that carries
# a node's data in the others: when that is a str, int, bool or None, decoding the encoded event
# would give back an equal event, so the draft itself is applied.
_KERNEL_MADE = frozenset({EdgeSkip, NodeSkipped, LoopIterate, LoopExhausted, FlowComplete, FlowWaiting})
_PAYLOAD = {StatePatch: "value", NodeComplete: "output", EdgeFire: "items"}
_EXACT_JSON = frozenset({str, int, bool, type(None)})  # not float: NaN would come back as null


def _json_already(draft: BaseEvent) -> bool:
    cls = type(draft)
    if cls in _KERNEL_MADE:
        return True
    field = _PAYLOAD.get(cls)
    return field is not None and type(getattr(draft, field)) in _EXACT_JSON


_encode = encoder.encode
_NULL = b"null"  # in an encoded payload wherever a None was, or a NaN or Infinity (flowkernel.core.nonfinite)

# The field of an event that carries a node's data, and when that data is large enough to pack: a long
# list or a long string, at most three levels down (a transcript in an output, a history in the args of
# an input), the values that come back event after event.
_PAYLOAD_OF: dict[type[BaseEvent], str] = {
    NodeStart: "input", NodeComplete: "output", StatePatch: "value", EdgeFire: "items", NodeWaiting: "prompt",
}
_WHOLE = frozenset({dict, list, tuple, str})
_LONG_LIST = 2 * LEAF
_LONG_STRING = 4096


def _large(value: Any, depth: int = 0) -> bool:
    t = type(value)
    if t is str:
        return len(value) >= _LONG_STRING
    if t is dict:
        values: Any = value.values()
    elif len(value) > _LONG_LIST:
        return True
    else:
        values = value
    if depth < 2:
        for v in values:
            if type(v) in _WHOLE and _large(v, depth + 1):
                return True
    return False


TRACEBACK_FRAMES = 30  # the innermost ones: where the code that failed was
TRACEBACK_CHARS = 16_000


def _traceback(exc: BaseException, timeout_ms: int | None) -> Any:
    """``{"traceback": ...}`` for an exception no node type raised on purpose (a bug in a function, a
    tool, a plugin): the message alone rarely says where. Expected failures (NodeFailure, timeouts,
    flowkernel's own errors) carry their meaning in the message, and a NodeFailure its own details
    (a fixture mismatch: the differing paths)."""
    if isinstance(exc, NodeFailure):
        return exc.details
    if isinstance(exc, FlowkernelError) or (isinstance(exc, TimeoutError) and timeout_ms):
        return None
    import traceback

    text = "".join(traceback.format_exception(exc, limit=-TRACEBACK_FRAMES))
    if len(text) > TRACEBACK_CHARS:
        text = "…" + text[-(TRACEBACK_CHARS - 1):]
    return {"traceback": text}


def _is_node_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised from a node run, is that node's failure. Cancellation (a timeout, a pause,
    an abort), Ctrl-C and a coroutine being closed go on; anything else a node's code raises, SystemExit
    and a bare BaseException included, must not end the process (and every other run it executes) with
    the run left half-done."""
    if isinstance(exc, Exception):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_node_failure(e) for e in exc.exceptions)
    return not isinstance(exc, (anyio.get_cancelled_exc_class(), KeyboardInterrupt, GeneratorExit))


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error to report from a task group's exception group: a flowkernel error if there is one
    (it carries the message meant for the user), else the first one."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop(0)
        if isinstance(exc, BaseExceptionGroup):
            pending[:0] = list(exc.exceptions)
        else:
            leaves.append(exc)
    return next((e for e in leaves if isinstance(e, FlowkernelError)), leaves[0])


def _describe(exc: BaseException, timeout_ms: int | None) -> tuple[str, str]:
    if isinstance(exc, BaseExceptionGroup):  # from a task group inside the node: say what failed in it
        exc = _first_error(exc)
    if isinstance(exc, TimeoutError) and timeout_ms:
        return "timeout", f"timed out after {timeout_ms} ms"
    if isinstance(exc, NodeFailure):
        return exc.error_type, str(exc)
    if isinstance(exc, FlowkernelError):
        return type(exc).__name__, str(exc)
    if not isinstance(exc, Exception):  # SystemExit, a bare BaseException: say what was raised
        return type(exc).__name__, f"raised {type(exc).__name__}({exc})"
    return type(exc).__name__, str(exc) or type(exc).__name__
