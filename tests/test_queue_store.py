"""The queue and fencing at the store seam, the same on MemoryStore, SqliteStore and PostgresStore.

WHEN runs are queued THEN a claim leases the oldest first, each with a new lease epoch, and never the
same run to two workers; orphans (pooled top-level running runs whose lease is free, expired or held
by a dead worker) are claimed too; a flow's maxConcurrentRuns holds its queued runs back without
holding up the others. WHEN a commit names a lease that no longer holds the run THEN nothing of it is
written (events, status, checkpoint, commands taken), even where the seq would not have collided,
and no agent message or tool call is added under it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from flowkernel.errors import LeaseLostError
from flowkernel.store.base import Lease, RunRecord, Store, WorkerRecord
from flowkernel.store.memory import MemoryStore
from flowkernel.store.sql.sqlite import SqliteStore
from msgspec.structs import replace

from tests.test_postgres import _pg_store, needs_pg, pg_url  # noqa: F401 (pg_url is a fixture)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=needs_pg)])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Opens a new connection to one fresh store (the memory store is one object)."""
    opened: list[Store] = []
    if request.param == "memory":
        memory = MemoryStore()

        def make() -> Store:
            return memory
    elif request.param == "sqlite":
        def make() -> Store:
            opened.append(SqliteStore(tmp_path / "runs.db"))
            return opened[-1]
    else:
        url = request.getfixturevalue("pg_url")

        def make() -> Store:
            opened.append(_pg_store(url))
            return opened[-1]
    yield make
    for s in opened:
        s.close()


def _queued(run_id: str, created: int, *, flow: str = "f", max_runs: int | None = None) -> RunRecord:
    return RunRecord(runId=run_id, flowName=flow, flowHash="h1", status="queued", seq=0, input={},
                     createdAt=created, updatedAt=created, pooled=True, maxRuns=max_runs)


def _event(seq: int) -> tuple[int, int, bytes]:
    return (seq, 1000 + seq, json.dumps({"seq": seq}).encode())


def _start(store: Store, run_id: str, lease: Lease) -> None:
    """What a worker does first with a claimed queued run: its flow:start, under the claim's lease."""
    store.commit(run_id, [_event(1)], "running", 1, None, b"{}", lease=lease)


pytestmark = pytest.mark.no_audit  # hand-made rows, not runs of a flow: nothing for the replay audit


def test_a_claim_leases_queued_runs_oldest_first_with_a_new_epoch(open_store: Callable[[], Store]) -> None:
    store = open_store()
    for i, created in enumerate([30, 10, 20]):
        store.create_run(_queued(f"run_{i}", created), [], b"")
    record = store.get_run("run_0")
    assert (record.status, record.seq, record.pooled, record.updatedAt) == ("queued", 0, True, 30)
    assert store.read_events("run_0") == [] and store.read_checkpoint("run_0") is None

    claims = store.claim_runs("w1", now_ms=1000, ttl_ms=500, limit=2)
    assert [(c.runId, c.status, c.lease) for c in claims] == [("run_1", "queued", Lease("w1", 1)),
                                                              ("run_2", "queued", Lease("w1", 1))]
    assert store.get_run("run_1").leaseOwner == "w1" and store.get_run("run_1").status == "queued"
    # Claimed runs are not claimable again while their lease holds; the third one is.
    assert [c.runId for c in store.claim_runs("w2", now_ms=1100, ttl_ms=500, limit=5)] == ["run_0"]
    assert store.claim_runs("w2", now_ms=1200, ttl_ms=500, limit=5) == []
    # A claimed run whose worker vanished before starting it is claimed again when the lease expires.
    again = store.claim_runs("w3", now_ms=1600, ttl_ms=500, limit=1)
    assert [(c.runId, c.status, c.lease) for c in again] == [("run_1", "queued", Lease("w3", 2))]


def test_orphans_are_claimed_when_their_lease_is_free_expired_or_held_by_the_dead(
        open_store: Callable[[], Store]) -> None:
    store = open_store()
    for name in ("free", "expired", "dead", "alive", "child", "mine"):
        store.create_run(_queued(f"run_{name}", 10), [], b"")
        claim = store.claim_runs(f"w_{name}", now_ms=100, ttl_ms=1000, limit=1)[0]
        _start(store, claim.runId, claim.lease)
    store.release_lease("run_free", Lease("w_free", 1))
    store.renew_lease("run_expired", Lease("w_expired", 1), now_ms=100, ttl_ms=100)
    # Runs that are not the pool's are left to whoever runs them: a CLI run, a child run.
    store.create_run(RunRecord(runId="run_cli", flowName="f", flowHash="h1", status="running", seq=1, input={},
                               createdAt=1, updatedAt=1), [_event(1)], b"{}")
    store.create_run(RunRecord(runId="run_kid", flowName="f", flowHash="h1", status="running", seq=1, input={},
                               createdAt=1, updatedAt=1, parentRunId="run_child", pooled=True), [_event(1)], b"{}")

    claims = store.claim_runs("w9", now_ms=500, ttl_ms=1000, limit=10, dead=["w_dead"])
    assert sorted((c.runId, c.status, c.lease.epoch) for c in claims) == [
        ("run_dead", "running", 2), ("run_expired", "running", 2), ("run_free", "running", 2)]


def test_max_runs_holds_a_flows_queued_runs_back_without_holding_up_the_rest(
        open_store: Callable[[], Store]) -> None:
    store = open_store()
    for i in range(4):
        store.create_run(_queued(f"run_l{i}", 10 + i, flow="limited", max_runs=2), [], b"")
    store.create_run(_queued("run_free", 20, flow="other"), [], b"")

    first = store.claim_runs("w1", now_ms=100, ttl_ms=1000, limit=10)
    assert [c.runId for c in first] == ["run_l0", "run_l1", "run_free"], "two of the limited flow, and the rest"
    assert store.claim_runs("w2", now_ms=100, ttl_ms=1000, limit=10) == []
    _start(store, "run_l0", first[0].lease)
    store.commit("run_l0", [_event(2)], "completed", 2, None, None, lease=first[0].lease, release=True)
    assert [c.runId for c in store.claim_runs("w2", now_ms=200, ttl_ms=1000, limit=10)] == ["run_l2"]
    # Every worker vanishes. A run that started holds its slot even then (an orphan keeps its slot
    # until it is recovered): the claims recover it and re-claim the queued ones, but not a third
    # run of the limited flow.
    _start(store, "run_l1", first[1].lease)
    recovered = store.claim_runs("w3", now_ms=5000, ttl_ms=1000, limit=10)
    assert sorted((c.runId, c.status) for c in recovered) == [
        ("run_free", "queued"), ("run_l1", "running"), ("run_l2", "queued")]


@needs_pg
def test_racing_claims_on_postgres_never_lease_one_run_twice(pg_url: str) -> None:  # noqa: F811
    setup = _pg_store(pg_url)
    workers = [_pg_store(pg_url) for _ in range(4)]
    try:
        for i in range(40):
            setup.create_run(_queued(f"run_{i:02}", i, flow="limited" if i % 2 else "free",
                                     max_runs=3 if i % 2 else None), [], b"")
        got: dict[str, list[str]] = {}
        start = threading.Barrier(len(workers))

        def claim(name: str, store: Store) -> None:
            start.wait()
            mine = got.setdefault(name, [])
            for _ in range(10):
                mine += [c.runId for c in store.claim_runs(name, now_ms=100, ttl_ms=60_000, limit=3)]

        threads = [threading.Thread(target=claim, args=(f"w{i}", s)) for i, s in enumerate(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        claimed = [r for runs in got.values() for r in runs]
        assert len(claimed) == len(set(claimed)), got
        limited = [r for r in claimed if int(r[4:]) % 2]
        assert len(limited) == 3, f"maxRuns 3 under racing claims: {limited}"
        assert len(claimed) == 20 + 3
    finally:
        for s in [setup, *workers]:
            s.close()


def test_a_commit_under_a_lease_taken_over_writes_nothing(open_store: Callable[[], Store]) -> None:
    stale_side, new_side = open_store(), open_store()
    stale_side.create_run(_queued("run_a", 10), [], b"")
    stale = stale_side.claim_runs("w1", now_ms=100, ttl_ms=100, limit=1)[0].lease
    _start(stale_side, "run_a", stale)
    command = new_side.enqueue_command("run_a", {"kind": "pause"})
    # w1 froze past its lease; w2 takes the run over (a new epoch) and has written nothing yet, so
    # seq 2 is free: only the lease check stands between w1 and the log.
    fresh = new_side.claim_runs("w2", now_ms=1000, ttl_ms=1000, limit=1)[0].lease
    assert fresh == Lease("w2", 2)
    with pytest.raises(LeaseLostError, match="now held by w2"):
        stale_side.commit("run_a", [_event(2)], "completed", 2, None, b'{"stale": 1}', {"k": b"stale"},
                          lease=stale, release=True, taken=[(command, 2)])
    run = new_side.get_run("run_a")
    assert (run.status, run.seq, run.leaseOwner, run.leaseEpoch) == ("running", 1, "w2", 2)
    assert new_side.read_events("run_a") == [_event(1)[2]]
    assert new_side.read_checkpoint("run_a") == (1, b"{}")
    assert new_side.read_blobs(["k"]) == {}
    assert [c.id for c in new_side.pending_commands("run_a")] == [command], "the command is still pending"
    assert not stale_side.renew_lease("run_a", stale, now_ms=1000, ttl_ms=100)
    stale_side.release_lease("run_a", stale)
    assert new_side.get_run("run_a").leaseOwner == "w2", "a stale release changes nothing"
    # The same owner taking the run again is a new execution: its old lease is fenced off too.
    new_side.release_lease("run_a", fresh)
    again = new_side.acquire_lease("run_a", "w2", now_ms=1100, ttl_ms=1000)
    assert again == Lease("w2", 3)
    with pytest.raises(LeaseLostError):
        new_side.commit("run_a", [_event(2)], "running", 2, None, None, lease=fresh)
    new_side.commit("run_a", [_event(2)], "running", 2, None, None, lease=again, taken=[(command, 2)])
    assert new_side.pending_commands("run_a") == [], "a command is taken in the commit of its record"


def test_agent_rows_under_a_lease_taken_over_are_refused(open_store: Callable[[], Store]) -> None:
    stale_side, new_side = open_store(), open_store()
    stale_side.create_run(_queued("run_a", 10), [], b"")
    stale = stale_side.claim_runs("w1", now_ms=100, ttl_ms=100, limit=1)[0].lease
    row = {"flowRunId": "run_a", "runId": "nr_1", "nodeId": "agent", "sessionId": "s1", "createdAt": 1}
    stale_side.add_agent_message({**row, "role": "user", "content": "hi", "step": 0}, lease=stale)
    fresh = new_side.claim_runs("w2", now_ms=1000, ttl_ms=1000, limit=1)[0].lease
    with pytest.raises(LeaseLostError, match="now held by w2"):
        stale_side.add_agent_message({**row, "role": "assistant", "content": "late", "step": 1}, lease=stale)
    with pytest.raises(LeaseLostError):
        stale_side.add_tool_call({**row, "messageId": None, "toolName": "t", "toolUseId": "tu_1", "input": {},
                                  "output": "late", "status": "completed", "durationMs": 0, "step": 1}, lease=stale)
    assert [m["content"] for m in new_side.list_agent_messages(flow_run_id="run_a")] == ["hi"]
    assert new_side.list_tool_calls(flow_run_id="run_a") == []
    new_side.add_agent_message({**row, "role": "assistant", "content": "fresh", "step": 1}, lease=fresh)
    assert [m["content"] for m in new_side.list_agent_messages(flow_run_id="run_a")] == ["hi", "fresh"]


def test_workers_register_beat_and_list_the_runs_they_hold(open_store: Callable[[], Store]) -> None:
    store = open_store()
    store.register_worker(WorkerRecord(workerId="h:1:a", host="h", pid=1, startedAt=5, heartbeatAt=5,
                                       concurrency=4, leaseMs=15_000))
    store.register_worker(WorkerRecord(workerId="h:2:b", host="h", pid=2, startedAt=6, heartbeatAt=6,
                                       concurrency=8, leaseMs=15_000))
    store.create_run(_queued("run_a", 10), [], b"")
    store.create_run(_queued("run_b", 11), [], b"")
    store.claim_runs("h:1:a", now_ms=100, ttl_ms=1000, limit=2)
    store.heartbeat("h:1:a", 50)
    listed = store.list_workers()
    assert [(w.workerId, w.heartbeatAt, w.concurrency, w.runs) for w in listed] == [
        ("h:1:a", 50, 4, ["run_a", "run_b"]), ("h:2:b", 6, 8, [])]
    store.remove_worker("h:2:b")
    assert [w.workerId for w in store.list_workers()] == ["h:1:a"]
    assert replace(listed[0], runs=[]).pid == 1
