"""What the run loop asks the scheduling rules next, and where the answer is computed.

The nodes whose situation may have changed since the last step (``dirty``), ready nodes waiting for a
free slot (lowest node index first: ``decide`` is handed as many as there are slots, not all of them
on every step), and the counts ``decide`` judges by (``Progress``, kept up to date event by event).
A decision that needs an open expression is made in a worker thread, under the run's expression
limits, while the loop goes on receiving node events and commands.
"""

from __future__ import annotations

import heapq

import anyio
from anyio.abc import TaskGroup
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import (
    BaseEvent,
    EdgeFire,
    EdgeSkip,
    FlowResumed,
    LoopIterate,
    NodeComplete,
    NodeError,
    NodeSkipped,
    NodeStart,
)
from flowkernel.core.expression_scope import INLINE_ONLY, ExpressionLimits, NeedsThread, Scope, set_scope
from flowkernel.core.reducer import ALL, own
from flowkernel.core.scheduling import Decision, Progress, awake, decide
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.run.offload import CANCELLED, call_off_loop

_PROGRESS = frozenset({EdgeFire, EdgeSkip, NodeStart, NodeComplete, NodeSkipped, NodeError, LoopIterate, FlowResumed})


class Decisions:
    """The candidates of the next decision, and a decision computing off the loop."""

    def __init__(self, flow: CompiledFlow, limits: ExpressionLimits) -> None:
        self._flow = flow
        self._limits = limits
        self.dirty: set[str] = set()
        self._ready: list[tuple[int, str]] = []
        self._queued: set[str] = set()
        self._progress = Progress()
        self._deciding: tuple[Scope, anyio.Event] | None = None  # a decision computing in a worker thread
        # While the first events are appended: the nodes they wake are looked for once, after all of them
        # (``awake`` goes over every node of the flow).
        self.awake_later = False

    def follow(self, event: BaseEvent, touched: frozenset[str], snap: RunSnapshot) -> None:
        """An event was applied; ``touched``: the nodes it may have made ready (the reducer's)."""
        if touched:
            if touched is not ALL:
                self.dirty |= touched
            elif not self.awake_later:
                self.dirty |= awake(self._flow, snap)
        if type(event) in _PROGRESS and (type(event) is not NodeStart or event.item is not None):
            self._progress.follow(self._flow, event)

    def wake(self, snap: RunSnapshot) -> None:
        """Look at every node that may be ready (after the first events of an execution)."""
        self.dirty |= awake(self._flow, snap)

    @property
    def waiting(self) -> bool:
        """Ready nodes are waiting for a slot."""
        return bool(self._ready)

    def candidates(self, room: int) -> set[str]:
        """The nodes to decide on now: those that may have changed, and up to ``room`` waiting ones."""
        candidates, ready = self.dirty, self._ready
        for _ in range(min(room, len(ready))):
            n = heapq.heappop(ready)[1]
            self._queued.discard(n)
            candidates.add(n)
        self.dirty = set()
        return candidates

    def defer(self, nodes: set[str]) -> None:
        """Ready nodes with no free slot: decided again, in node order, when one frees."""
        queued, ready, flow_nodes = self._queued, self._ready, self._flow.nodes
        for n in nodes:
            if n not in queued:
                queued.add(n)
                heapq.heappush(ready, (flow_nodes[n].index, n))

    def decide(self, snap: RunSnapshot, candidates: set[str], running: int, finish: bool) -> Decision | None:
        """What the scheduling rules decide now, or None if that needs an open expression (one that
        is not bounded by construction): those are not evaluated on the event loop."""
        previous = set_scope(INLINE_ONLY)
        try:
            return decide(self._flow, snap, candidates, running, finish, self._progress)
        except NeedsThread:
            return None
        finally:
            set_scope(previous)

    async def decide_off_loop(self, tg: TaskGroup | None, snap: RunSnapshot, candidates: set[str], running: int,
                              finish: bool) -> Decision | None:
        """The same pure decision, made in a worker thread on a copy of the snapshot, under the run's
        expression limits, while the loop goes on receiving node events and commands. A pause or abort
        abandons it (None): its thread stops at the evaluation's next step, and the run's task group
        waits for it. A limit that fires is part of the decision (a binding error, a failed run), so it
        is recorded as events like any other outcome. Without the shell's ``Progress`` (the loop keeps
        it up to date meanwhile): the rules count from the snapshot's copy instead, with the same result."""
        scope, ready = Scope(self._limits), anyio.Event()
        outcome: list[Decision] = []
        snap, candidates = own(snap), set(candidates)

        async def work() -> None:
            try:
                decision = await call_off_loop(scope, decide, self._flow, snap, candidates, running, finish)
                if decision is not CANCELLED:
                    outcome.append(decision)
            finally:
                ready.set()

        assert tg is not None
        self._deciding = (scope, ready)
        tg.start_soon(work)
        try:
            await ready.wait()
        finally:
            self._deciding = None
        return outcome[0] if outcome else None

    def abandon(self) -> None:
        """A decision computing off the loop must not hold a pause, abort or hand-over up: abandon it
        (see decide_off_loop); it is made again afterwards if the run goes on."""
        if self._deciding is not None:
            scope, ready = self._deciding
            scope.cancel()
            ready.set()
