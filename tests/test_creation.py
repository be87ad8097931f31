"""A run queued with an idempotency key is created once, however many callers ask at once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from flowkernel.run.creation import Enqueued
from flowkernel.run.kernel import Kernel
from flowkernel.store.base import RunRecord
from flowkernel.store.sql.sqlite import SqliteStore

from tests.helpers import flow, t


class _Together(SqliteStore):
    """A store whose first look for an idempotency key waits until both callers have looked: both then
    find nothing, and both try to create the run."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.barrier = threading.Barrier(2, timeout=10)
        self.looked: set[int] = set()

    def find_idempotent(self, key: str) -> RunRecord | None:
        found = super().find_idempotent(key)
        if len(self.looked) < 2 and threading.get_ident() not in self.looked:
            self.looked.add(threading.get_ident())
            self.barrier.wait()
        return found


def test_enqueue_once_returns_the_first_run_of_a_key_when_two_race(tmp_path: Path) -> None:
    store = _Together(tmp_path / "runs.db")
    kernel = Kernel(store)
    try:
        compiled = kernel.compile(flow([t("a", "1")]))
        results: list[Enqueued | BaseException] = []

        def enqueue() -> Any:
            try:
                results.append(kernel.enqueue_once(compiled, {}, "order-7"))
            except BaseException as exc:
                results.append(exc)

        threads = [threading.Thread(target=enqueue) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert all(isinstance(r, Enqueued) for r in results), results
        assert sorted(r.created for r in results if isinstance(r, Enqueued)) == [False, True]
        assert len({r.run_id for r in results if isinstance(r, Enqueued)}) == 1
        assert len(kernel.runs()) == 1
        assert kernel.enqueue_once(compiled, {}, "order-7") == Enqueued(results[0].run_id, False)  # type: ignore[union-attr]
    finally:
        kernel.close()


def test_enqueue_once_without_a_key_creates_a_run_each_time(tmp_path: Path) -> None:
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"))
    try:
        compiled = kernel.compile(flow([t("a", "1")]))
        first, second = kernel.enqueue_once(compiled, {}, None), kernel.enqueue_once(compiled, {}, None)
        assert first.created and second.created and first.run_id != second.run_id
    finally:
        kernel.close()
