"""flowkernel side of the benchmark: the scenarios S1-S4 on the flowkernel Python API.

Set-up shared by every scenario:

* a fresh temp database file per measurement, opened by ``SqliteStore`` (it sets
  ``journal_mode=WAL`` and ``synchronous=FULL`` itself; ``_check_pragmas`` verifies it);
* the flow is compiled from a JSON document with ``Kernel.compile``; its ``python`` nodes call
  functions registered on a copy of the default registry (``Registry.add_function``); a function
  with a ``ctx`` parameter changes the run's state with ``ctx.patch_state``;
* state = ``{"items": [], "counter": 0}``: each step appends a 100-byte string
  (``measure.payload(i)``) to ``items`` and sets ``counter`` to ``counter + 1``;
* only the run is timed (``anyio.run(kernel.run, flow, {})``, i.e. creating the run record and
  executing it); store opening and flow compilation are set-up, except in the S3 child where the
  whole resume is measured.

Run as a script (``flowkernel_side.py s3-resume DB RUN_ID STEPS``) it is the S3 fresh-process side.
"""

from __future__ import annotations

import compileall
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import flowkernel
import flowkernel.nodes
import measure
from flowkernel.core.commands import Command
from flowkernel.core.node_context import NodeContext
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.plugins.registry import Registry, default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore
from measure import Metrics, Stopwatch

Document = dict[str, Any]

INITIAL_STATE: dict[str, Any] = {"items": [], "counter": 0}


def describe() -> str:
    from importlib.metadata import version  # here, not at import: it would weigh on S3's fresh process

    return f"flowkernel {version('flowkernel')} (SqliteStore, python nodes, Kernel.run)"


# --------------------------------------------------------------------------- node functions


def append(i: int, ctx: NodeContext) -> None:
    """One step: append 100 bytes to ``items`` and increment ``counter``."""
    ctx.patch_state("append", "items", measure.payload(i))
    ctx.patch_state("set", "counter", ctx.state.get("counter", 0) + 1)


def append_only(i: int, ctx: NodeContext) -> None:
    """A parallel branch of S2: append only (the counter is the start's and the join's)."""
    ctx.patch_state("append", "items", measure.payload(i))


def increment(ctx: NodeContext) -> None:
    ctx.patch_state("set", "counter", ctx.state.get("counter", 0) + 1)


def _registry() -> Registry:
    reg = default_registry().copy()
    reg.add_function("append", append)
    reg.add_function("append_only", append_only)
    reg.add_function("increment", increment)
    return reg


def _node(node_id: str, function: str, **args: Any) -> Document:
    spec: Document = {"function": function}
    if args:
        spec["args"] = args
    return {"id": node_id, "type": "python", "input": spec}


def _chain_document(n: int) -> Document:
    return {
        "name": f"bench-chain-{n}",
        "state": {"initial": INITIAL_STATE},
        "nodes": [_node(f"n{i}", "append", i=i) for i in range(n)],
        "edges": [{"from": f"n{i}", "to": f"n{i + 1}"} for i in range(n - 1)],
    }


# --------------------------------------------------------------------------- helpers


def _open(db: Path) -> tuple[SqliteStore, Kernel]:
    store = SqliteStore(db)
    _check_pragmas(store)
    return store, Kernel(store, registry=_registry())


def _check_pragmas(store: SqliteStore) -> None:
    # The store's own connection (private attribute; reading it here is benchmark-only): make sure
    # it really runs WAL + synchronous=FULL like the other sides, or the comparison is void.
    conn = store._db
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    if str(mode).lower() != "wal" or int(sync) != 2:
        raise RuntimeError(
            f"flowkernel store is not WAL/synchronous=FULL (journal_mode={mode}, synchronous={sync})"
        )


def _check(snap: RunSnapshot, *, status: str, items: int, counter: int) -> None:
    got_items = len(snap.state.get("items", []))
    got_counter = snap.state.get("counter")
    if snap.status != status or got_items != items or got_counter != counter:
        raise RuntimeError(
            f"flowkernel: expected {status} with {items} items / counter {counter}, "
            f"got {snap.status} with {got_items} / {got_counter} (error: {snap.error})"
        )


# --------------------------------------------------------------------------- S1 chain


def s1(n: int) -> Metrics:
    """Chain of ``n`` python nodes, each appending 100 bytes and incrementing the counter."""
    with measure.fresh_db() as db:
        store, kernel = _open(db)
        try:
            flow = kernel.compile(_chain_document(n))
            with Stopwatch() as sw:
                snap = anyio.run(kernel.run, flow, {})
            _check(snap, status="completed", items=n, counter=n)
            db_bytes = measure.db_footprint(db)
        finally:
            store.close()
        db_bytes_checkpointed = measure.checkpointed_size(db)
    return {
        "us_per_step": sw.us / n,
        "total_ms": sw.ms,
        "db_bytes": db_bytes,
        "db_bytes_checkpointed": db_bytes_checkpointed,
    }


# --------------------------------------------------------------------------- S2 fan-out/in


def s2(branches: int = measure.S2_BRANCHES) -> Metrics:
    """start -> ``branches`` parallel branches (each appends 100 bytes) -> join (gate ``all``).

    ``maxConcurrency`` is raised to ``branches`` (the default is 8) so every branch may run at
    once, as LangGraph runs them all in one superstep.
    """
    nodes = branches + 2
    names = [f"b{i}" for i in range(branches)]
    document: Document = {
        "name": f"bench-fan-{branches}",
        "maxConcurrency": branches,
        "state": {"initial": INITIAL_STATE},
        "nodes": [
            _node("start", "increment"),
            *(_node(name, "append_only", i=i) for i, name in enumerate(names)),
            _node("join", "increment"),
        ],
        "edges": [
            *({"from": "start", "to": name} for name in names),
            *({"from": name, "to": "join"} for name in names),
        ],
    }
    with measure.fresh_db() as db:
        store, kernel = _open(db)
        try:
            flow = kernel.compile(document)
            with Stopwatch() as sw:
                snap = anyio.run(kernel.run, flow, {})
            _check(snap, status="completed", items=branches, counter=2)
        finally:
            store.close()
    return {"us_per_node": sw.us / nodes, "total_ms": sw.ms}


# --------------------------------------------------------------------------- S3 resume
#
# The flow is a chain of steps + 1 nodes. The first process runs it and pauses it right after
# node n{steps-1} completes, before n{steps} starts (like LangGraph's interrupt_before). The
# function of n{steps-1} hands a pause command to the run's execution, as ``Kernel.command`` does
# for a run executing in this process, but without awaiting the reply (a node awaiting it would be
# cancelled by the very pause it asked for). ``Kernel.command`` cannot be used from a companion
# task: whether its command lands before or after the run loop starts the next node depends on
# task scheduling. Queued from inside the node, the pause sits between the node's state patches
# and its completion, so the stored snapshot is: paused, ``steps`` nodes done, the last one pending
# (s3 checks it). The fresh process then calls the public ``Kernel.resume(run_id)``.


async def _run_and_pause(kernel: Kernel, steps: int) -> tuple[str, RunSnapshot]:
    pause_at = steps - 1

    def append_then_pause(i: int, ctx: NodeContext) -> None:
        append(i, ctx)
        if i == pause_at:
            # Private: the executions running in this process (benchmark-only shortcut, see above).
            kernel.executing(ctx.flow_run_id).deliver(  # type: ignore[union-attr]
                Command(kind="pause", reason="benchmark S3"))

    kernel.registry.add_function("append", append_then_pause)
    flow = kernel.compile(_chain_document(steps + 1))
    run_id = kernel.create_run(flow, {})
    return run_id, await kernel.execute(run_id)


CLI_RUNS = 5


def _spawn_ms(argv: list[str], runs: int = CLI_RUNS) -> float:
    """Median wall time of ``runs`` spawns of ``argv`` (spawn to exit, output discarded)."""
    times = []
    for _ in range(runs):
        with Stopwatch() as sw:
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(sw.ms)
    return measure.median(times)


def _cli_figures() -> Metrics:
    """Extra S3 rows: ``flowkernel --help`` start-up (target <= 150 ms) next to a bare interpreter."""
    cli = shutil.which("flowkernel", path=str(Path(sys.executable).parent)) or shutil.which("flowkernel")
    figures = {"python -c pass ms (bare interpreter, median of 5)": _spawn_ms([sys.executable, "-c", "pass"])}
    if cli is not None:
        figures["flowkernel --help ms (median of 5)"] = _spawn_ms([cli, "--help"])
    return figures


def _byte_compile() -> None:
    """Write flowkernel's bytecode caches, as pip does when it installs a package.

    An editable install runs from the source tree, where caches appear on first import, and never
    under ``PYTHONDONTWRITEBYTECODE=1``: the fresh processes below would then be timed compiling
    every module, which LangGraph's installed packages (compiled by pip) never do.
    """
    for package in (flowkernel, flowkernel.nodes):
        compileall.compile_dir(Path(package.__file__).parent, quiet=1)


def s3(steps: int = measure.S3_STEPS) -> Metrics:
    """``steps`` steps persisted to a file, then a fresh process resumes and runs one more.

    Also reports the start-up of ``flowkernel --help`` and of a bare interpreter as extra rows.
    """
    _byte_compile()
    with measure.fresh_db() as db:
        store, kernel = _open(db)
        try:
            run_id, paused = anyio.run(_run_and_pause, kernel, steps)
            _check(paused, status="paused", items=steps, counter=steps)
            last = f"n{steps}"
            if paused.nodeStatus.get(last) != "pending" or paused.nodeStatus.get(f"n{steps - 1}") != "done":
                raise RuntimeError(
                    f"flowkernel: paused at the wrong place: {last} is {paused.nodeStatus.get(last)}"
                )
        finally:
            store.close()
        metrics = measure.run_fresh_process(
            [sys.executable, str(Path(__file__).resolve()), "s3-resume", str(db), run_id, str(steps)]
        )
        store, kernel = _open(db)
        try:
            _check(kernel.snapshot(run_id), status="completed", items=steps + 1, counter=steps + 1)
        finally:
            store.close()
    return {**metrics, **_cli_figures()}


def _s3_resume(db: Path, run_id: str, steps: int) -> None:
    """Fresh-process side of S3. Timed from here (interpreter start and imports excluded):
    open the store, load the run's flow from it, resume the paused run, run the last node."""
    with Stopwatch() as sw:
        store = SqliteStore(db, create=False)
        kernel = Kernel(store, registry=_registry())
        with Stopwatch() as inv:
            snap = anyio.run(kernel.resume, run_id)
        _check(snap, status="completed", items=steps + 1, counter=steps + 1)
        store.close()
    measure.report_child_metrics({"inproc_ms": sw.ms, "invoke_ms": inv.ms})


# --------------------------------------------------------------------------- S4 loop


def s4(iterations: int = measure.S4_ITERATIONS) -> Metrics:
    """Loop a -> b -> c -> a ... for ``iterations`` passes; each pass appends 100 bytes.

    The loop edge c -> a fires while ``$iteration`` (loop passes done so far) is below
    ``iterations - 1``, so a runs ``iterations`` times; ``maxIterations`` is only a bound.
    Bytes per transition (one transition = one node execution): auto-checkpoint is turned off on
    the store's connection, so every commit appends its pages to the WAL and (db + wal) grows by
    exactly what was written. Node a samples the footprint as pass k starts (the runner commits
    before it starts a node, so every earlier transition is on disk by then).
    """
    per_iter = measure.S4_NODES_PER_ITERATION
    before: dict[int, int] = {}

    with measure.fresh_db() as db:

        def loop_a(ctx: NodeContext) -> None:
            counter = ctx.state.get("counter", 0)
            before[counter // per_iter + 1] = measure.db_footprint(db)
            ctx.patch_state("append", "items", measure.payload(counter // per_iter))
            ctx.patch_state("set", "counter", counter + 1)

        document: Document = {
            "name": f"bench-loop-{iterations}",
            "state": {"initial": INITIAL_STATE},
            "nodes": [_node("a", "loop_a"), _node("b", "increment"), _node("c", "increment")],
            "edges": [
                {"from": "a", "to": "b"},
                {"from": "b", "to": "c"},
                {
                    "from": "c",
                    "to": "a",
                    "maxIterations": iterations,
                    "when": f"$iteration < {iterations - 1}",
                },
            ],
        }
        store, kernel = _open(db)
        try:
            # SqliteStore keeps its sqlite3 connection in the private ``_db``; the S4 method needs
            # auto-checkpoint off on the connection that writes, and the API has no hook for it.
            measure.disable_autocheckpoint(store._db)
            kernel.registry.add_function("loop_a", loop_a)
            flow = kernel.compile(document)
            with Stopwatch() as sw:
                snap = anyio.run(kernel.run, flow, {})
            before[iterations + 1] = measure.db_footprint(db)
            _check(snap, status="completed", items=iterations, counter=per_iter * iterations)
        finally:
            store.close()
    return measure.s4_metrics(before, iterations, per_iter, sw)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "s3-resume":
        _s3_resume(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(f"usage: {sys.argv[0]} s3-resume DB RUN_ID STEPS")
