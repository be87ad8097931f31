"""Benchmark of the worker pool (DESIGN §11): throughput, queue-to-start latency, recovery time.

    python scripts/bench/workers.py [--pg postgresql://…] [--runs 40] [--pools 1,2,4] [--samples 20]
                                    [--kills 10] [--stores sqlite,postgres]

Real ``flowkernel worker`` processes on a temporary SQLite file and on a fresh PostgreSQL schema
(``--pg``, or ``$FLOWKERNEL_TEST_PG``; the schema is dropped afterwards):

- throughput: ``--runs`` queued runs of a 20-step chain of trivial nodes, through a pool of 1, 2 and
  4 workers (each ``--concurrency 8``), from the moment they are queued to the last one completed;
- queue-to-start latency: one idle worker; a run is queued every 150 ms; the time from its creation
  to its ``flow:start`` (both stamped by this machine's clock), p50 and p99 of ``--samples`` runs;
- recovery: a worker executes a run whose node holds for 60 s and is killed with SIGKILL while an
  idle second worker waits; the time from the kill to the ``flow:resumed`` the other worker commits
  (same host: the dead pid is noticed at the next poll), median of ``--kills``. Then the same after
  SIGSTOP with ``--lease-s 2`` (a frozen or unreachable worker: the lease must expire first).

Prints a Markdown table on stdout, progress on stderr. ``BENCH_TMPDIR`` sets where the SQLite file goes.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
from flowkernel.core.commands import Command
from flowkernel.core.events import FlowResumed, FlowStart
from flowkernel.run.kernel import Kernel
from flowkernel.run.pool import live_workers
from flowkernel.store.open import open_store

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import workers_plugin  # noqa: E402, F401 (registers bench.hold here too: queuing a flow validates it)

STEPS = 20


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 300.0, every_s: float = 0.005) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


def chain(name: str) -> dict[str, Any]:
    nodes = [{"id": f"s{i:02}", "type": "transform", "input": {"expr": f"{i} + 1"}} for i in range(STEPS)]
    return {"name": name, "nodes": nodes, "edges": [{"from": f"s{i:02}", "to": f"s{i + 1:02}"} for i in range(STEPS - 1)]}


HOLD = {"name": "hold", "nodes": [{"id": "hold", "type": "python",
                                   "input": {"function": "bench.hold", "args": {"seconds": 60}}}], "edges": []}


class Pool:
    def __init__(self, db: str, *args: str) -> None:
        self.db, self.args = db, args
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *extra: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "flowkernel", "worker", "--plugin", "workers_plugin",
                                 "--db", self.db, *self.args, *extra], cwd=HERE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait()
        self.procs = []


def _registered(kernel: Kernel, n: int) -> Callable[[], bool]:
    return lambda: len(live_workers(kernel)) >= n


@contextmanager
def pool(kernel: Kernel, db: str, size: int, *args: str) -> Iterator[Pool]:
    p = Pool(db, *args)
    try:
        for _ in range(size):
            p.start()
        wait_for(_registered(kernel, size), f"{size} workers to register", timeout_s=120, every_s=0.05)
        yield p
    finally:
        p.close()
        # A killed worker's row stays until it is noticed; the next pool must not count it.
        for w in kernel.store.list_workers():
            kernel.store.remove_worker(w.workerId)


def throughput(kernel: Kernel, db: str, size: int, runs: int) -> float:
    flow = kernel.compile(chain(f"chain-{size}-{uuid.uuid4().hex[:6]}"))
    with pool(kernel, db, size, "--concurrency", "8"):
        started = time.monotonic()
        ids = [kernel.enqueue(flow, {}) for _ in range(runs)]

        def done() -> bool:
            return sum(r.flowName == flow.name for r in kernel.runs(status="completed")) == len(ids)
        wait_for(done, f"{runs} runs", every_s=0.05)
        return runs / (time.monotonic() - started)


def latency(kernel: Kernel, db: str, samples: int) -> list[float]:
    flow = kernel.compile(chain(f"latency-{uuid.uuid4().hex[:6]}"))
    out: list[float] = []
    with pool(kernel, db, 1):
        time.sleep(1.0)  # let the worker settle into waiting (nothing to race with: a warm start)
        for _ in range(samples):
            run_id = kernel.enqueue(flow, {})
            created = kernel.store.get_run(run_id).createdAt
            wait_for(lambda r=run_id: kernel.store.get_run(r).status == "completed", "a queued run")  # type: ignore[misc]
            start = next(e for e in kernel.events(run_id) if isinstance(e, FlowStart))
            out.append(float(start.timestamp - created))
            time.sleep(0.15)
    return out


def recovery(kernel: Kernel, db: str, kills: int, *, freeze: bool) -> list[float]:
    flow = kernel.compile(HOLD)
    out: list[float] = []
    args = ("--lease-s", "2") if freeze else ()
    p = Pool(db, *args)
    try:
        for _ in range(kills):
            doomed = p.start()
            wait_for(_registered(kernel, 1), "the first worker", timeout_s=120, every_s=0.05)
            run_id = kernel.enqueue(flow, {})
            wait_for(lambda r=run_id: kernel.store.get_run(r).status == "running", "the run to start")  # type: ignore[misc]
            p.start()  # the heir
            wait_for(_registered(kernel, 2), "the second worker", timeout_s=120, every_s=0.05)
            killed_at = time.time() * 1000
            doomed.send_signal(signal.SIGSTOP if freeze else signal.SIGKILL)

            def resumed(r: str = run_id) -> bool:
                return any(isinstance(e, FlowResumed) for e in kernel.events(r))
            wait_for(resumed, "another worker to resume the run", every_s=0.01)
            at = next(e for e in kernel.events(run_id) if isinstance(e, FlowResumed)).timestamp
            out.append(at - killed_at)
            anyio.run(lambda r=run_id: kernel.command(r, Command(kind="abort", reason="benchmark done")))  # type: ignore[misc]
            p.close()
            for w in kernel.store.list_workers():
                kernel.store.remove_worker(w.workerId)
    finally:
        p.close()
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@contextmanager
def store_url(kind: str, pg: str | None) -> Iterator[str]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMPDIR")) as d:
            yield str(Path(d) / "runs.db")
        return
    if not pg:
        raise SystemExit("postgres: give --pg URL or set FLOWKERNEL_TEST_PG")
    import psycopg

    schema = f"fk_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{pg}{'&' if '?' in pg else '?'}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(pg, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--pg", default=os.environ.get("FLOWKERNEL_TEST_PG"))
    ap.add_argument("--stores", default="sqlite,postgres")
    ap.add_argument("--pools", default="1,2,4")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--freezes", type=int, default=3)
    args = ap.parse_args()
    rows: list[tuple[str, str, str]] = []
    for kind in args.stores.split(","):
        with store_url(kind, args.pg) as db:
            kernel = Kernel(open_store(db, create=True))
            try:
                for size in map(int, args.pools.split(",")):
                    log(f"{kind}: throughput, {size} worker(s), {args.runs} runs of {STEPS} steps")
                    rows.append((kind, f"runs/s, {size} worker{'s' if size > 1 else ''} ({STEPS}-step runs)",
                                 f"{throughput(kernel, db, size, args.runs):.1f}"))
                log(f"{kind}: queue-to-start latency, {args.samples} runs")
                lat = latency(kernel, db, args.samples)
                rows.append((kind, "queue-to-start p50 / p99 (ms)", f"{pct(lat, 0.5):.0f} / {pct(lat, 0.99):.0f}"))
                log(f"{kind}: recovery after kill -9, {args.kills} kills")
                rec = recovery(kernel, db, args.kills, freeze=False)
                rows.append((kind, f"recovery after kill -9, same host, median of {len(rec)} (ms)",
                             f"{statistics.median(rec):.0f} (max {max(rec):.0f})"))
                if args.freezes:
                    log(f"{kind}: recovery after SIGSTOP with a 2 s lease, {args.freezes} times")
                    rec = recovery(kernel, db, args.freezes, freeze=True)
                    rows.append((kind, f"takeover of a frozen worker, lease 2 s, median of {len(rec)} (ms)",
                                 f"{statistics.median(rec):.0f}"))
            finally:
                kernel.close()
    print("| store | measure | value |\n| --- | --- | --- |")
    for kind, what, value in rows:
        print(f"| {'SQLite' if kind == 'sqlite' else 'PostgreSQL'} | {what} | {value} |")


if __name__ == "__main__":
    main()
