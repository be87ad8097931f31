"""Runs executing together share transactions; one run's failed commit never takes others' rows with it."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.errors import LeaseLostError, StoreError
from flowkernel.run.kernel import Kernel
from flowkernel.store.base import CommitRequest, CreateRequest, Store
from flowkernel.store.memory import MemoryStore
from flowkernel.store.sql.sqlite import SqliteStore

from tests.helpers import flow, py, registry
from tests.test_postgres import _event, _record, open_store, pg_url  # noqa: F401 (fixtures)


def _chain(n: int) -> dict[str, Any]:
    return flow([py(f"n{i}", "step", {"i": i}) for i in range(n)],
                [{"from": f"n{i}", "to": f"n{i + 1}"} for i in range(n - 1)])


def _many(kernel: Kernel, document: dict[str, Any], runs: int) -> list[Any]:
    finals: list[Any] = []

    async def main() -> None:
        compiled = kernel.compile(document)

        async def one() -> None:
            try:
                finals.append(await kernel.run(compiled, {}))
            except* StoreError as group:
                finals.append(group.exceptions[0])

        async with anyio.create_task_group() as tg:
            for _ in range(runs):
                tg.start_soon(one)

    anyio.run(main)
    return finals


class Groups:
    """The size of every transaction a store's ``commit_group`` made."""

    def __init__(self, store: Any) -> None:
        self.sizes: list[int] = []
        real = store.commit_group

        def commit_group(requests: Sequence[Any]) -> list[Exception | None]:
            self.sizes.append(len(requests))
            return real(requests)  # type: ignore[no-any-return]

        store.commit_group = commit_group


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_runs_executing_together_share_their_transactions(kind: str, tmp_path: Path) -> None:
    store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "runs.db")

    async def step(i: int) -> int:
        await anyio.sleep(0)  # a node that awaits: the runs interleave
        return i

    groups = Groups(store)
    kernel = Kernel(store, registry=registry(step=step))
    finals = _many(kernel, _chain(5), 20)
    assert [f.status for f in finals] == ["completed"] * 20
    assert max(groups.sizes) > 1
    assert len(groups.sizes) * 3 < sum(groups.sizes)  # far fewer transactions than commits and creations
    for f in finals:
        assert [e.seq for e in kernel.events(f.runId)] == list(range(1, f.seq + 1))


def test_a_run_executing_alone_commits_as_before_without_a_group(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    groups = Groups(store)
    kernel = Kernel(store, registry=registry(step=lambda i: i))
    [final] = _many(kernel, _chain(5), 1)
    assert final.status == "completed" and groups.sizes == []


@pytest.mark.no_audit
def test_a_failed_commit_in_a_group_is_rolled_back_alone(open_store: Callable[[], Store]) -> None:  # noqa: F811
    store = open_store()
    store.put_flow("h1", "f", '{"name": "f"}')
    for run in ("a", "b", "c"):
        store.create_run(_record(run), [_event(1)], b'{"cp": 1}')
    store.commit("b", [_event(2)], "running", 2, None, None)  # another executor got there first
    results = store.commit_group([
        CommitRequest(runId="a", events=[_event(2), _event(3)], status="running", seq=3, error=None,
                      checkpoint=None, blobs={"k1": b'"blob of a"'}),
        CommitRequest(runId="b", events=[_event(2)], status="completed", seq=2, error=None,
                      checkpoint=b'{"cp": 2}', blobs={"k2": b'"blob of b"'}),
        CreateRequest(record=_record("d"), events=[_event(1)], checkpoint=b'{"cp": 1}'),
        CommitRequest(runId="c", events=[_event(2)], status="completed", seq=2, error=None, checkpoint=b'{"cp": 2}'),
    ])
    assert results[0] is None and results[2] is None and results[3] is None
    assert isinstance(results[1], StoreError) and "out of order" in str(results[1])
    assert len(store.read_events("a")) == 3 and store.read_blobs(["k1"]) == {"k1": b'"blob of a"'}
    assert len(store.read_events("b")) == 2 and store.get_run("b").status == "running"  # none of its rows
    assert store.read_blobs(["k2"]) == {} and store.read_checkpoint("b") == (1, b'{"cp": 1}')
    assert store.get_run("c").status == "completed" and store.read_checkpoint("c") == (2, b'{"cp": 2}')
    assert store.get_run("d").status == "running" and len(store.read_events("d")) == 1


@pytest.mark.no_audit
def test_a_commit_in_a_group_checks_its_own_lease_in_that_transaction(open_store: Callable[[], Store]) -> None:  # noqa: F811
    store = open_store()
    store.put_flow("h1", "f", '{"name": "f"}')
    leases = {}
    for run in ("a", "b"):
        store.create_run(_record(run), [_event(1)], b'{"cp": 1}')
        leases[run] = store.acquire_lease(run, "worker-1", 1000, 60_000)
    # b's lease expired and another worker took it over: worker-1's commits of b are fenced off.
    taken = store.acquire_lease("b", "worker-2", 10**12, 60_000)
    assert taken.owner == "worker-2" and taken.epoch > leases["b"].epoch
    results = store.commit_group([
        CommitRequest(runId="a", events=[_event(2)], status="completed", seq=2, error=None,
                      checkpoint=b'{"cp": 2}', lease=leases["a"], release=True),
        CommitRequest(runId="b", events=[_event(2)], status="completed", seq=2, error=None,
                      checkpoint=b'{"cp": 2}', blobs={"kb": b'"b"'}, lease=leases["b"], release=True),
    ])
    assert results[0] is None and isinstance(results[1], LeaseLostError)
    assert store.get_run("a").status == "completed" and store.get_run("a").leaseOwner is None
    b = store.get_run("b")
    assert (b.status, b.seq, b.leaseOwner) == ("running", 1, "worker-2") and len(store.read_events("b")) == 1
    assert store.read_blobs(["kb"]) == {} and store.read_checkpoint("b") == (1, b'{"cp": 1}')


def test_a_run_whose_commit_fails_fails_alone_while_the_others_complete(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = SqliteStore(db)
    intruder = SqliteStore(db)
    seen: dict[str, int] = collections.Counter()

    async def step(i: int, ctx: Any) -> int:
        await anyio.sleep(0)
        if i == 2 and ctx.flow_run_id == victim[0]:
            # Another process appends to this run: its next commit must fail, and only its own.
            snap = ctx._shell.current_snapshot()
            intruder.commit(ctx.flow_run_id, [(snap.seq + 1, 0, b'{"type":"flow:paused","seq":0}')],
                            "running", snap.seq + 1, None, None)
        seen[ctx.flow_run_id] += 1
        return i

    victim: list[str] = []
    kernel = Kernel(store, registry=registry(step=step))
    original = kernel.creation.new_run

    def first_is_victim(*a: Any, **kw: Any) -> Any:
        created = original(*a, **kw)
        if not victim:
            victim.append(created[0].run_id)
        return created

    kernel.creation.new_run = first_is_victim  # type: ignore[method-assign]
    finals = _many(kernel, _chain(5), 8)
    failed = [f for f in finals if isinstance(f, StoreError)]
    assert len(failed) == 1 and victim[0] in str(failed[0])
    done = [f for f in finals if not isinstance(f, StoreError)]
    assert len(done) == 7 and all(f.status == "completed" for f in done)
    for f in done:
        assert [e.seq for e in kernel.events(f.runId)] == list(range(1, f.seq + 1))
    intruder.close()


def test_a_run_whose_last_commit_is_in_flight_when_its_lease_renews_completes(tmp_path: Path) -> None:
    # The commit that stops a run also ends its lease, in a worker thread while other runs go on: a
    # renewal that finds the lease ended meanwhile must not take it for a lease lost to another executor.
    store = SqliteStore(tmp_path / "runs.db")

    async def step(i: int) -> int:
        await anyio.sleep(0.001)
        return i

    kernel = Kernel(store, registry=registry(step=step), lease_ttl_ms=30)  # renewed every 10 ms
    finals = _many(kernel, _chain(8), 40)
    assert [getattr(f, "status", f) for f in finals] == ["completed"] * 40
