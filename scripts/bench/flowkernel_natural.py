"""flowkernel side of the natural scenarios (N1, N2), S5 and the live view's cost.

* N1: a chain of ``state.set`` nodes, each appending ``measure.payload(i)`` (100 bytes) to
  ``state.items``: in-process (``Kernel.run`` on a ``SqliteStore``) and through the command line
  (``flowkernel run FLOW --db DB``, its live view read from a pipe), spawn to exit.
* N2: a 3-node loop ``agent -> tool -> review -> agent``; ``agent`` is a ``python`` node that gets its
  own previous transcript through a binding (``{{ agent.transcript }}``) and returns it with one
  100-byte message more, as an agent that returns its whole conversation does.
* S5: ``runs`` runs of the S1 chain (``steps`` python nodes) executing at once under one ``Kernel``,
  the way a worker executes runs; transitions per second. ``s5_pg``: the same on PostgreSQL
  (``FLOWKERNEL_TEST_PG``), in a schema of its own that is dropped afterwards.
* Live view: S1 N=1000 with the CLI's live view attached (writing to /dev/null) and without,
  one after the other in the same repetition.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import flowkernel_side as fk
import measure
from flowkernel.cli.live_view import LiveView
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.plugins.registry import Registry, default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore
from measure import CpuClock, Metrics, Stopwatch

Document = dict[str, Any]


def describe() -> str:
    return "natural scenarios, S5 and the live view (state.set and python nodes)"


def _state_set_chain(n: int) -> Document:
    return {
        "name": f"bench-state-set-{n}",
        "state": {"initial": {"items": []}},
        "nodes": [{"id": f"n{i}", "type": "state.set",
                   "input": {"path": "items", "op": "append", "value": measure.payload(i)}} for i in range(n)],
        "edges": [{"from": f"n{i}", "to": f"n{i + 1}"} for i in range(n - 1)],
    }


def _items(snap: RunSnapshot, n: int) -> None:
    got = len(snap.state.get("items", []))
    if snap.status != "completed" or got != n:
        raise RuntimeError(f"flowkernel: expected completed with {n} items, got {snap.status} with {got} "
                           f"(error: {snap.error})")


def n1(n: int) -> Metrics:
    with measure.fresh_db() as db:
        store, kernel = fk._open(db)
        try:
            flow = kernel.compile(_state_set_chain(n))
            with Stopwatch() as sw, CpuClock() as cpu:
                snap = anyio.run(kernel.run, flow, {})
            _items(snap, n)
            db_bytes = measure.db_footprint(db)
        finally:
            store.close()
        db_bytes_checkpointed = measure.checkpointed_size(db)
    return {"us_per_step": sw.us / n, "total_ms": sw.ms, "cpu_us_per_step": cpu.seconds * 1e6 / n,
            "db_bytes": db_bytes, "db_bytes_checkpointed": db_bytes_checkpointed}


def cli() -> str:
    found = shutil.which("flowkernel", path=str(Path(sys.executable).parent)) or shutil.which("flowkernel")
    if found is None:
        raise RuntimeError("the flowkernel command is not installed here")
    return found


def n1_cli(n: int) -> Metrics:
    fk._byte_compile()
    with measure.fresh_db() as db:
        flow = db.parent / "chain.json"
        flow.write_text(json.dumps(_state_set_chain(n)))
        with Stopwatch() as sw:
            done = subprocess.run([cli(), "run", str(flow), "--db", str(db)], capture_output=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"flowkernel run failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
        lines = done.stdout.count(b"\n")
        store = SqliteStore(db, create=False)
        try:
            kernel = Kernel(store)
            [run] = kernel.runs()
            _items(kernel.snapshot(run.runId), n)
        finally:
            store.close()
        db_bytes = measure.db_footprint(db)
        db_bytes_checkpointed = measure.checkpointed_size(db)
    return {"us_per_step": sw.us / n, "total_ms": sw.ms, "db_bytes": db_bytes,
            "db_bytes_checkpointed": db_bytes_checkpointed, "live view lines": lines}


def _agent(history: list[dict[str, str]] | None = None) -> dict[str, Any]:
    before = history or []
    message = {"role": "assistant", "content": measure.payload(len(before))}
    return {"text": message["content"], "transcript": [*before, message]}


def _idle() -> None:
    return None


def _agent_registry() -> Registry:
    reg = default_registry().copy()
    reg.add_function("agent", _agent)
    reg.add_function("idle", _idle)
    return reg


def _agent_loop(iterations: int) -> Document:
    return {
        "name": f"bench-agent-loop-{iterations}",
        "nodes": [
            {"id": "agent", "type": "python",
             "input": {"function": "agent", "args": {"history": "{{ agent.transcript }}"}}},
            {"id": "tool", "type": "python", "input": {"function": "idle"}},
            {"id": "review", "type": "python", "input": {"function": "idle"}},
        ],
        "edges": [
            {"from": "agent", "to": "tool"},
            {"from": "tool", "to": "review"},
            {"from": "review", "to": "agent", "maxIterations": iterations,
             "when": f"$iteration < {iterations - 1}"},
        ],
    }


def n2(iterations: int) -> Metrics:
    with measure.fresh_db() as db:
        store = SqliteStore(db)
        fk._check_pragmas(store)
        kernel = Kernel(store, registry=_agent_registry())
        try:
            flow = kernel.compile(_agent_loop(iterations))
            with Stopwatch() as sw, CpuClock() as cpu:
                snap = anyio.run(kernel.run, flow, {})
            got = len(snap.outputs.get("agent", {}).get("transcript", []))
            if snap.status != "completed" or got != iterations:
                raise RuntimeError(f"flowkernel: {snap.status} with {got} messages (error: {snap.error})")
            db_bytes = measure.db_footprint(db)
        finally:
            store.close()
        db_bytes_checkpointed = measure.checkpointed_size(db)
    return {"us_per_iteration": sw.us / iterations, "total_ms": sw.ms,
            "cpu_us_per_iteration": cpu.seconds * 1e6 / iterations,
            "db_bytes": db_bytes, "db_bytes_checkpointed": db_bytes_checkpointed}


async def _many(kernel: Kernel, flow: CompiledFlow, runs: int) -> list[RunSnapshot]:
    finals: list[RunSnapshot] = []

    async def one() -> None:
        finals.append(await kernel.run(flow, {}))

    async with anyio.create_task_group() as tg:
        for _ in range(runs):
            tg.start_soon(one)
    return finals


def _s5_on(kernel: Kernel, runs: int, steps: int) -> Metrics:
    flow = kernel.compile(fk._chain_document(steps))  # set-up, as in S1 and as LangGraph's graph.compile()
    with Stopwatch() as sw:
        finals = anyio.run(_many, kernel, flow, runs)
    for snap in finals:
        fk._check(snap, status="completed", items=steps, counter=steps)
    return {"transitions_per_s": runs * steps / sw.seconds, "total_ms": sw.ms}


def s5(runs: int = measure.S5_RUNS, steps: int = measure.S5_STEPS) -> Metrics:
    with measure.fresh_db() as db:
        store, kernel = fk._open(db)
        try:
            return _s5_on(kernel, runs, steps)
        finally:
            store.close()


def s5_pg(runs: int = measure.S5_RUNS, steps: int = measure.S5_STEPS) -> Metrics:
    import psycopg
    from flowkernel.store.sql.postgres import PostgresStore

    url = os.environ["FLOWKERNEL_TEST_PG"]
    schema = f"bench_s5_{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            sep = "&" if "?" in url else "?"
            store = PostgresStore(f"{url}{sep}options=-csearch_path%3D{schema}")
            try:
                return _s5_on(Kernel(store, registry=fk._registry()), runs, steps)
            finally:
                store.close()
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


def live(n: int = 1000) -> Metrics:
    """S1 without a listener and with the live view writing to /dev/null (not a terminal), each twice, in
    the order plain, view, view, plain: a machine that slows down or speeds up during the repetition
    weighs on both alike. The figures are the means of each variant's two runs."""
    out: Metrics = {}
    us = {"plain": 0.0, "live view": 0.0}
    cpu_us = dict(us)
    for label in ("plain", "live view", "live view", "plain"):
        with measure.fresh_db() as db, open(os.devnull, "w") as sink:
            store, kernel = fk._open(db)
            try:
                flow = kernel.compile(fk._chain_document(n))
                view = LiveView(sink) if label == "live view" else None
                with Stopwatch() as sw, CpuClock() as cpu:
                    snap = anyio.run(functools.partial(kernel.run, flow, {}, on_event=view))
                fk._check(snap, status="completed", items=n, counter=n)
            finally:
                store.close()
        us[label] += sw.us / n / 2
        cpu_us[label] += cpu.seconds * 1e6 / n / 2
    for label in us:
        out[f"us_per_step {label}"] = us[label]
        out[f"cpu_us_per_step {label}"] = cpu_us[label]
    out["live view / plain (wall)"] = out["us_per_step live view"] / out["us_per_step plain"]
    out["live view / plain (cpu)"] = out["cpu_us_per_step live view"] / out["cpu_us_per_step plain"]
    return out
