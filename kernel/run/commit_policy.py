"""When a run's appended events are committed, with what, and who is told afterwards.

Transitions (node, edge, loop, flow, command or state events) are committed at once, with every event
before them; events that only show what a node is doing (a model's streamed text, its tool calls,
what a call cost) wait up to ``Tuning.observability_commit_ms`` for whatever follows them. A commit
carries a checkpoint when the run stopped or when the events since the last one weigh more than
``CHECKPOINT_SPACING`` times its size; the commit that stops the run with no node run in flight ends
its lease. Listeners are told of each commit's events; one that fails is dropped and logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio
import msgspec
from flowkernel.core.events import (
    AgentError,
    AgentText,
    AgentTextDelta,
    AgentThinking,
    AgentThinkingDelta,
    AgentTool,
    AgentUsage,
    BaseEvent,
)
from flowkernel.errors import FlowkernelError, LeaseLostError, StoreError
from flowkernel.run.append import Appender
from flowkernel.run.committer import Committer
from flowkernel.store.base import CommitRequest, Lease, RunTotals
from flowkernel.store.checkpoint import encode_checkpoint

log = logging.getLogger("flowkernel.run")

# Called with each committed event. A listener with a ``batch(events)`` method gets the events of each
# commit in one call instead (a view that writes to a stream flushes it once per commit, not per line).
EventListener = Callable[[BaseEvent], None]

CHECKPOINT_MIN_BYTES = 64 * 1024
# A new checkpoint once the events since the last one weigh this many times its size: checkpoints
# then cost at most half of what the events cost, and resume folds at most that much log.
CHECKPOINT_SPACING = 2
# Events that only show what a node is doing: committed at most once per observability window.
# Not AgentCompaction: the conversation the node resumes from changed there, so it is committed at once
# (a crash right after a compaction keeps its record).
OBSERVABILITY = frozenset({AgentTextDelta, AgentThinkingDelta, AgentText, AgentThinking, AgentTool, AgentError,
                           AgentUsage})


class Durable(msgspec.Struct):
    """An event whose submitter waits until it is committed (or fails with ``error``)."""

    draft: BaseEvent
    done: anyio.Event = msgspec.field(default_factory=anyio.Event)
    error: BaseException | None = None


class CommitPolicy:
    """Group commit, the observability window, checkpoint spacing, the lease's end and listener fan-out."""

    def __init__(self, committer: Committer, lease: Lease | None, window_s: float, checkpoint_size: int,
                 listeners: list[EventListener], usage: object) -> None:
        self.committer = committer
        self.lease = lease
        self.listeners = listeners
        self.waiters: list[Durable] = []  # durable submitters waiting for their commit
        self.taken: list[tuple[int, int]] = []  # (command id, seq of its command:received) to take off the queue
        self.loud = False  # an event not in OBSERVABILITY waits to be committed
        self.flush_at: float | None = None  # when the observability events waiting are committed
        self.lease_released = False
        # A commit that ends the lease is being made (in another thread, with other runs' commits): the
        # lease may be gone from the store before ``lease_released`` is set.
        self.lease_releasing = False
        self._window = window_s
        self._last_commit = 0.0
        self._checkpoint_size = checkpoint_size
        self._bytes_since_checkpoint = 0
        # The usage map the run row holds (the reducer replaces it on every agent:usage: an identity check).
        self._usage_stored = usage

    def note(self, event: BaseEvent, size: int) -> None:
        """An event of ``size`` stored bytes was appended."""
        if type(event) not in OBSERVABILITY:
            self.loud = True
        self._bytes_since_checkpoint += size

    def forget(self) -> None:
        """The lease is lost: nothing appended is committed."""
        self.taken = []

    async def commit(self, appender: Appender, *, active: bool, wait: bool = True) -> None:
        """Commit what was appended since the last commit, with the snapshot's status (and a checkpoint
        when one is due); with ``wait``, observability events alone may wait for their window.

        Raises ``LeaseLostError`` when another execution holds the run, ``StoreError`` when the commit
        failed (the run must not go on with unsaved state); waiters fail with it either way."""
        if not appender.rows and not self.taken:
            return
        snap = appender.snap
        now = time.monotonic()
        if wait and not self.loud and not self.waiters and not self.taken \
                and snap.status == "running" and now - self._last_commit < self._window:
            if self.flush_at is None:
                self.flush_at = self._last_commit + self._window
            return
        self.loud, self.flush_at, self._last_commit = False, None, now
        checkpoint = None
        blobs: dict[str, bytes] | None
        stopped = snap.status != "running"
        if stopped or self._bytes_since_checkpoint >= max(CHECKPOINT_SPACING * self._checkpoint_size,
                                                          CHECKPOINT_MIN_BYTES):
            # The packer knows every value and block packed before: a checkpoint costs its skeleton and
            # what is new, so they are spaced by that.
            checkpoint, blobs = encode_checkpoint(snap, appender.packer)
            self._checkpoint_size = len(checkpoint) + sum(len(b) for b in blobs.values())
            self._bytes_since_checkpoint = 0
        else:
            packer = appender.packer
            blobs = packer.take_blobs() if packer.blobs else None  # those of packed events
        (rows, applied), waiters = appender.take(), self.waiters
        self.waiters = []
        # Nothing can follow a stop with no node run in flight: that commit ends the lease too.
        release = stopped and not active and self.lease is not None
        taken, self.taken = self.taken, []
        totals = None if snap.usage is self._usage_stored else RunTotals(snap.usage, snap.totalCostUsd)
        self.lease_releasing = release
        try:
            await self.committer.commit(CommitRequest(
                runId=snap.runId, events=rows, status=snap.status, seq=snap.seq, error=snap.error,
                checkpoint=checkpoint, blobs=blobs or None, lease=self.lease, release=release, taken=taken,
                totals=totals, agent_runs=appender.agent_runs()))
            self._usage_stored = snap.usage
            if release:
                self.lease_released = True
        except FlowkernelError as exc:
            for w in waiters:
                w.error = exc
                w.done.set()
            if isinstance(exc, LeaseLostError):
                raise  # another execution has the run now: this one stops where it is
            raise StoreError(f"run {snap.runId}: cannot save the snapshot, stopping: {exc}; nothing saved is "
                             f"lost: `flowkernel resume {snap.runId}` continues the run from there") from exc
        for w in waiters:
            w.done.set()
        if applied:
            self.fan_out(snap.runId, applied)

    def fan_out(self, run_id: str, applied: list[BaseEvent]) -> None:
        """Tell the listeners of a commit's events. Watching a run must never break it: a listener that
        fails is dropped, and that is logged once."""
        for listener in list(self.listeners):
            try:
                batch = getattr(listener, "batch", None)
                if batch is not None:
                    batch(applied)
                else:
                    for ev in applied:
                        listener(ev)
            except Exception as exc:
                self.listeners.remove(listener)
                log.warning("stopped showing events of run %s: %r", run_id, exc)
