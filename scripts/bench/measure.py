"""Shared measuring kit for the benchmark: timing, SQLite setup, sizes, statistics, tables.

Every system module (``floor``, ``peers``, ``flowkernel_side``) builds on these helpers so
that all sides measure the same way:

* time with :func:`time.perf_counter_ns` (:class:`Stopwatch`);
* open SQLite with WAL and ``synchronous=FULL`` (:func:`open_sqlite` / :func:`apply_durable_pragmas`);
* use a fresh temporary database file per measurement (:func:`fresh_db`);
* count on-disk bytes as main db file + ``-wal`` file (:func:`db_footprint`);
* write the same deterministic 100-byte payloads (:func:`payload`);
* measure bytes per transition over the same iteration windows (:func:`s4_windows`,
  :func:`window_bytes_per_transition`).

Only the standard library is imported here, so the fresh-process resume scripts stay cheap.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

Metrics = dict[str, float]
"""What every scenario function returns: metric key -> number (one repetition)."""

ScenarioFn = Callable[..., Metrics]

PAYLOAD_BYTES = 100
"""Size of the string each step appends to the state."""

ROW_BYTES = 200
"""Size of the floor's event row and state row payloads."""

S1_SIZES: tuple[int, ...] = (50, 200, 1000)
S1_SIZES_QUICK: tuple[int, ...] = (50, 200)
S2_BRANCHES = 50
S3_STEPS = 200
S4_ITERATIONS = 1000
S4_ITERATIONS_QUICK = 100
S4_WINDOW = 10
"""Iterations per measuring window in S4."""
S4_EARLY_ITERATION = 10
S4_NODES_PER_ITERATION = 3

# The natural scenarios (issue 13): N1 a chain of ``state.set`` appends, N2 a 3-node loop whose
# agent-like node returns its whole, growing transcript. Growth exponents are taken between the sizes.
N1_SIZES: tuple[int, ...] = (1000, 3000)
N1_SIZES_QUICK: tuple[int, ...] = (200, 600)
N2_SIZES: tuple[int, ...] = (1000, 3000)
N2_SIZES_QUICK: tuple[int, ...] = (200, 600)
# S5: many runs executing at once in one process (the shape of a worker).
S5_RUNS = 100
S5_STEPS = 20
# The scheduler at scale (in memory, CPU only): a quarter of the size, then the full size.
FANOUT_SIZES: tuple[int, ...] = (2000, 8000)
FANOUT_SIZES_QUICK: tuple[int, ...] = (500, 2000)
FOREACH_SIZES: tuple[int, ...] = (5000, 20000)
FOREACH_SIZES_QUICK: tuple[int, ...] = (1000, 4000)
# A model streaming text: deltas, and the pause between two of them (faster than any model streams).
DELTAS = 10_000
DELTAS_QUICK = 2_000
DELTA_PACE_S = 0.0005
STARTUP_RUNS = 10


class Skipped(Exception):
    """A system does not run this case (the reason is shown under the table)."""


class CpuClock:
    """``with CpuClock() as c: ...`` then ``c.seconds``: this process's CPU time (user + system)."""

    def __init__(self) -> None:
        self._start = 0.0
        self.seconds = 0.0

    def __enter__(self) -> CpuClock:
        self._start = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.process_time() - self._start


def spawn_ms(argv: Sequence[str], runs: int, **kwargs: object) -> float:
    """Median wall time of ``runs`` spawns of ``argv`` (spawn to exit, output discarded)."""
    times = []
    for _ in range(runs):
        with Stopwatch() as sw:
            subprocess.run(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                           **kwargs)  # type: ignore[call-overload]
        times.append(sw.ms)
    return median(times)


def ensure_installed() -> None:
    """Stop with a hint unless ``flowkernel`` is importable (the repository maps ``kernel/`` to it only
    through an install: ``pip install -e '.[bench]'``)."""
    try:
        import flowkernel  # noqa: F401
    except ImportError:
        sys.exit("bench: flowkernel is not installed here; run `pip install -e '.[bench]'` first")


def payload(i: int, size: int = PAYLOAD_BYTES) -> str:
    """A deterministic, distinct ASCII string of exactly ``size`` bytes for step ``i``."""
    unit = f"item-{i:08d}|"
    return (unit * (size // len(unit) + 1))[:size]


def progress(message: str) -> None:
    """Progress goes to stderr so stdout stays the table."""
    print(message, file=sys.stderr, flush=True)


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds`` / ``sw.ms`` / ``sw.us``."""

    def __init__(self) -> None:
        self._start = 0
        self.elapsed_ns = 0

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter_ns()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.elapsed_ns = time.perf_counter_ns() - self._start

    @property
    def seconds(self) -> float:
        return self.elapsed_ns / 1e9

    @property
    def ms(self) -> float:
        return self.elapsed_ns / 1e6

    @property
    def us(self) -> float:
        return self.elapsed_ns / 1e3


# --------------------------------------------------------------------------- SQLite


def apply_durable_pragmas(conn: sqlite3.Connection) -> None:
    """WAL + synchronous=FULL, verified (a silently ignored pragma would skew everything)."""
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    conn.execute("PRAGMA synchronous=FULL")
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    if str(mode).lower() != "wal" or int(sync) != 2:
        raise RuntimeError(f"could not set WAL/synchronous=FULL (journal_mode={mode}, synchronous={sync})")


def open_sqlite(
    path: Path,
    *,
    check_same_thread: bool = True,
    isolation_level: Literal["DEFERRED", "EXCLUSIVE", "IMMEDIATE"] | None = "DEFERRED",
) -> sqlite3.Connection:
    """Open ``path`` with WAL and synchronous=FULL.

    ``isolation_level`` as in :func:`sqlite3.connect`: "DEFERRED" (implicit BEGIN before
    writes, the default behaviour) or None (autocommit; the caller issues BEGIN/COMMIT).
    """
    conn = sqlite3.connect(path, check_same_thread=check_same_thread, isolation_level=isolation_level)
    apply_durable_pragmas(conn)
    return conn


def disable_autocheckpoint(conn: sqlite3.Connection) -> None:
    """Stop this connection from folding the WAL back into the db file.

    With auto-checkpoint off every committed page is appended to the ``-wal`` file and the
    WAL is never rewound, so growth of (db + wal) equals the bytes the commits wrote.
    With it on, the WAL is rewound after ~1000 pages and reused from the start, so its
    size stops growing and size deltas no longer measure writes (used in S4).
    """
    conn.execute("PRAGMA wal_autocheckpoint=0")


def wal_path(db: Path) -> Path:
    return db.with_name(db.name + "-wal")


def db_footprint(db: Path) -> int:
    """Main database file + ``-wal`` file, in bytes (missing files count 0)."""
    total = 0
    for p in (db, wal_path(db)):
        with contextlib.suppress(FileNotFoundError):
            total += p.stat().st_size
    return total


def checkpointed_size(db: Path) -> int:
    """Size of the db file after folding the WAL in and truncating it (live data + free pages).

    Opens its own connection, so it works whatever connection the system used, as long as
    that one holds no open transaction.
    """
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return db_footprint(db)


@contextlib.contextmanager
def fresh_db(name: str = "bench.db") -> Iterator[Path]:
    """A path for a new database file in a fresh temp directory, removed afterwards.

    ``BENCH_TMPDIR`` chooses the parent directory (keep it on a real disk: on tmpfs fsync is
    free and the durability cost disappears).
    """
    with tempfile.TemporaryDirectory(prefix="fkbench-", dir=os.environ.get("BENCH_TMPDIR")) as d:
        yield Path(d) / name


# --------------------------------------------------------------------------- S3 fresh process


def report_child_metrics(metrics: Metrics) -> None:
    """Called by a resume script: print its in-process figures as the last stdout line."""
    print(json.dumps(metrics), flush=True)


def run_fresh_process(argv: Sequence[str], *, timeout: float = 120.0) -> Metrics:
    """Spawn ``argv`` (a resume script), wait for it, return its metrics plus ``process_ms``.

    ``process_ms`` is the wall time from just before spawn to just after exit, so it contains
    interpreter start, imports, resume work and teardown. The child reports its own
    in-process figures (e.g. ``inproc_ms``) as a JSON object on its last stdout line.
    """
    with Stopwatch() as sw:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"resume process failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError("resume process printed no metrics")
    child = json.loads(lines[-1])
    metrics: Metrics = {k: float(v) for k, v in child.items()}
    metrics["process_ms"] = sw.ms
    return metrics


# --------------------------------------------------------------------------- S4 windows


@dataclass(frozen=True)
class Window:
    """Iterations ``first..last`` inclusive."""

    first: int
    last: int

    @property
    def iterations(self) -> int:
        return self.last - self.first + 1


def s4_windows(iterations: int) -> tuple[Window, Window]:
    """The early window (10 iterations around iteration 10) and the late window (last 10).

    Early: iterations 6..15; late: iterations ``iterations-9 .. iterations``.
    """
    half = S4_WINDOW // 2
    early_first = max(1, S4_EARLY_ITERATION - half + 1)
    early = Window(early_first, min(iterations, early_first + S4_WINDOW - 1))
    late = Window(max(1, iterations - S4_WINDOW + 1), iterations)
    return early, late


def s4_steady_window(iterations: int) -> Window:
    """The 10 iterations before the last one: late in the run, but without the run's final commit
    (its end-of-run status and checkpoint), which the late window above also counts."""
    return Window(max(1, iterations - S4_WINDOW), iterations - 1)


def window_bytes_per_transition(
    before_iteration: Mapping[int, int], window: Window, transitions_per_iteration: int
) -> float:
    """Bytes written per transition over ``window``.

    ``before_iteration[k]`` is the db footprint sampled right before iteration ``k`` starts
    (after all transitions of iterations ``< k`` were committed); ``before_iteration[n + 1]``
    is the footprint after the run. With auto-checkpoint disabled the difference is exactly
    what the window's commits appended.
    """
    grown = before_iteration[window.last + 1] - before_iteration[window.first]
    return grown / (window.iterations * transitions_per_iteration)


# --------------------------------------------------------------------------- statistics



def s4_metrics(before_iteration: Mapping[int, int], iterations: int, transitions_per_iteration: int,
               elapsed: Stopwatch) -> dict[str, float]:
    """The figures every system reports for S4, from its footprint samples and its stopwatch."""
    early, late = s4_windows(iterations)
    steady = s4_steady_window(iterations)
    return {
        "bytes_per_transition_early": window_bytes_per_transition(before_iteration, early, transitions_per_iteration),
        "bytes_per_transition_late": window_bytes_per_transition(before_iteration, late, transitions_per_iteration),
        "bytes_per_transition_late_steady": window_bytes_per_transition(
            before_iteration, steady, transitions_per_iteration),
        "us_per_transition": elapsed.us / (iterations * transitions_per_iteration),
        "total_ms": elapsed.ms,
    }

def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def growth_exponent(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log(y) against log(x): y ~ x**k, returns k.

    1.0 means linear total cost (constant per step); 2.0 means quadratic.
    """
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("need at least two (x, y) points")
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx = statistics.fmean(lx)
    my = statistics.fmean(ly)
    sxx = sum((a - mx) ** 2 for a in lx)
    sxy = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True))
    return sxy / sxx


# --------------------------------------------------------------------------- table


def fmt_number(value: float | None, *, decimals: int | None = None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if decimals is not None:
        return f"{value:,.{decimals}f}"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_ratio(value: float | None) -> str:
    if value is None or math.isnan(value):
        return ""
    if value >= 100:
        return f"{value:,.0f}x"
    if value >= 10:
        return f"{value:.1f}x"
    return f"{value:.2f}x"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 2) -> str:
    """Plain monospace table; the first ``left`` columns are left-aligned, the rest right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            out.append(cell.ljust(widths[i]) if i < left else cell.rjust(widths[i]))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep, *(line(r) if r else "" for r in rows)])
