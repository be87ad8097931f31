"""Group commit: the transitions of the runs one kernel executes at once share transactions.

A run executing alone commits as it always did, at once and on the event loop's thread. When several
execute (a worker, ``serve``, a parent and its child runs), a commit joins a queue: the transaction
in flight is made in a worker thread, the event loop meanwhile runs the other executions, and every
commit that arrived while it was in flight goes into the next transaction, together (one fsync for
many runs). Each run's rows are in a savepoint of their own (``Store.commit_group``): a run whose
commit fails fails alone, and the others' rows are committed. A run's commit returns, and its node
runs start, only once its own rows are durable, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import anyio.lowlevel
import anyio.to_thread
from flowkernel.store.base import CommitRequest, CreateRequest, Store

log = logging.getLogger("flowkernel.run")


class _Waiting:
    __slots__ = ("done", "error", "lead", "request", "woken")

    def __init__(self, request: CommitRequest | CreateRequest) -> None:
        self.request = request
        self.woken = anyio.Event()
        self.done = False
        self.lead = False  # this one makes the next transaction
        self.error: Exception | None = None


class Committer:
    """The commits of the runs executing under one kernel, to its store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.executing = 0  # runs being created or executed (each counts itself in and out)
        self.on_commit: list[Callable[[], None]] = []  # told, on the event loop, after each transaction
        self._queue: list[_Waiting] = []
        self._busy = False  # a transaction of the queue is being made

    async def commit(self, request: CommitRequest | CreateRequest) -> None:
        """Commit ``request``; returns once it is durable (raises what its commit raised)."""
        if not self._busy and self.executing <= 1:
            r = request
            if isinstance(r, CreateRequest):
                self.store.create_run(r.record, r.events, r.checkpoint, r.blobs, document=r.document,
                                      agent_runs=r.agent_runs)
            else:
                self.store.commit(r.runId, r.events, r.status, r.seq, r.error, r.checkpoint, r.blobs, lease=r.lease,
                                  release=r.release, taken=r.taken, totals=r.totals, agent_runs=r.agent_runs)
            if self.on_commit:
                self.committed()
            return
        me = _Waiting(request)
        self._queue.append(me)
        if not self._busy:
            self._busy = me.lead = True
        # Shielded: a waiter cancelled (its run stopped, its lease lost) could be the one the next
        # transaction is handed to, and the others would wait for ever; its rows are committed (or
        # refused by their lease check) like any other's, and the cancellation lands when it returns.
        with anyio.CancelScope(shield=True):
            while not me.done:
                if me.lead:
                    me.lead = False
                    await self._drain()
                else:
                    await me.woken.wait()
                    me.woken = anyio.Event()
        if me.error is not None:
            raise me.error

    def committed(self) -> None:
        """Tell whoever watches this process's commits (a server's event feed) that there are new ones."""
        for callback in self.on_commit:
            try:
                callback()
            except Exception as exc:  # a watcher must never break the runs it watches
                log.warning("a commit watcher failed: %r", exc)

    async def _drain(self) -> None:
        """Make one transaction of everything queued, then hand the next one to the first still waiting."""
        await anyio.lowlevel.checkpoint()  # the other runs ready now add their commits first
        batch, self._queue = self._queue, []
        try:
            results = await anyio.to_thread.run_sync(self.store.commit_group, [w.request for w in batch])
        except Exception as exc:
            results = [exc] * len(batch)
        self.committed()
        for w, error in zip(batch, results, strict=True):
            w.error, w.done = error, True
            w.woken.set()
        if self._queue:
            self._queue[0].lead = True
            self._queue[0].woken.set()
        else:
            self._busy = False
