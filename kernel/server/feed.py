"""New events as they are committed, from the durable log, for any number of clients per run.

One watcher per server reads the store for every run someone streams: it notices commits through
the store's change token (SQLite's ``data_version`` moves with every other connection's commit) or,
where the token does not cover events (PostgreSQL), by reading the runs' last seqs each poll; then
it reads each run's new events once and hands them to all of that run's clients. Whoever committed
them (this server's workers, a ``flowkernel worker``, a CLI process on the same store) makes no
difference. A client that is behind the watcher's short memory reads the rest from the store.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
from flowkernel.core.events import event_type
from flowkernel.store.base import Store

KEEP = 4096  # recent events kept per watched run
HISTORY_PAGE = 1000  # events read from the store per step by a client that is behind

log = logging.getLogger("flowkernel.server.feed")


@dataclass
class _Watched:
    head: int  # the last seq known committed
    recent: deque[bytes] = field(default_factory=lambda: deque(maxlen=KEEP))  # events up to ``head``
    changed: anyio.Event = field(default_factory=anyio.Event)
    clients: int = 0
    fresh: bool = True  # not looked at by the watcher yet: its first look must not trust the token

    @property
    def base(self) -> int:
        """The seq just before the first event in ``recent``."""
        return self.head - len(self.recent)

    def since(self, seq: int) -> list[bytes]:
        return list(itertools.islice(self.recent, seq - self.base, None)) if seq < self.head else []


class Feed:
    """Watches the store (a connection of its own) for new events of the runs clients follow."""

    def __init__(self, store: Store, *, poll_s: float = 0.02, token_covers_events: bool = True) -> None:
        self.store = store
        self.poll_s = poll_s
        self._token_covers_events = token_covers_events
        self._runs: dict[str, _Watched] = {}
        self._wake = anyio.Event()
        self._token: int | None = None

    def nudge(self) -> None:
        """Look now rather than at the next poll (someone in this process just committed)."""
        self._wake.set()

    async def watch(self) -> None:
        """The watcher: runs until cancelled (the server's lifespan owns it)."""
        failing = False
        while True:
            if not self._runs:
                await self._wake.wait()
            with anyio.move_on_after(self.poll_s):
                await self._wake.wait()
            self._wake = anyio.Event()
            heads = {run_id: run.head for run_id, run in self._runs.items()}
            force = False
            for run in self._runs.values():
                force, run.fresh = force or run.fresh, False
            try:
                new = await anyio.to_thread.run_sync(self._read_new, heads, force)
            except Exception as exc:  # a store hiccup must not end every stream: try again next poll
                if not failing:  # said once, not at every poll while it lasts
                    log.warning("reading new events failed (trying again at each poll): %s", exc)
                failing = True
                continue
            if failing:
                log.info("reading new events works again")
                failing = False
            for run_id, (head, bodies) in new.items():
                found = self._runs.get(run_id)
                if found is None or found.head != head:
                    continue  # nobody follows it any more (or it was re-watched meanwhile)
                found.recent.extend(bodies)
                found.head += len(bodies)
                changed, found.changed = found.changed, anyio.Event()
                changed.set()

    def _read_new(self, heads: dict[str, int], force: bool) -> dict[str, tuple[int, list[bytes]]]:
        """In a worker thread: the events committed after each run's known head."""
        token = self.store.change_token()
        if self._token_covers_events and token == self._token and not force:
            return {}
        self._token = token
        now = self.store.last_seqs(list(heads))
        return {run_id: (head, self.store.read_events(run_id, after=head, until=now[run_id]))
                for run_id, head in heads.items() if now.get(run_id, head) > head}

    async def events(self, run_id: str, after: int, *, keepalive_s: float) -> AsyncIterator[bytes | None]:
        """The run's events after seq ``after``, history first, then each as it is committed, until
        ``flow:complete``; ``None`` when ``keepalive_s`` pass without one."""
        async with contextlib.aclosing(self.batches(run_id, after, keepalive_s=keepalive_s)) as batches:
            async for batch in batches:
                if batch is None:
                    yield None
                    continue
                for body in batch:
                    yield body

    async def batches(self, run_id: str, after: int, *, keepalive_s: float,
                      until: int | None = None) -> AsyncGenerator[list[bytes] | None, None]:
        """``events``, a batch at a time: what was committed together (or a page of history) comes
        in one list, so a stream sends it in one write, however many clients the run has; the last
        batch ends with ``flow:complete``, or with event ``until`` if that comes first."""
        run = self._runs.get(run_id)
        if run is None:
            head = (await anyio.to_thread.run_sync(self.store.last_seqs, [run_id])).get(run_id, 0)
            run = self._runs.setdefault(run_id, _Watched(head=head))
        run.clients += 1
        self._wake.set()
        try:
            seq = after
            while True:
                if seq < run.base:  # older than what the watcher keeps: from the store
                    batch = await anyio.to_thread.run_sync(self.store.read_events, run_id, seq,
                                                           min(run.base, seq + HISTORY_PAGE))
                else:
                    batch = run.since(seq)
                if batch:
                    ends = until is not None and seq + len(batch) >= until
                    if until is not None and ends:
                        batch = batch[:until - seq]  # the last event the client asked for
                    last = next((i for i, body in enumerate(batch) if event_type(body) == "flow:complete"), None)
                    if last is not None:
                        yield batch[:last + 1]
                        return
                    seq += len(batch)
                    yield batch
                    if ends:
                        return
                    continue
                waiting = run.changed
                with anyio.move_on_after(keepalive_s) as idle:
                    await waiting.wait()
                if idle.cancelled_caught:
                    yield None
        finally:
            run.clients -= 1
            if run.clients == 0 and self._runs.get(run_id) is run:
                del self._runs[run_id]
