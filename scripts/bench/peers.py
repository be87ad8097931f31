"""Peer: the benchmark scenarios implemented with LangGraph + SqliteSaver.

Set-up shared by every scenario:

* a fresh temp database file per measurement; the ``sqlite3`` connection is opened here
  (``check_same_thread=False``: LangGraph saves checkpoints from its executor threads),
  set to ``journal_mode=WAL`` and ``synchronous=FULL``, and handed to the sync
  ``SqliteSaver(conn)``;
* ``graph.invoke(..., {"configurable": {"thread_id": ...}}, durability="sync")``:
  in LangGraph >= 0.6 ``durability="sync"`` persists each superstep's checkpoint before
  the next superstep starts (the default "async" overlaps the save with the next step);
* ``recursion_limit`` raised above the number of supersteps (the default is 25);
* state = ``items: Annotated[list[str], operator.add]`` (each step appends a 100-byte
  string) plus an ``int`` counter;
* only ``invoke`` is timed: connection, saver table creation and graph compilation are
  set-up (S3 being the exception: there the whole resume is measured).

Run as a script (``peers.py s3-resume DB STEPS``) it is the S3 fresh-process side.
"""

from __future__ import annotations

import operator
import sqlite3
import sys
from pathlib import Path
from typing import Annotated, Any, Protocol, TypedDict

import measure
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from measure import Metrics, Stopwatch

THREAD_ID = "bench-thread"

Update = dict[str, Any]


class ChainState(TypedDict):
    items: Annotated[list[str], operator.add]
    count: int


class LoopState(TypedDict):
    items: Annotated[list[str], operator.add]
    count: int
    iteration: int


class ChainNode(Protocol):
    """A node over ``ChainState`` (a Protocol, as LangGraph matches the parameter name ``state``)."""

    def __call__(self, state: ChainState) -> Update: ...


def describe() -> str:
    parts = ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite")
    from importlib.metadata import version  # here, not at import: it would weigh on S3's fresh process

    return ", ".join(f"{p} {version(p)}" for p in parts) + " (SqliteSaver, durability='sync')"


def _saver(db: Path) -> tuple[sqlite3.Connection, SqliteSaver]:
    conn = measure.open_sqlite(db, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()  # creates the tables (and re-issues journal_mode=WAL) outside the timing
    measure.apply_durable_pragmas(conn)  # re-check nothing was reset
    return conn, saver


def _config(recursion_limit: int) -> RunnableConfig:
    return {"configurable": {"thread_id": THREAD_ID}, "recursion_limit": recursion_limit}


def _check(result: dict[str, Any], *, items: int, count: int) -> None:
    if len(result["items"]) != items or result["count"] != count:
        raise RuntimeError(
            f"langgraph: expected {items} items / count {count}, "
            f"got {len(result['items'])} / {result['count']}"
        )


# --------------------------------------------------------------------------- S1 / S3 chain


def _chain_node(i: int) -> ChainNode:
    def node(state: ChainState) -> Update:
        return {"items": [measure.payload(i)], "count": state["count"] + 1}

    return node


def _chain_graph(n: int) -> StateGraph[ChainState]:
    builder = StateGraph(ChainState)
    for i in range(n):
        builder.add_node(f"n{i}", _chain_node(i))
    builder.add_edge(START, "n0")
    for i in range(n - 1):
        builder.add_edge(f"n{i}", f"n{i + 1}")
    builder.add_edge(f"n{n - 1}", END)
    return builder


def s1(n: int) -> Metrics:
    """Chain of ``n`` nodes, each appending 100 bytes and incrementing the counter."""
    with measure.fresh_db() as db:
        conn, saver = _saver(db)
        try:
            graph = _chain_graph(n).compile(checkpointer=saver)
            with Stopwatch() as sw:
                result = graph.invoke({"items": [], "count": 0}, _config(n + 10), durability="sync")
            _check(result, items=n, count=n)
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


# --------------------------------------------------------------------------- S2 fan-out/in


def _start(state: ChainState) -> Update:
    return {"count": state["count"] + 1}


def _branch_node(i: int) -> ChainNode:
    def node(state: ChainState) -> Update:
        return {"items": [measure.payload(i)]}

    return node


def _join(state: ChainState) -> Update:
    return {"count": state["count"] + 1}


def s2(branches: int = measure.S2_BRANCHES) -> Metrics:
    """start -> ``branches`` parallel branches (each appends 100 bytes) -> join (waits for all)."""
    nodes = branches + 2
    names = [f"b{i}" for i in range(branches)]
    builder = StateGraph(ChainState)
    builder.add_node("start", _start)
    builder.add_node("join", _join)
    for i, name in enumerate(names):
        builder.add_node(name, _branch_node(i))
        builder.add_edge("start", name)
    builder.add_edge(START, "start")
    builder.add_edge(names, "join")
    builder.add_edge("join", END)
    with measure.fresh_db() as db:
        conn, saver = _saver(db)
        try:
            graph = builder.compile(checkpointer=saver)
            with Stopwatch() as sw:
                result = graph.invoke({"items": [], "count": 0}, _config(nodes + 10), durability="sync")
            _check(result, items=branches, count=2)
        finally:
            conn.close()
    return {"us_per_node": sw.us / nodes, "total_ms": sw.ms}


# --------------------------------------------------------------------------- S3 resume


def _s3_graph(steps: int, saver: SqliteSaver) -> Any:
    # steps + 1 nodes, paused before the last one: the first process runs ``steps`` nodes and
    # stops at the interrupt; the fresh process resumes with invoke(None) and runs the last.
    return _chain_graph(steps + 1).compile(checkpointer=saver, interrupt_before=[f"n{steps}"])


def s3(steps: int = measure.S3_STEPS) -> Metrics:
    """``steps`` steps persisted to a file, then a fresh process resumes and runs one more."""
    with measure.fresh_db() as db:
        conn, saver = _saver(db)
        try:
            graph = _s3_graph(steps, saver)
            paused = graph.invoke({"items": [], "count": 0}, _config(steps + 10), durability="sync")
            _check(paused, items=steps, count=steps)
        finally:
            conn.close()
        metrics = measure.run_fresh_process(
            [sys.executable, str(Path(__file__).resolve()), "s3-resume", str(db), str(steps)]
        )
        conn, saver = _saver(db)
        try:
            final = saver.get_tuple(_config(steps + 10))
            if final is None:
                raise RuntimeError("langgraph: no checkpoint after resume")
            values = final.checkpoint["channel_values"]
            _check(values, items=steps + 1, count=steps + 1)
        finally:
            conn.close()
    return metrics


def _s3_resume(db: Path, steps: int) -> None:
    """Fresh-process side of S3. Timed from here (interpreter start and imports excluded):
    open the db, build + compile the graph, resume the paused thread, run the last node."""
    with Stopwatch() as sw:
        conn, saver = _saver(db)
        graph = _s3_graph(steps, saver)
        with Stopwatch() as inv:
            result = graph.invoke(None, _config(steps + 10), durability="sync")
        _check(result, items=steps + 1, count=steps + 1)
        conn.close()
    measure.report_child_metrics({"inproc_ms": sw.ms, "invoke_ms": inv.ms})


# --------------------------------------------------------------------------- S4 loop


def s4(iterations: int = measure.S4_ITERATIONS) -> Metrics:
    """Loop a -> b -> c -> a ... for ``iterations`` passes; each pass appends 100 bytes.

    Bytes per transition (one transition = one node = one superstep = one checkpoint):
    auto-checkpoint is turned off on the saver's connection, so every commit appends its
    pages to the WAL and (db + wal) grows by exactly what was written. Node ``a`` samples
    the footprint as it starts iteration k; with durability="sync" every earlier superstep
    is committed by then. Growth over a 10-iteration window / 30 transitions; the early
    window is iterations 6..15, the late one the last 10.
    """
    per_iter = measure.S4_NODES_PER_ITERATION
    before: dict[int, int] = {}

    with measure.fresh_db() as db:

        def a(state: LoopState) -> Update:
            before[state["iteration"] + 1] = measure.db_footprint(db)
            return {"items": [measure.payload(state["iteration"])], "count": state["count"] + 1}

        def b(state: LoopState) -> Update:
            return {"count": state["count"] + 1}

        def c(state: LoopState) -> Update:
            return {"count": state["count"] + 1, "iteration": state["iteration"] + 1}

        def route(state: LoopState) -> str:
            return "a" if state["iteration"] < iterations else END

        builder = StateGraph(LoopState)
        builder.add_node("a", a)
        builder.add_node("b", b)
        builder.add_node("c", c)
        builder.add_edge(START, "a")
        builder.add_edge("a", "b")
        builder.add_edge("b", "c")
        builder.add_conditional_edges("c", route, ["a", END])

        conn, saver = _saver(db)
        try:
            measure.disable_autocheckpoint(conn)
            graph = builder.compile(checkpointer=saver)
            with Stopwatch() as sw:
                result = graph.invoke(
                    {"items": [], "count": 0, "iteration": 0},
                    _config(per_iter * iterations + 10),
                    durability="sync",
                )
            before[iterations + 1] = measure.db_footprint(db)
            _check(result, items=iterations, count=per_iter * iterations)
        finally:
            conn.close()
    return measure.s4_metrics(before, iterations, per_iter, sw)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "s3-resume":
        _s3_resume(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(f"usage: {sys.argv[0]} s3-resume DB STEPS")
