"""Peer (LangGraph) side of the natural scenarios and S5; the set-up is ``peers``'s (SqliteSaver on
our own WAL + ``synchronous=FULL`` connection, ``durability="sync"``).

* N1: the S1 chain (``Annotated[list, operator.add]`` state, each node returns the item it adds);
  through the CLI it is the same graph in a fresh process (LangGraph has no command line of its
  own), timed from spawn to exit, imports included.
* N2: a 3-node loop whose ``agent`` node adds one message to ``transcript`` (the reducer appends)
  and returns the message's text, as a LangGraph agent returns only its new messages.
* S5: ``runs`` graphs of ``steps`` nodes run concurrently in one process: ``ainvoke`` under
  ``asyncio.gather`` on one ``AsyncSqliteSaver`` (aiosqlite, WAL, ``synchronous=FULL``).

Run as a script (``peers_natural.py chain DB N``) it is the fresh-process side of N1.
"""

from __future__ import annotations

import asyncio
import operator
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

import measure
import peers
from langgraph.graph import END, START, StateGraph
from measure import Metrics, Stopwatch


def describe() -> str:
    return "natural scenarios and S5 (AsyncSqliteSaver for S5)"


def n1(n: int) -> Metrics:
    return peers.s1(n)


def n1_cli(n: int) -> Metrics:
    with measure.fresh_db() as db:
        with Stopwatch() as sw:
            measure.run_fresh_process([sys.executable, str(Path(__file__).resolve()), "chain", str(db), str(n)])
        db_bytes = measure.db_footprint(db)
        db_bytes_checkpointed = measure.checkpointed_size(db)
    return {"us_per_step": sw.us / n, "total_ms": sw.ms, "db_bytes": db_bytes,
            "db_bytes_checkpointed": db_bytes_checkpointed}


def _chain_process(db: Path, n: int) -> None:
    conn, saver = peers._saver(db)
    graph = peers._chain_graph(n).compile(checkpointer=saver)
    result = graph.invoke({"items": [], "count": 0}, peers._config(n + 10), durability="sync")
    peers._check(result, items=n, count=n)
    conn.close()
    measure.report_child_metrics({})


class AgentLoopState(TypedDict):
    transcript: Annotated[list[dict[str, str]], operator.add]
    text: str
    iteration: int


N2_MAX = 1000  # LangGraph writes the whole transcript per superstep: ~1.7 GB at 3,000 iterations


def n2(iterations: int) -> Metrics:
    if iterations > N2_MAX:
        raise measure.Skipped(f"LangGraph N2 above {N2_MAX:,} iterations (its checkpoints grow with the "
                              "transcript: quadratic bytes, many minutes)")
    def agent(state: AgentLoopState) -> dict[str, Any]:
        message = {"role": "assistant", "content": measure.payload(len(state["transcript"]))}
        return {"transcript": [message], "text": message["content"]}

    def tool(state: AgentLoopState) -> dict[str, Any]:
        return {}

    def review(state: AgentLoopState) -> dict[str, Any]:
        return {"iteration": state["iteration"] + 1}

    def route(state: AgentLoopState) -> str:
        return "agent" if state["iteration"] < iterations else END

    builder = StateGraph(AgentLoopState)
    builder.add_node("agent", agent)
    builder.add_node("tool", tool)
    builder.add_node("review", review)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "tool")
    builder.add_edge("tool", "review")
    builder.add_conditional_edges("review", route, ["agent", END])
    with measure.fresh_db() as db:
        conn, saver = peers._saver(db)
        try:
            graph = builder.compile(checkpointer=saver)
            with Stopwatch() as sw:
                result = graph.invoke({"transcript": [], "text": "", "iteration": 0},
                                      peers._config(3 * iterations + 10), durability="sync")
            if len(result["transcript"]) != iterations:
                raise RuntimeError(f"langgraph: {len(result['transcript'])} messages, expected {iterations}")
            db_bytes = measure.db_footprint(db)
        finally:
            conn.close()
        db_bytes_checkpointed = measure.checkpointed_size(db)
    return {"us_per_iteration": sw.us / iterations, "total_ms": sw.ms, "db_bytes": db_bytes,
            "db_bytes_checkpointed": db_bytes_checkpointed}


def s5(runs: int = measure.S5_RUNS, steps: int = measure.S5_STEPS) -> Metrics:
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async def main(db: Path) -> float:
        conn = await aiosqlite.connect(str(db))
        try:
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute("PRAGMA synchronous=FULL")
            saver = AsyncSqliteSaver(conn)
            await saver.setup()
            async with conn.execute("PRAGMA synchronous") as cur:
                row = await cur.fetchone()
            if row is None or int(row[0]) != 2:
                raise RuntimeError("langgraph: synchronous=FULL did not hold")
            graph = peers._chain_graph(steps).compile(checkpointer=saver)

            async def one(i: int) -> None:
                config = {"configurable": {"thread_id": f"t{i}"}, "recursion_limit": steps + 10}
                result = await graph.ainvoke({"items": [], "count": 0}, config, durability="sync")
                peers._check(result, items=steps, count=steps)

            with Stopwatch() as sw:
                await asyncio.gather(*(one(i) for i in range(runs)))
            return sw.seconds
        finally:
            await conn.close()

    with measure.fresh_db() as db:
        seconds = asyncio.run(main(db))
    return {"transitions_per_s": runs * steps / seconds, "total_ms": seconds * 1000}


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "chain":
        _chain_process(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(f"usage: {sys.argv[0]} chain DB N")
