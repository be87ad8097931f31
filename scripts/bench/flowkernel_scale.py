"""flowkernel side of the scheduler at scale, the agent delta stream and start-up.

* Fan-out: ``start`` -> ``n`` ``noop`` branches -> ``join`` (gate ``all``), the flow's default
  ``maxConcurrency`` (8), so thousands of ready branches wait for a slot. In memory (``MemoryStore``):
  CPU time only, the scheduler's own cost.
* forEach: ``list`` (a ``python`` node returning ``n`` integers) -> ``work`` over each item (a ``noop``
  whose input binds the item) -> ``done``. In memory, CPU time.
* Deltas: one ``python`` node streams ``n`` ``agent:text:delta`` events, one every ``pace`` seconds
  (faster than any model streams), on a ``SqliteStore``: how many commits the run makes, the most in
  any 50 ms, and the CPU per delta; the stored log is checked to hold every delta in order.
* Start-up: ``python -c pass``, ``flowkernel run`` of a one-node flow, ``flowkernel validate`` of it
  (found in the validation cache, as a flow run again is) and ``validate`` with the cache off (medians
  of ``measure.STARTUP_RUNS`` spawns, interleaved), which heavy modules a ``run`` imports, and the time
  from spawning ``flowkernel resume`` of a 10,000-node run paused at 50% to its first line of output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import anyio
import flowkernel_natural as natural
import flowkernel_side as fk
import measure
from flowkernel.core.commands import Command
from flowkernel.core.events import AgentTextDelta
from flowkernel.core.node_context import NodeContext
from flowkernel.plugins.registry import default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore
from flowkernel.store.sql.sqlite import SqliteStore
from measure import CpuClock, Metrics, Stopwatch

Document = dict[str, Any]


def describe() -> str:
    return "scheduler at scale (MemoryStore), agent deltas, start-up"


def _in_memory(document: Document, registry: Any = None) -> tuple[float, Any]:
    kernel = Kernel(MemoryStore(), registry=registry)
    flow = kernel.compile(document)
    with CpuClock() as cpu:
        snap = anyio.run(kernel.run, flow, {})
    if snap.status != "completed":
        raise RuntimeError(f"flowkernel: {snap.status} ({snap.error})")
    return cpu.seconds, snap


def fanout(n: int) -> Metrics:
    document: Document = {
        "name": f"bench-fanout-{n}",
        "nodes": [{"id": "start", "type": "noop", "input": {}},
                  *({"id": f"b{i}", "type": "noop", "input": {"i": i}} for i in range(n)),
                  {"id": "join", "type": "noop", "input": {}}],
        "edges": [*({"from": "start", "to": f"b{i}"} for i in range(n)),
                  *({"from": f"b{i}", "to": "join"} for i in range(n))],
    }
    seconds, snap = _in_memory(document)
    if snap.nodeStatus["join"] != "done":
        raise RuntimeError("flowkernel: the join did not run")
    return {"cpu_s": seconds, "cpu_us_per_node": seconds * 1e6 / (n + 2)}


def foreach(n: int) -> Metrics:
    registry = default_registry().copy()
    registry.add_function("numbers", lambda count: list(range(count)))
    document: Document = {
        "name": f"bench-foreach-{n}",
        "nodes": [{"id": "list", "type": "python", "input": {"function": "numbers", "args": {"count": n}}},
                  {"id": "work", "type": "noop", "input": {"value": "{{ item }}"}},
                  {"id": "done", "type": "noop", "input": {}}],
        "edges": [{"from": "list", "to": "work", "forEach": {"in": "list", "as": "item"}},
                  {"from": "work", "to": "done"}],
    }
    seconds, snap = _in_memory(document, registry)
    iterations = snap.outputs["work"]["iterations"]
    if len(iterations) != n or iterations[-1] != {"item": n - 1, "output": {"value": n - 1}}:
        raise RuntimeError("flowkernel: forEach results are not what the items gave")
    return {"cpu_s": seconds, "cpu_us_per_item": seconds * 1e6 / n}


def deltas(n: int = measure.DELTAS, pace: float = measure.DELTA_PACE_S) -> Metrics:
    async def stream(ctx: NodeContext) -> str:
        for i in range(n):
            ctx.emit(AgentTextDelta(content=f"token {i} "))
            await anyio.sleep(pace)
        return "done"

    registry = default_registry().copy()
    registry.add_function("stream", stream)
    document: Document = {"name": "bench-deltas",
                          "nodes": [{"id": "model", "type": "python", "input": {"function": "stream"}}],
                          "edges": []}
    commits: list[float] = []  # when each commit that held deltas only was made
    transitions = [0]
    quiet = (b'{"type":"agent:text:delta"', b'{"type":"agent:thinking:delta"')
    with measure.fresh_db() as db:
        store = SqliteStore(db)
        fk._check_pragmas(store)
        commit = store.commit

        def counted(run_id: str, rows: Any, *args: Any, **kwargs: Any) -> None:
            began = time.monotonic()  # a commit's start: its fsync may take longer than the window here
            commit(run_id, rows, *args, **kwargs)
            if all(body.startswith(quiet) for _, _, body in rows):
                commits.append(began)
            else:
                transitions[0] += 1

        store.commit = counted  # type: ignore[method-assign]
        kernel = Kernel(store, registry=registry)
        try:
            flow = kernel.compile(document)
            with Stopwatch() as sw, CpuClock() as cpu:
                snap = anyio.run(kernel.run, flow, {})
            if snap.status != "completed":
                raise RuntimeError(f"flowkernel: {snap.status} ({snap.error})")
            stored = [ev.content for ev in kernel.events(snap.runId) if isinstance(ev, AgentTextDelta)]
            if stored != [f"token {i} " for i in range(n)]:
                raise RuntimeError("flowkernel: the stored deltas are missing or out of order")
        finally:
            store.close()
    # The producer's own pacing (one anyio.sleep per delta) costs CPU too: measured alone, so the kernel's
    # share per delta is the difference.
    async def pace_only() -> None:
        for _ in range(n):
            await anyio.sleep(pace)

    with CpuClock() as pacing:
        anyio.run(pace_only)
    window: deque[float] = deque()
    busiest = 0
    for t in commits:
        window.append(t)
        while window[0] <= t - 0.05:
            window.popleft()
        busiest = max(busiest, len(window))
    return {"commits of deltas only": len(commits), "commits with a transition": transitions[0],
            "most commits of deltas only in 50 ms": busiest, "cpu_us_per_delta": cpu.seconds * 1e6 / n,
            "cpu_us_per_delta_pacing_alone": pacing.seconds * 1e6 / n,
            "wall_s": sw.seconds, "deltas": n}


def _one_node(folder: Path) -> Path:
    flow = folder / "one.json"
    flow.write_text(json.dumps({"name": "one", "nodes": [{"id": "a", "type": "noop", "input": {"x": 1}}],
                                "edges": []}))
    return flow


_IMPORTS = """
import sys
from flowkernel.cli import main
code = main(sys.argv[1:])
heavy = [m for m in ("networkx", "pydantic", "anthropic", "httpx") if m in sys.modules]
print("HEAVY " + ",".join(heavy), file=sys.stderr)
"""


# What running a flow cannot start without, whatever flowkernel does: the event loop (asyncio, anyio and
# the asyncio backend that `anyio.run` loads), msgspec (events, snapshots) and the SQLite driver. The part
# of `run` above it is flowkernel's own.
_DEPENDENCIES = "asyncio, anyio, anyio._backends._asyncio, msgspec, sqlite3"
DEPENDENCY_FLOOR = f"dependency floor: python -c 'import {_DEPENDENCIES}' ms"


def startup(runs: int = measure.STARTUP_RUNS) -> Metrics:
    """The flow file is validated once first (by the first ``run``, which also creates the store), as
    it is when a user runs a flow again: later runs and validations find it in the validation cache
    (``flowkernel.flowfiles.validated``; a cache folder of this measurement's own). ``validate`` with the cache
    off is measured too: what checking a new or changed file costs. The dependency floor (importing
    what a run needs from other packages, nothing of flowkernel's) shows what part of ``run`` is theirs."""
    fk._byte_compile()
    cmd = natural.cli()
    with measure.fresh_db() as db:
        flow = _one_node(db.parent)
        env = {**os.environ, "FLOWKERNEL_CACHE_DIR": str(db.parent / "cache")}
        cold = {**os.environ, "FLOWKERNEL_CACHE_DIR": ""}
        run = [cmd, "run", str(flow), "--db", str(db)]
        subprocess.run(run, check=True, stdout=subprocess.DEVNULL, env=env)
        samples: dict[str, list[float]] = {"python -c pass ms": [], DEPENDENCY_FLOOR: [],
                                           "flowkernel run (one node) ms": [],
                                           "flowkernel validate ms": [], "flowkernel validate, no cache ms": []}
        argvs = {"python -c pass ms": ([sys.executable, "-c", "pass"], env),
                 DEPENDENCY_FLOOR: ([sys.executable, "-c", f"import {_DEPENDENCIES}"], env),
                 "flowkernel run (one node) ms": (run, env),
                 "flowkernel validate ms": ([cmd, "validate", str(flow)], env),
                 "flowkernel validate, no cache ms": ([cmd, "validate", str(flow)], cold)}
        for _ in range(runs):  # interleaved, so a slow moment weighs on all of them alike
            for label, (argv, environ) in argvs.items():
                samples[label].append(measure.spawn_ms(argv, 1, env=environ))
        out: Metrics = {label: measure.median(v) for label, v in samples.items()}
        pass_ms = out["python -c pass ms"]
        out["run / python -c pass"] = out["flowkernel run (one node) ms"] / pass_ms
        out["dependency floor / python -c pass"] = out[DEPENDENCY_FLOOR] / pass_ms
        out["validate / python -c pass"] = out["flowkernel validate ms"] / pass_ms
        probe = subprocess.run([sys.executable, "-c", _IMPORTS, "run", str(flow), "--db", str(db)],
                               capture_output=True, text=True, check=True, env=env)
        heavy = probe.stderr.rsplit("HEAVY ", 1)[-1].strip()
        for module in ("networkx", "pydantic", "anthropic"):
            out[f"run imports {module} (1 yes, 0 no)"] = float(module in heavy.split(","))
    out.update(resume_first_line())
    return out


def resume_first_line(nodes: int = 10_000) -> Metrics:
    """A chain of ``nodes`` python nodes paused after half of them; ``flowkernel resume`` is spawned and
    timed until it prints its first line (then left to finish)."""
    with measure.fresh_db() as db:
        store, kernel = fk._open(db)
        try:
            half = nodes // 2

            def step(i: int) -> None:
                if i == half - 1:
                    kernel.executing(run_id).deliver(  # type: ignore[union-attr]
                        Command(kind="pause", reason="benchmark"))

            kernel.registry.add_function("append", step)
            flow = kernel.compile(fk._chain_document(nodes))
            run_id = kernel.create_run(flow, {})
            paused = anyio.run(kernel.execute, run_id)
            if paused.status != "paused":
                raise RuntimeError(f"flowkernel: {paused.status}, not paused")
        finally:
            store.close()
        plugin = db.parent / "bench_resume_plugin.py"
        plugin.write_text("from flowkernel.plugins.registry import register_function\n\n"
                          "@register_function('append')\ndef append(i: int) -> None:\n    return None\n")
        env = {**os.environ, "PYTHONPATH": str(db.parent)}
        argv = [natural.cli(), "--plugin", "bench_resume_plugin", "resume", run_id, "--db", str(db)]
        firsts = []
        for _ in range(3):
            with Stopwatch() as sw:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
                assert proc.stdout is not None
                line = proc.stdout.readline()
            firsts.append(sw.ms)
            proc.kill()
            _, err = proc.communicate()
            if not line:
                raise RuntimeError(f"flowkernel resume printed nothing: {err.decode()[-2000:]}")
    return {"resume of a 10,000-node run at 50%: first line ms": measure.median(firsts)}
