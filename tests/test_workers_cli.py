"""A pool of real ``flowkernel worker`` processes over SQLite and PostgreSQL (DESIGN §11).

WHEN workers are SIGKILLed at random while they execute queued runs THEN every run completes, its
seq is gapless, every node completes once and no decision is recorded twice. WHEN a worker is frozen
(SIGSTOP) past its lease THEN another takes its run over, and after SIGCONT the frozen one writes
nothing more to it. WHEN a worker gets SIGTERM THEN another finishes its run within grace + 5 s.
WHEN a flow sets maxConcurrentRuns THEN no more of its runs execute at once, and none starves.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.events import Event
from flowkernel.ids import now_ms
from flowkernel.run.kernel import Kernel
from flowkernel.store.base import Store
from flowkernel.store.open import open_store

import tests.plugins.waiters  # noqa: F401 (its functions, known here too: queuing a flow validates it)
from tests.plugins.pool import digest
from tests.test_postgres import _audited, needs_pg, pg_url  # noqa: F401 (pg_url is a fixture)

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 120.0


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S, every_s: float = 0.02) -> None:
    """Wait for ``check()`` to hold, or fail naming ``what`` (a condition with a deadline)."""
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


def chain_flow(n: int, *, name: str = "pool-chain", **extra: Any) -> dict[str, Any]:
    nodes = [{"id": f"n{i:02}", "type": "python",
              "input": {"function": "pool.step", "args": {"label": f"n{i:02}",
                                                          "prev": "{{ flow.input.seed }}" if i == 0 else
                                                          f"{{{{ n{i - 1:02} }}}}"}}}
             for i in range(n)]
    edges = [{"from": f"n{i:02}", "to": f"n{i + 1:02}"} for i in range(n - 1)]
    return {"name": name, "nodes": nodes, "edges": edges, **extra}


def chain_result(n: int, seed: Any) -> str:
    value = seed
    for i in range(n):
        value = digest(f"n{i:02}", value)
    return str(value)


class Pool:
    """Worker processes on one store; each one's stderr goes to a log file for the failure message."""

    def __init__(self, db: str, env: dict[str, str], logs: Path, *args: str) -> None:
        self.db, self.env, self.logs, self.args = db, env, logs, args
        self.procs: list[subprocess.Popen[bytes]] = []
        logs.mkdir(exist_ok=True)

    def start(self, *extra: str) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"worker{len(self.procs)}.log", "wb")  # noqa: SIM115 (the process owns it)
        proc = subprocess.Popen([sys.executable, "-m", "flowkernel", "worker", "--plugin", "tests.plugins.pool",
                                 "--plugin", "tests.plugins.waiters", "--db", self.db, *self.args, *extra],
                                cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=log)
        log.close()
        self.procs.append(proc)
        return proc

    def live(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def log_of(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.logs / f"worker{self.procs.index(proc)}.log").read_text(errors="replace")

    def all_logs(self) -> str:
        return "\n".join(f"--- worker{i} (exit {p.poll()}):\n{self.log_of(p)[-2000:]}" for i, p in enumerate(self.procs))

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture
def pool_env(clean_env: dict[str, str]) -> dict[str, str]:
    env = dict(clean_env)
    env.pop("POOL_STEP_MS", None)
    return env


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=needs_pg)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "runs.db")
    else:
        url = request.getfixturevalue("pg_url")
        yield url
        assert _audited(url) > 0


def _store(db: str) -> Store:
    return open_store(db)


Shape = tuple["Counter[tuple[str | None, int | None]]", "Counter[tuple[str, str]]"]


def shape(events: list[Event]) -> Shape:
    """How often each node (and forEach item) completed and each edge was decided which way."""
    completes = Counter((e.nodeId, getattr(e, "item", None)) for e in events if e.type == "node:complete")
    decided = Counter((getattr(e, "edgeId", ""), e.type) for e in events if e.type in ("edge:fire", "edge:skip"))
    return completes, decided


def assert_ran_once(kernel: Kernel, run_id: str, like: Shape | None = None) -> list[Event]:
    """Completed; seq gapless; no node run completed twice; every node completed once and no edge
    decided twice (or, for a flow with loops, as often as in the uninterrupted run ``like``)."""
    events = kernel.events(run_id)
    assert kernel.store.get_run(run_id).status == "completed", [e.type for e in events][-10:]
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "seq is gapless"
    node_runs = Counter(e.runId for e in events if e.type == "node:complete")
    assert set(node_runs.values()) == {1}, f"a node run completed more than once: {node_runs}"
    completes, decided = shape(events)
    if like is None:
        assert set(completes.values()) == {1}, f"a node completed more than once: {completes}"
        assert set(decided.values()) <= {1}, f"an edge was decided twice: {decided}"
    else:
        assert completes == like[0], f"node completions differ from an uninterrupted run: {completes} != {like[0]}"
        assert decided == like[1], f"edge decisions differ from an uninterrupted run: {decided} != {like[1]}"
    types = Counter(e.type for e in events)
    assert types["flow:start"] == 1 and types["flow:complete"] == 1
    # Each recovery is a resume: one command:received and one flow:resumed per takeover.
    assert types["command:received"] == types["flow:resumed"]
    return events


# -- SIGKILL: recovery ------------------------------------------------------------------------------

RUNS, NODES, WORKERS = 60, 30, 3


def test_three_workers_complete_every_run_while_a_random_one_is_killed_at_each_quarter_and_every_1_5_s(
        db_url: str, pool_env: dict[str, str], tmp_path: Path) -> None:
    # Kills come with progress (a quarter, half and three quarters of the runs done) as well as with
    # time, so a fast machine that finishes the work in under 1.5 s still kills workers mid-work.
    kernel = Kernel(_store(db_url))
    compiled = kernel.compile(chain_flow(NODES))
    run_ids = [kernel.enqueue(compiled, {"seed": i}) for i in range(RUNS)]
    env = {**pool_env, "POOL_STEP_MS": "5"}
    pool = Pool(db_url, env, tmp_path / "logs", "--concurrency", "3", "--lease-s", "5")
    rng = random.Random(15)
    kills = 0
    try:
        for _ in range(WORKERS):
            pool.start()
        end = time.monotonic() + DEADLINE_S
        next_kill = time.monotonic() + 1.5
        marks = [RUNS // 4, RUNS // 2, 3 * RUNS // 4]
        while time.monotonic() < end:
            remaining = [r for r in kernel.store.list_runs(limit=RUNS + 10) if r.status != "completed"]
            if not remaining:
                break
            passed = [m for m in marks if RUNS - len(remaining) >= m]
            if passed or time.monotonic() >= next_kill:
                marks = [m for m in marks if m not in passed]
                victim = rng.choice(pool.live())
                victim.kill()
                victim.wait()
                kills += 1
                pool.start()
                next_kill = time.monotonic() + rng.uniform(1.2, 1.8)
            time.sleep(0.05)
        else:
            raise AssertionError(f"runs left unfinished after {DEADLINE_S} s and {kills} kills:\n{pool.all_logs()}")
        for run_id, i in zip(run_ids, range(RUNS), strict=True):
            assert_ran_once(kernel, run_id)
            assert kernel.snapshot(run_id).outputs[f"n{NODES - 1:02}"] == chain_result(NODES, i)
        assert kills >= 2, "the pool was killed mid-work more than once"
        takeovers = sum(1 for r in run_ids for e in kernel.events(r) if e.type == "flow:resumed")
        assert takeovers > 0, "some runs were recovered from a killed worker"
    finally:
        pool.close()
        kernel.close()


AGENT_FLOWS = [("review-loop", {"feature": "CSV export"}), ("fanout", {}), ("subflow", {"topic": "durable workflows"})]


def _uninterrupted(kernel: Kernel, name: str, value: dict[str, Any]) -> tuple[Shape, list[Shape]]:
    """The shape of an uninterrupted run of example flow ``name`` (and of its child runs), from its fixtures."""
    from flowkernel.fixtures import MockQuery

    fixtures = ROOT / "fixtures" / name
    ref = Kernel(kernel.store, services={"fixtures": str(fixtures), "query_fn": MockQuery(str(fixtures))})
    snap = anyio.run(ref.run, ref.load_flow(ROOT / "flows" / f"{name}.json"), value)
    assert snap.status == "completed", snap.error
    children = [shape(ref.events(c.runId)) for c in ref.runs(parent=snap.runId)]
    return shape(ref.events(snap.runId)), children


def test_the_example_agent_flows_complete_from_fixtures_while_workers_are_killed(
        db_url: str, pool_env: dict[str, str], tmp_path: Path) -> None:
    # Agents resumed after a kill mid-call rebuild their conversation exactly (prompt once, stored turns,
    # then "continue"), so every run ends as an uninterrupted one: same completions and edge decisions
    # (review-loop loops, so its coder and reviewer complete twice there too).
    kernel = Kernel(_store(db_url))
    like = {name: _uninterrupted(kernel, name, value) for name, value in AGENT_FLOWS}
    run_ids = [(name, kernel.enqueue(kernel.load_flow(ROOT / "flows" / f"{name}.json"), value))
               for name, value in AGENT_FLOWS for _ in range(4)]
    pool = Pool(db_url, pool_env, tmp_path / "logs", "--concurrency", "3", "--fixtures", str(ROOT / "fixtures"))
    rng = random.Random(11)
    kills = 0
    try:
        for _ in range(WORKERS):
            pool.start()
        end = time.monotonic() + DEADLINE_S
        next_kill = time.monotonic() + 1.5
        # Kills follow progress as well as time (the first as soon as a run executes, then each time
        # more runs have finished), so a machine that does the work in under 1.5 s still kills mid-work.
        done_at_kill = -1
        while True:
            statuses = [kernel.store.get_run(r).status for _, r in run_ids]
            if not any(s in ("queued", "running") for s in statuses):
                break
            assert time.monotonic() < end, f"runs left unfinished after {kills} kills:\n{pool.all_logs()}"
            done = sum(s not in ("queued", "running") for s in statuses)
            progressed = "running" in statuses and done > done_at_kill
            if (progressed or time.monotonic() >= next_kill) and kills < 8:
                done_at_kill = done
                victim = rng.choice(pool.live())
                victim.kill()
                victim.wait()
                kills += 1
                pool.start()
                next_kill = time.monotonic() + rng.uniform(1.2, 1.8)
            time.sleep(0.05)
        assert kills >= 2
        for name, run_id in run_ids:
            own, children = like[name]
            assert_ran_once(kernel, run_id, own)
            kids = kernel.runs(parent=run_id)
            assert len(kids) == len(children), f"{name}: {len(kids)} child runs, uninterrupted {len(children)}"
            for child, child_like in zip(kids, children, strict=True):
                assert_ran_once(kernel, child.runId, child_like)
    finally:
        pool.close()
        kernel.close()


# -- SIGSTOP: fencing ---------------------------------------------------------------------------------

def _idle(db: str, pid: int) -> bool:
    """True when process ``pid`` is inside no store transaction (so it can be frozen without freezing
    everyone else): SQLite's write lock is free, or PostgreSQL shows its session idle."""
    if db.startswith("postgresql"):
        import psycopg

        with psycopg.connect(db, autocommit=True) as admin:
            rows = admin.execute("SELECT state FROM pg_stat_activity WHERE application_name = 'flowkernel' "
                                 "AND client_port IS NOT NULL AND pid IN (SELECT pid FROM pg_stat_activity) "
                                 "AND backend_xid IS NOT NULL").fetchall()
        return not rows
    import sqlite3

    probe = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


def _freeze_idle(db: str, proc: subprocess.Popen[bytes]) -> None:
    """SIGSTOP ``proc`` at a moment it holds no transaction (a frozen lock holder would freeze all)."""
    for _ in range(200):
        os.kill(proc.pid, signal.SIGSTOP)
        if _idle(db, proc.pid):
            return
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.005)
    raise AssertionError("could not freeze the worker outside a transaction")


def test_a_frozen_worker_loses_its_run_and_after_waking_writes_nothing_more_to_it(
        db_url: str, pool_env: dict[str, str], tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    kernel = Kernel(_store(db_url))
    document = {"name": "frozen", "nodes": [
        {"id": "a", "type": "python", "input": {"function": "pool.gate", "args": {"label": "a", "dir": str(gates)}}},
        {"id": "b", "type": "python", "input": {"function": "pool.step", "args": {"label": "b", "prev": "{{ a }}"}}}],
        "edges": [{"from": "a", "to": "b"}]}
    run_id = kernel.enqueue(kernel.compile(document))
    pool = Pool(db_url, pool_env, tmp_path / "logs", "--lease-s", "1")
    try:
        frozen = pool.start()
        wait_for(lambda: (gates / "a.entered").exists(), "the first worker to enter node a")
        _freeze_idle(db_url, frozen)
        held = kernel.store.get_run(run_id)
        seq_frozen = held.seq
        rescuer = pool.start()
        # The frozen worker is alive (not dead): the run is taken over only when its lease expires.
        wait_for(lambda: kernel.store.get_run(run_id).leaseEpoch > held.leaseEpoch, "the lease to be taken over",
                 timeout_s=30)
        taken = kernel.store.get_run(run_id)
        assert taken.leaseOwner is not None and f":{rescuer.pid}:" in taken.leaseOwner
        (gates / "a.go").write_text("")  # both node runs of a may finish now
        os.kill(frozen.pid, signal.SIGCONT)
        wait_for(lambda: kernel.store.get_run(run_id).status == "completed", "the rescuer to complete the run")
        wait_for(lambda: "lost its lease" in pool.log_of(frozen), "the woken worker to notice", timeout_s=30)
        events = assert_ran_once(kernel, run_id)
        starts = [e for e in events if e.type == "node:start" and e.nodeId == "a"]
        assert len(starts) == 2 and starts[1].resumedFrom == starts[0].runId  # type: ignore[attr-defined]
        assert events[seq_frozen].type == "command:received", "after the frozen worker's last commit: the takeover"
        assert frozen.poll() is None, "losing a run does not take the worker down"
        assert "cannot save" not in pool.log_of(frozen), "fenced off by the lease, not by a clash of seq numbers"
        assert len(kernel.events(run_id)) == len(events), "nothing more was written"
    finally:
        pool.close()
        kernel.close()


# -- SIGTERM: hand-over -------------------------------------------------------------------------------

def test_sigterm_hands_a_run_in_flight_to_another_worker_within_grace_plus_5_s(
        db_url: str, pool_env: dict[str, str], tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    kernel = Kernel(_store(db_url))
    document = chain_flow(6, name="handover")
    document["nodes"][2] = {"id": "n02", "type": "python",
                            "input": {"function": "pool.gate", "args": {"label": "n02", "dir": str(gates)}}}
    run_id = kernel.enqueue(kernel.compile(document), {"seed": 1})
    grace = 2.0
    pool = Pool(db_url, pool_env, tmp_path / "logs", "--grace-s", str(grace), "--lease-s", "30")
    try:
        leaving = pool.start()
        wait_for(lambda: (gates / "n02.entered").exists(), "the first worker to reach n02")
        staying = pool.start()
        wait_for(lambda: any(w.workerId.split(":")[1] == str(staying.pid) for w in kernel.store.list_workers()),
                 "the second worker to register")
        signalled = time.monotonic()
        leaving.send_signal(signal.SIGTERM)
        (gates / "n02.go").write_text("")  # once the gate opens, the resumed n02 returns at once
        wait_for(lambda: kernel.store.get_run(run_id).status == "completed", "the other worker to finish the run",
                 timeout_s=grace + 5)
        assert time.monotonic() - signalled <= grace + 5
        assert leaving.wait(timeout=grace + 5) == 0, pool.log_of(leaving)
        events = assert_ran_once(kernel, run_id)
        starts = Counter(e.nodeId for e in events if e.type == "node:start")
        assert set(starts.values()) == {1}, "n02 finished within the grace: nothing ran twice"
        assert f":{staying.pid}:" in (kernel.store.get_run(run_id).leaseOwner or f":{staying.pid}:")
        assert kernel.snapshot(run_id).outputs["n05"] is not None
    finally:
        pool.close()
        kernel.close()


def test_a_second_sigterm_exits_at_once(pool_env: dict[str, str], tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    db = str(tmp_path / "runs.db")
    kernel = Kernel(_store(db))
    document = {"name": "stuck", "nodes": [
        {"id": "a", "type": "python", "input": {"function": "pool.gate", "args": {"label": "a", "dir": str(gates)}}}]}
    run_id = kernel.enqueue(kernel.compile(document))
    pool = Pool(db, pool_env, tmp_path / "logs", "--grace-s", "60")
    try:
        worker = pool.start()
        wait_for(lambda: (gates / "a.entered").exists(), "the worker to enter node a")
        worker.send_signal(signal.SIGTERM)
        wait_for(lambda: "handing over" in pool.log_of(worker), "the first signal to be taken")
        began = time.monotonic()
        worker.send_signal(signal.SIGINT)
        assert worker.wait(timeout=10) == 128 + signal.SIGINT
        assert time.monotonic() - began < 5
        assert kernel.store.get_run(run_id).leaseOwner is not None, "left at once: the lease is left to expire"
    finally:
        pool.close()
        kernel.close()
        (gates / "a.go").write_text("")
    # The run stays interrupted; a replay of what was stored still audits.


# -- maxConcurrentRuns --------------------------------------------------------------------------------

def test_max_concurrent_runs_is_never_exceeded_across_workers_and_no_run_starves(
        db_url: str, pool_env: dict[str, str], tmp_path: Path) -> None:
    kernel = Kernel(_store(db_url))
    limited = kernel.compile(chain_flow(4, name="limited", maxConcurrentRuns=2))
    free = kernel.compile(chain_flow(2, name="unlimited"))
    limited_ids = [kernel.enqueue(limited, {"seed": i}) for i in range(8)]
    free_ids = [kernel.enqueue(free, {"seed": i}) for i in range(4)]
    pool = Pool(db_url, {**pool_env, "POOL_STEP_MS": "60"}, tmp_path / "logs", "--concurrency", "4")
    samples: list[int] = []
    try:
        for _ in range(3):
            pool.start()

        def sample() -> bool:
            records = kernel.store.list_runs(limit=100)
            samples.append(sum(1 for r in records if r.flowName == "limited" and r.status == "running"))
            return all(r.status == "completed" for r in records)

        wait_for(sample, "every run to complete", timeout_s=90, every_s=0.01)
        assert max(samples) == 2, f"at most 2 limited runs at once, and the limit was reached: {Counter(samples)}"
        for run_id in [*limited_ids, *free_ids]:
            assert_ran_once(kernel, run_id)
        starts = [kernel.events(r)[0].timestamp for r in limited_ids]
        free_done = max(kernel.events(r)[-1].timestamp for r in free_ids)
        assert free_done < max(starts), "the unlimited runs queued behind were not held up by the limited ones"
        # (The claim order, oldest first, is checked at the store seam: tests/test_queue_store.py. The
        # starts here are written by different processes, which a loaded machine may delay.)
    finally:
        pool.close()
        kernel.close()


# -- commands and wake-ups ----------------------------------------------------------------------------

def _cli(db: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel", *args, "--db", db], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_commands_reach_a_run_on_the_worker_that_executes_it_and_replies_go_back_to_the_pool(
        db_url: str, pool_env: dict[str, str], tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    kernel = Kernel(_store(db_url))
    listen = kernel.enqueue(kernel.compile({"name": "listen", "nodes": [
        {"id": "a", "type": "python", "input": {"function": "await_message"}}]}))
    stuck = kernel.enqueue(kernel.compile({"name": "stuck", "nodes": [
        {"id": "g", "type": "python", "input": {"function": "pool.gate", "args": {"label": "g", "dir": str(gates)}}}]}))
    ask = kernel.enqueue(kernel.compile({"name": "ask", "nodes": [
        {"id": "q", "type": "human.input", "input": {"prompt": "name?"}},
        {"id": "hi", "type": "transform", "input": {"expr": "'hello ' & q"}}], "edges": [{"from": "q", "to": "hi"}]}))
    pool = Pool(db_url, pool_env, tmp_path / "logs", "--concurrency", "4")
    try:
        worker = pool.start()
        wait_for(lambda: "a" in kernel.snapshot(listen).nodeRuns and (gates / "g.entered").exists()
                 and kernel.store.get_run(ask).status == "waiting", "the three runs to reach their nodes")
        listed = _cli(db_url, pool_env, "runs").stdout.splitlines()
        row = next(line for line in listed if line.startswith(stuck))
        assert " running " in row and f":{worker.pid}:" in row, "runs names the worker executing a run"
        sent = _cli(db_url, pool_env, "send", listen, "--to", kernel.snapshot(listen).nodeRuns["a"], "over there")
        assert sent.returncode == 0, sent.stderr
        wait_for(lambda: kernel.store.get_run(listen).status == "completed", "the message to be taken")
        assert kernel.snapshot(listen).outputs["a"] == ["over there"]

        paused = _cli(db_url, pool_env, "pause", stuck)
        assert paused.returncode == 0, paused.stderr
        wait_for(lambda: kernel.store.get_run(stuck).status == "paused", "the pause")
        assert _cli(db_url, pool_env, "abort", stuck).returncode == 0
        assert kernel.store.get_run(stuck).status == "aborted"

        replied = _cli(db_url, pool_env, "reply", ask, "--to", kernel.snapshot(ask).waiting["q"].runId, "Ada")
        assert replied.returncode == 0 and "one continues it" in replied.stderr, replied.stderr
        wait_for(lambda: kernel.store.get_run(ask).status == "completed", "a worker to continue after the reply")
        assert kernel.snapshot(ask).outputs["hi"] == "hello Ada"
        for run_id in (listen, ask):
            types = [e.type for e in kernel.events(run_id)]
            assert types.count("command:received") == 1 and types.count("flow:complete") == 1
    finally:
        (gates / "g.go").write_text("")
        pool.close()
        kernel.close()


def test_an_idle_worker_starts_a_queued_run_promptly(db_url: str, pool_env: dict[str, str], tmp_path: Path) -> None:
    """PostgreSQL: LISTEN/NOTIFY, within 100 ms; SQLite: one poll, within 250 ms (median of 5)."""
    kernel = Kernel(_store(db_url))
    compiled = kernel.compile(chain_flow(1, name="ping"))
    pool = Pool(db_url, pool_env, tmp_path / "logs")
    latencies: list[float] = []
    try:
        worker = pool.start()
        wait_for(lambda: any(f":{worker.pid}:" in w.workerId for w in kernel.store.list_workers()),
                 "the worker to register")
        for i in range(5):
            run_id = kernel.enqueue(compiled, {"seed": i})
            wait_for(lambda run_id=run_id: kernel.store.get_run(run_id).status == "completed", "the run")  # type: ignore[misc]
            latencies.append((kernel.events(run_id)[0].timestamp - kernel.store.get_run(run_id).createdAt) / 1000)
    finally:
        pool.close()
        kernel.close()
    bound = 0.1 if db_url.startswith("postgresql") else 0.25
    assert sorted(latencies)[2] <= bound, f"queue-to-start latencies {latencies}"


# -- the command line ---------------------------------------------------------------------------------

def test_runs_shows_the_worker_that_holds_each_run(pool_env: dict[str, str], tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    kernel = Kernel(_store(db))
    try:
        compiled = kernel.compile(chain_flow(1))
        held, waiting = kernel.enqueue(compiled, {"seed": 1}), kernel.enqueue(compiled, {"seed": 2})
        claim = kernel.store.claim_runs("box:4242:w1", now_ms(), 60_000, limit=1)[0]
        assert claim.runId == held
    finally:
        kernel.close()
    table = subprocess.run([sys.executable, "-m", "flowkernel", "runs", "--db", db], env=pool_env,
                           capture_output=True, text=True, timeout=60).stdout
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert table.splitlines()[0].rstrip().endswith("WORKER")
    assert rows[held].rstrip().endswith("box:4242:w1") and "box:4242" not in rows[waiting]
    # --json carries it too, under the name `flowkernel workers --json` gives a worker's id.
    listed = subprocess.run([sys.executable, "-m", "flowkernel", "runs", "--json", "--db", db], env=pool_env,
                            capture_output=True, text=True, timeout=60).stdout
    holders = {row["runId"]: row["workerId"] for row in map(json.loads, listed.splitlines())}
    assert holders == {held: "box:4242:w1", waiting: None}


def test_run_queue_prints_the_run_id_at_once_and_workers_lists_the_pool(
        pool_env: dict[str, str], tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    flow_file = tmp_path / "chain.json"
    flow_file.write_text(json.dumps(chain_flow(3)))
    cli = [sys.executable, "-m", "flowkernel"]
    cli = [*cli, "--plugin", "tests.plugins.pool"]  # queuing validates the flow: its functions must be known
    out = subprocess.run([*cli, "run", str(flow_file), "--queue", "--input", "seed=3", "--db", db],
                         env=pool_env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip()
    assert run_id.startswith("run_")
    listed = subprocess.run([*cli, "runs", "--db", db, "--json"], env=pool_env, capture_output=True, text=True,
                            timeout=60)
    assert json.loads(listed.stdout.splitlines()[0])["status"] == "queued"
    refused = subprocess.run([*cli, "run", str(flow_file), "--queue", "--fixtures", str(tmp_path), "--db", db],
                             env=pool_env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "flowkernel worker --fixtures" in refused.stderr
    pool = Pool(db, pool_env, tmp_path / "logs", "--concurrency", "2")
    kernel = Kernel(_store(db))
    try:
        worker = pool.start()
        wait_for(lambda: kernel.store.get_run(run_id).status == "completed", "the worker to run it")
        shown = subprocess.run([*cli, "workers", "--db", db, "--json"], env=pool_env, capture_output=True,
                               text=True, timeout=60)
        rows = [json.loads(line) for line in shown.stdout.splitlines()]
        assert [(r["pid"], r["concurrency"]) for r in rows] == [(worker.pid, 2)]
        table = subprocess.run([*cli, "workers", "--db", db], env=pool_env, capture_output=True, text=True,
                               timeout=60).stdout
        assert str(worker.pid) in table and "HEARTBEAT" in table
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        gone = subprocess.run([*cli, "workers", "--db", db], env=pool_env, capture_output=True, text=True,
                              timeout=60).stdout
        assert gone.strip() == "no live workers"
        bad = subprocess.run([*cli, "worker", "--db", db, "--concurrency", "0"], env=pool_env,
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "--concurrency" in bad.stderr and "Traceback" not in bad.stderr
    finally:
        pool.close()
        kernel.close()
