"""The worker core in one process: queued runs, claims, fencing, recovery and hand-over.

The same ``Worker`` class is what ``flowkernel worker`` runs and what ``serve`` starts in its own
event loop; these tests drive it in-process over a real SQLite file (tests/test_workers_cli.py has
the real-process versions: SIGKILL, SIGSTOP, SIGTERM, PostgreSQL).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.commands import Command
from flowkernel.core.events import CommandReceived, FlowComplete, FlowStart
from flowkernel.errors import CommandRejectedError, LeaseLostError, StoreError
from flowkernel.run.kernel import Kernel
from flowkernel.run.pool import live_workers
from flowkernel.store.base import Lease, RunRecord
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.workers.worker import Worker

from tests.helpers import flow, py, registry, t

DEADLINE_S = 20.0


async def until(check: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    """Wait for ``check()`` to hold, or fail naming ``what`` (a condition with a deadline, not a sleep)."""
    with anyio.move_on_after(timeout_s):
        while not check():
            await anyio.sleep(0.01)
        return
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def chain(n: int, **extra: Any) -> dict[str, Any]:
    nodes = [t(f"n{i}", f"{i}") for i in range(n)]
    return flow(nodes, [{"from": f"n{i}", "to": f"n{i + 1}"} for i in range(n - 1)], **extra)


def kernel_on(path: Path, reg: Any = None, lease_ttl_ms: int = 15_000) -> Kernel:
    return Kernel(SqliteStore(path), registry=reg or registry(), lease_ttl_ms=lease_ttl_ms)


async def with_worker(kernel: Kernel, body: Callable[[Worker], Awaitable[None]], **options: Any) -> Worker:
    worker = Worker(kernel, poll_s=0.02, **options)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await body(worker)
        worker.stop()
    return worker


def test_a_queued_run_returns_at_once_and_a_worker_starts_and_completes_it(tmp_path: Path) -> None:
    kernel = kernel_on(tmp_path / "runs.db")
    compiled = kernel.compile(chain(5))
    run_id = kernel.enqueue(compiled, {"x": 1})
    record = kernel.store.get_run(run_id)
    assert (record.status, record.seq, record.pooled, record.input) == ("queued", 0, True, {"x": 1})
    assert kernel.events(run_id) == [], "nothing has started: the log begins with the worker's flow:start"
    queued = kernel.snapshot(run_id)
    assert (queued.status, queued.seq, queued.input) == ("queued", 0, {"x": 1})
    assert set(queued.nodeStatus.values()) == {"pending"}

    async def body(worker: Worker) -> None:
        await until(lambda: kernel.store.get_run(run_id).status == "completed", "the run to complete")
        assert [w.workerId for w in live_workers(kernel)] == [worker.id]

    worker = anyio.run(with_worker, kernel, body)
    events = kernel.events(run_id)
    assert isinstance(events[0], FlowStart) and events[0].timestamp >= record.createdAt
    assert isinstance(events[-1], FlowComplete) and events[-1].status == "completed"
    assert kernel.snapshot(run_id).outputs["n4"] == 4
    done = kernel.store.get_run(run_id)
    assert (done.leaseOwner, done.leaseEpoch) == (None, 1), "claimed once, released by its last commit"
    assert worker.started == 1 and live_workers(kernel) == [], "a stopped worker deregisters"


def test_a_queued_run_can_be_aborted_but_not_resumed_sent_to_or_paused(tmp_path: Path) -> None:
    kernel = kernel_on(tmp_path / "runs.db")
    compiled = kernel.compile(chain(2))
    run_id = kernel.enqueue(compiled)
    for cmd in (Command(kind="send", target="nr_x", content="hi"), Command(kind="pause")):
        with pytest.raises(CommandRejectedError):
            anyio.run(kernel.command, run_id, cmd)
    with pytest.raises(CommandRejectedError, match="queued and has not started"):
        anyio.run(kernel.resume, run_id)
    assert kernel.events(run_id) == [] and kernel.store.get_run(run_id).status == "queued"
    anyio.run(kernel.command, run_id, Command(kind="abort", reason="not needed"))
    events = kernel.events(run_id)
    assert [e.type for e in events] == ["flow:start", "command:received", "flow:complete"]
    assert isinstance(events[1], CommandReceived) and events[1].accepted
    assert kernel.store.get_run(run_id).status == "aborted"
    assert kernel.store.claim_runs("w", int(time.time() * 1000), 1000, 5) == [], "an aborted run is not claimed"


def test_an_execution_whose_lease_was_taken_over_stops_and_writes_nothing_more(tmp_path: Path) -> None:
    """Fencing inside one process: the executor is held inside a node while another takes the run."""
    gate = anyio.Event()
    entered = anyio.Event()

    async def hold() -> str:
        entered.set()
        await gate.wait()
        return "late"

    path = tmp_path / "runs.db"
    kernel = kernel_on(path, registry(hold=hold))
    other = kernel_on(path, registry(hold=hold))
    compiled = kernel.compile(flow([py("a", "hold"), t("b", "'after'")], [{"from": "a", "to": "b"}]))

    async def main() -> None:
        result: list[BaseException] = []

        async def execute() -> None:
            try:
                await kernel.run(compiled)
            except LeaseLostError as exc:
                result.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(execute)
            await entered.wait()
            run_id = kernel.store.list_runs()[0].runId
            taken = other.store.acquire_lease(run_id, other.owner, int(time.time() * 1000), 60_000,
                                              steal_from=kernel.owner)
            assert taken == Lease(other.owner, 2)
            before = len(other.events(run_id))
            gate.set()
        assert len(result) == 1 and "lost its lease" in str(result[0])
        assert len(other.events(run_id)) == before, "the stale execution's node:complete was refused"
        assert other.store.get_run(run_id).leaseOwner == other.owner
        # The one that holds the lease continues the run as resume would, and completes it once.
        final = await other.recover(run_id, taken)
        assert final.status == "completed"
        assert [e.type for e in other.events(run_id)].count("flow:complete") == 1

    anyio.run(main)


def test_a_run_held_by_a_worker_on_another_host_is_recovered_when_its_lease_expires(tmp_path: Path) -> None:
    gate = anyio.Event()

    async def hold() -> str:
        await gate.wait()
        return "held"

    path = tmp_path / "runs.db"
    elsewhere = kernel_on(path, registry(hold=hold))
    elsewhere.owner = "elsewhere:4242:abcdef"  # a worker on another host: its pid means nothing here
    compiled = elsewhere.compile(flow([py("a", "hold"), t("b", "a")], [{"from": "a", "to": "b"}]))
    run_id = elsewhere.enqueue(compiled)
    kernel = kernel_on(path, registry(hold=lambda: "again"))

    async def main() -> None:
        # It claims the run and starts node a; then its machine goes away mid-node, holding a lease
        # that runs out 300 ms later.
        claim = elsewhere.store.claim_runs(elsewhere.owner, int(time.time() * 1000), 60_000, 1)[0]
        with anyio.move_on_after(0.2):
            await elsewhere.recover(run_id, claim.lease)
        elsewhere.store.acquire_lease(run_id, elsewhere.owner, int(time.time() * 1000), 300)
        assert kernel.store.get_run(run_id).leaseOwner == elsewhere.owner
        began = time.monotonic()

        async def body(worker: Worker) -> None:
            await until(lambda: kernel.store.get_run(run_id).status == "completed", "the orphan to be recovered")

        await with_worker(kernel, body)
        assert time.monotonic() - began < 5

    anyio.run(main)
    types = [e.type for e in kernel.events(run_id)]
    assert types[:3] == ["flow:start", "node:start", "command:received"], "recovered exactly as resume would"
    assert types[3] == "flow:resumed"
    assert types.count("flow:start") == 1 and types.count("flow:complete") == 1
    assert kernel.snapshot(run_id).outputs["b"] == "again"
    assert kernel.store.get_run(run_id).leaseEpoch == 3


def test_a_claimed_run_with_nothing_in_flight_continues_without_a_resume(tmp_path: Path) -> None:
    kernel = kernel_on(tmp_path / "runs.db")
    compiled = kernel.compile(chain(3))
    run_id = kernel.enqueue(compiled)
    claim = kernel.store.claim_runs("elsewhere:1:x", int(time.time() * 1000), 100, 1)[0]
    kernel.creation.start_queued(compiled, kernel.store.get_run(run_id), claim.lease)  # started, then its worker vanished

    async def body(worker: Worker) -> None:
        await until(lambda: kernel.store.get_run(run_id).status == "completed", "the orphan to be recovered")

    anyio.run(with_worker, kernel, body)
    types = [e.type for e in kernel.events(run_id)]
    assert types[:2] == ["flow:start", "node:start"] and "flow:resumed" not in types


def test_a_stopping_worker_lets_node_runs_finish_and_hands_the_run_to_another(tmp_path: Path) -> None:
    started = anyio.Event()

    async def slow(label: str) -> str:
        started.set()
        await anyio.sleep(0.3)
        return label

    path = tmp_path / "runs.db"
    reg = registry(slow=slow)
    first, second = kernel_on(path, reg), kernel_on(path, reg)
    compiled = first.compile(flow([py("a", "slow", {"label": "a"}), py("b", "slow", {"label": "b"})],
                                  [{"from": "a", "to": "b"}]))
    run_id = first.enqueue(compiled)

    async def body(worker: Worker) -> None:
        await started.wait()

    anyio.run(with_worker, first, body)
    # ``a`` finished within the grace, ``b`` never started; the run was left running, lease released.
    record = first.store.get_run(run_id)
    snap = first.snapshot(run_id)
    assert (record.status, record.leaseOwner) == ("running", None)
    assert (snap.nodeStatus["a"], snap.nodeStatus["b"]) == ("done", "pending")

    async def finish(worker: Worker) -> None:
        await until(lambda: second.store.get_run(run_id).status == "completed", "the hand-over")

    anyio.run(with_worker, second, finish)
    types = [e.type for e in second.events(run_id)]
    assert types.count("node:start") == 2, "no node ran twice"


def test_a_stopping_worker_cancels_what_outlasts_the_grace_and_the_next_resumes_it(tmp_path: Path) -> None:
    started = anyio.Event()

    async def forever() -> None:
        started.set()
        await anyio.sleep_forever()

    async def quick() -> str:
        return "done"

    path = tmp_path / "runs.db"
    first = kernel_on(path, registry(forever=forever))
    compiled = first.compile(flow([py("a", "forever")]))
    run_id = first.enqueue(compiled)

    async def body(worker: Worker) -> None:
        await started.wait()

    began = time.monotonic()
    anyio.run(lambda: with_worker(first, body, grace_s=0.2))
    assert time.monotonic() - began < 3
    assert first.store.get_run(run_id).leaseOwner is None
    # The next worker resumes the interrupted node run (here with a function that returns).
    second = kernel_on(path, registry(forever=quick))

    async def finish(worker: Worker) -> None:
        await until(lambda: second.store.get_run(run_id).status == "completed", "the hand-over")

    anyio.run(with_worker, second, finish)
    starts = [e for e in second.events(run_id) if e.type == "node:start"]
    assert len(starts) == 2 and starts[1].resumedFrom == starts[0].runId  # type: ignore[attr-defined]


def test_max_concurrent_runs_is_part_of_the_flow_file_and_stored_with_each_run(tmp_path: Path) -> None:
    kernel = kernel_on(tmp_path / "runs.db")
    compiled = kernel.compile(chain(1, maxConcurrentRuns=2))
    assert compiled.max_concurrent_runs == 2
    assert kernel.store.get_run(kernel.enqueue(compiled)).maxRuns == 2
    from flowkernel.errors import FlowValidationError

    with pytest.raises(FlowValidationError, match=r"\$.maxConcurrentRuns"):
        kernel.compile(chain(1, maxConcurrentRuns=0))


def test_a_run_record_of_a_queued_run_reads_back_from_every_store(tmp_path: Path) -> None:
    from flowkernel.store.memory import MemoryStore

    for store in (MemoryStore(), SqliteStore(tmp_path / "runs.db")):
        kernel = Kernel(store)
        run_id = kernel.enqueue(kernel.compile(chain(1)), idempotency_key="order-17")
        record: RunRecord = store.get_run(run_id)
        assert (record.status, record.seq, record.pooled) == ("queued", 0, True)
        assert [r.runId for r in store.list_runs(status="queued")] == [run_id]
        found = store.find_idempotent("order-17")
        assert found is not None and found.runId == run_id
        with pytest.raises(StoreError):
            kernel.enqueue(kernel.compile(chain(1)), idempotency_key="order-17")
