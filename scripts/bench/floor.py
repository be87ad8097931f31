"""Floor: the irreducible cost of a durable transition, as a bare Python loop over SQLite.

One step = one SQLite transaction that inserts one ~200-byte event row and updates one
~200-byte state row (WAL, synchronous=FULL, so one fsync of the WAL per commit). Nothing
else: no graph, no serialisation of a growing state, no scheduling. Every scenario is
mapped onto that primitive so each table row has a floor figure:

* S1(n): n steps in a row.
* S2: 1 + branches + 1 steps (a node is a step; the floor cannot do better in parallel,
  since SQLite serialises writers anyway).
* S3: ``steps`` steps in this process, then a fresh process opens the file, reads the
  state row and does one more step.
* S4: 3 steps per iteration; the floor persists only the delta, so its bytes per
  transition stay flat while the state grows.
* N1(n): as S1 (whatever a step appends, the floor writes 200 bytes); N1 through the CLI is the
  same loop in a fresh process, timed from spawn to exit.
* N2(iterations): as S4, 3 steps per iteration.
* S5: the single-stream rate, ``runs * steps`` steps one after the other (SQLite serialises writers);
  on PostgreSQL (``FLOWKERNEL_TEST_PG``) the same loop over psycopg.

Run as a script (``floor.py s3-resume DB STEPS`` / ``floor.py steps DB N``) it is the fresh-process side.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import measure
from measure import ROW_BYTES, Metrics, Stopwatch

RUN_ID = "run-1"

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    payload TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS state (
    run_id TEXT PRIMARY KEY,
    step INTEGER NOT NULL,
    payload TEXT NOT NULL
);
"""


def describe() -> str:
    return f"bare sqlite3 loop (SQLite {sqlite3.sqlite_version})"


def _open(db: Path) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions, we issue BEGIN/COMMIT ourselves.
    return measure.open_sqlite(db, isolation_level=None)


def _init(conn: sqlite3.Connection) -> None:
    conn.executescript(SCHEMA)
    conn.execute(
        "INSERT INTO state (run_id, step, payload) VALUES (?, 0, ?)", (RUN_ID, measure.payload(0, ROW_BYTES))
    )


def _step(conn: sqlite3.Connection, step: int) -> None:
    """One durable transition: one transaction, one event insert, one state update."""
    row = measure.payload(step, ROW_BYTES)
    conn.execute("BEGIN")
    conn.execute("INSERT INTO events (run_id, step, payload) VALUES (?, ?, ?)", (RUN_ID, step, row))
    conn.execute("UPDATE state SET step = ?, payload = ? WHERE run_id = ?", (step, row, RUN_ID))
    conn.execute("COMMIT")


def _current_step(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT step FROM state WHERE run_id = ?", (RUN_ID,)).fetchone()[0])


def _check(conn: sqlite3.Connection, expected_steps: int) -> None:
    step = _current_step(conn)
    events = int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
    if step != expected_steps or events != expected_steps:
        raise RuntimeError(f"floor: expected {expected_steps} steps, state.step={step}, events={events}")


def s1(n: int) -> Metrics:
    """Chain of ``n`` steps."""
    with measure.fresh_db() as db:
        conn = _open(db)
        try:
            _init(conn)
            with Stopwatch() as sw:
                for i in range(1, n + 1):
                    _step(conn, i)
            _check(conn, n)
            db_bytes = measure.db_footprint(db)
            db_bytes_checkpointed = measure.checkpointed_size(db)
        finally:
            conn.close()
    return {
        "us_per_step": sw.us / n,
        "total_ms": sw.ms,
        "db_bytes": db_bytes,
        "db_bytes_checkpointed": db_bytes_checkpointed,
    }


def s2(branches: int = measure.S2_BRANCHES) -> Metrics:
    """Fan-out/fan-in: start + ``branches`` + join, one transaction per node."""
    nodes = branches + 2
    with measure.fresh_db() as db:
        conn = _open(db)
        try:
            _init(conn)
            with Stopwatch() as sw:
                for i in range(1, nodes + 1):
                    _step(conn, i)
            _check(conn, nodes)
        finally:
            conn.close()
    return {"us_per_node": sw.us / nodes, "total_ms": sw.ms}


def s3(steps: int = measure.S3_STEPS) -> Metrics:
    """``steps`` steps persisted here, then one more step in a fresh process."""
    with measure.fresh_db() as db:
        conn = _open(db)
        try:
            _init(conn)
            for i in range(1, steps + 1):
                _step(conn, i)
        finally:
            conn.close()
        metrics = measure.run_fresh_process(
            [sys.executable, str(Path(__file__).resolve()), "s3-resume", str(db), str(steps)]
        )
        conn = _open(db)
        try:
            _check(conn, steps + 1)
        finally:
            conn.close()
    return metrics


def _s3_resume(db: Path, steps: int) -> None:
    """Fresh-process side of S3 (timed from here: imports are already done)."""
    with Stopwatch() as sw:
        conn = _open(db)
        current = _current_step(conn)
        if current != steps:
            raise RuntimeError(f"floor resume: found step {current}, expected {steps}")
        _step(conn, current + 1)
        conn.close()
    measure.report_child_metrics({"inproc_ms": sw.ms})


def s4(iterations: int = measure.S4_ITERATIONS) -> Metrics:
    """A 3-step loop run ``iterations`` times; bytes per transition early and late.

    Method (same as the other systems): auto-checkpoint off, so every commit appends its
    pages to the WAL and (db + wal) only grows by what was written; the footprint is sampled
    right before each iteration and after the run, and the growth over a 10-iteration window
    is divided by the window's transitions (30).
    """
    per_iter = measure.S4_NODES_PER_ITERATION
    with measure.fresh_db() as db:
        conn = _open(db)
        try:
            measure.disable_autocheckpoint(conn)
            _init(conn)
            before: dict[int, int] = {}
            step = 0
            with Stopwatch() as sw:
                for it in range(1, iterations + 1):
                    before[it] = measure.db_footprint(db)
                    for _ in range(per_iter):
                        step += 1
                        _step(conn, step)
                before[iterations + 1] = measure.db_footprint(db)
            _check(conn, iterations * per_iter)
        finally:
            conn.close()
    return measure.s4_metrics(before, iterations, per_iter, sw)


def n1(n: int) -> Metrics:
    """The floor of a natural chain is the floor of any chain."""
    return s1(n)


def n1_cli(n: int) -> Metrics:
    """``n`` steps in a fresh process (interpreter start included), spawn to exit."""
    with measure.fresh_db() as db:
        with Stopwatch() as sw:
            measure.run_fresh_process([sys.executable, str(Path(__file__).resolve()), "steps", str(db), str(n)])
        conn = _open(db)
        try:
            _check(conn, n)
        finally:
            conn.close()
        db_bytes = measure.db_footprint(db)
        db_bytes_checkpointed = measure.checkpointed_size(db)
    return {"us_per_step": sw.us / n, "total_ms": sw.ms, "db_bytes": db_bytes,
            "db_bytes_checkpointed": db_bytes_checkpointed}


def _steps(db: Path, n: int) -> None:
    conn = _open(db)
    _init(conn)
    for i in range(1, n + 1):
        _step(conn, i)
    conn.close()
    measure.report_child_metrics({})


def n2(iterations: int) -> Metrics:
    """3 steps per iteration, like S4."""
    steps = iterations * measure.S4_NODES_PER_ITERATION
    with measure.fresh_db() as db:
        conn = _open(db)
        try:
            _init(conn)
            with Stopwatch() as sw:
                for i in range(1, steps + 1):
                    _step(conn, i)
            _check(conn, steps)
            db_bytes = measure.db_footprint(db)
            db_bytes_checkpointed = measure.checkpointed_size(db)
        finally:
            conn.close()
    return {"us_per_iteration": sw.us / iterations, "total_ms": sw.ms, "db_bytes": db_bytes,
            "db_bytes_checkpointed": db_bytes_checkpointed}


def s5(runs: int = measure.S5_RUNS, steps: int = measure.S5_STEPS) -> Metrics:
    """The single-stream rate: ``runs * steps`` durable steps one after the other."""
    total = runs * steps
    with measure.fresh_db() as db:
        conn = _open(db)
        try:
            _init(conn)
            with Stopwatch() as sw:
                for i in range(1, total + 1):
                    _step(conn, i)
            _check(conn, total)
        finally:
            conn.close()
    return {"transitions_per_s": total / sw.seconds, "total_ms": sw.ms}


def s5_pg(runs: int = measure.S5_RUNS, steps: int = measure.S5_STEPS) -> Metrics:
    """The same single stream on PostgreSQL (one transaction per step, fsync'd by the server)."""
    import psycopg

    url = os.environ["FLOWKERNEL_TEST_PG"]
    total = runs * steps
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_floor_events")
        conn.execute("DROP TABLE IF EXISTS bench_floor_state")
        conn.execute("CREATE TABLE bench_floor_events (id BIGSERIAL PRIMARY KEY, run_id TEXT, step INT, payload TEXT)")
        conn.execute("CREATE TABLE bench_floor_state (run_id TEXT PRIMARY KEY, step INT, payload TEXT)")
        conn.execute("INSERT INTO bench_floor_state VALUES (%s, 0, %s)", (RUN_ID, measure.payload(0, ROW_BYTES)))
        try:
            with Stopwatch() as sw:
                for i in range(1, total + 1):
                    row = measure.payload(i, ROW_BYTES)
                    with conn.transaction():
                        conn.execute("INSERT INTO bench_floor_events (run_id, step, payload) VALUES (%s, %s, %s)",
                                     (RUN_ID, i, row))
                        conn.execute("UPDATE bench_floor_state SET step = %s, payload = %s WHERE run_id = %s",
                                     (i, row, RUN_ID))
        finally:
            conn.execute("DROP TABLE bench_floor_events")
            conn.execute("DROP TABLE bench_floor_state")
    return {"transitions_per_s": total / sw.seconds, "total_ms": sw.ms}


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "s3-resume":
        _s3_resume(Path(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "steps":
        _steps(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(f"usage: {sys.argv[0]} s3-resume DB STEPS | steps DB N")
