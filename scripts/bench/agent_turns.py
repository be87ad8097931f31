"""What flowkernel adds per agent turn, against the bare SDK driving the same conversation.

    python scripts/bench/agent_turns.py [--turns 20] [--tools 4] [--repeat 5] [--json out.json]

Both sides talk to the project's fake Messages API on 127.0.0.1 over the real ``anthropic`` client
(streaming), with the same script: ``--turns`` turns of ``--tools`` tool calls each, then a final
answer. The tools return a short string at once, so what is measured is the loop around the model:

- ``bare``: ``anthropic.AsyncAnthropic`` and a hand-written tool loop (stream, accumulate the
  blocks, run the turn's tools concurrently, append the assistant message and the results), keeping
  nothing: the least any agent loop does.
- ``flowkernel``: a flow with one ``claude.agent`` node on a SQLite file (the embedded default),
  which also events every block, stores every message and tool call, and commits the run's snapshot
  durably after every turn.

A turn is timed where both sides are seen alike: the fake API's arrival times of consecutive model
requests (the median gap of one run is its per-turn time). The two sides alternate, pair by pair,
so a busier moment of a shared machine weighs on both. ``resume``: a run whose agent asked a human
at turn ``--turns // 2`` is answered through a new Kernel on the same database (the conversation
rebuilt from the store); the time from the reply to the model request that follows.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anthropic
import anyio
from flowkernel.agents.anthropic import AnthropicQuery
from flowkernel.plugins.registry import Registry, default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.testing.fake_api import FakeAnthropic, Response, Text, ToolUse, reply

MODEL = "claude-sonnet-4-6"
MAX_TOKENS = 1024


def _tool(k: int) -> Any:
    def tool(n: int) -> str:
        return f"tool {k} saw {n}"
    tool.__name__ = f"tool_{k}"
    tool.__doc__ = f"Tool number {k}: says what it saw."
    return tool


TOOL_DEFS = [{"name": f"tool_{k}", "description": f"Tool number {k}: says what it saw.",
              "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}
             for k in range(4)]


def script(turns: int, per_turn: int, *, ask_at: int | None = None) -> list[Response]:
    out: list[Response] = []
    for t in range(turns):
        calls = [ToolUse(f"tool_{k % 4}", {"n": t * 10 + k}) for k in range(per_turn)]
        if t == ask_at:
            calls = [ToolUse("ask_human", {"question": "Go on?"})]
        out.append(reply(Text(f"turn {t}: calling tools"), *calls))
    return [*out, reply(Text("All done."))]


def gaps_ms(fake: FakeAnthropic) -> list[float]:
    times = [r.received_at for r in fake.requests]
    return [(b - a) * 1000 for a, b in itertools.pairwise(times)]


async def bare(base_url: str, turns: int, per_turn: int) -> None:
    tools = {f"tool_{k}": _tool(k) for k in range(4)}
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="bench", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Call the tools as asked."}]
    async with client:
        while True:
            blocks: dict[int, dict[str, Any]] = {}
            partial: dict[int, str] = {}
            stop = None
            stream = await client.messages.create(model=MODEL, max_tokens=MAX_TOKENS, messages=messages,  # type: ignore[arg-type]
                                                  tools=TOOL_DEFS, stream=True)  # type: ignore[arg-type]
            async with stream:
                async for ev in stream:
                    if ev.type == "content_block_start":
                        blocks[ev.index] = ev.content_block.model_dump(mode="json", exclude_none=True)
                        if blocks[ev.index]["type"] == "tool_use":
                            partial[ev.index] = ""
                    elif ev.type == "content_block_delta":
                        if ev.delta.type == "text_delta":
                            blocks[ev.index]["text"] = blocks[ev.index].get("text", "") + ev.delta.text
                        elif ev.delta.type == "input_json_delta":
                            partial[ev.index] += ev.delta.partial_json
                    elif ev.type == "content_block_stop" and ev.index in partial:
                        raw = partial.pop(ev.index)
                        blocks[ev.index]["input"] = json.loads(raw) if raw else {}
                    elif ev.type == "message_delta":
                        stop = ev.delta.stop_reason
            content = [blocks[i] for i in sorted(blocks)]
            messages.append({"role": "assistant", "content": content})
            if stop != "tool_use":
                return
            uses = [b for b in content if b["type"] == "tool_use"]
            results: list[dict[str, Any]] = [{}] * len(uses)

            async def call(i: int, use: dict[str, Any], results: list[dict[str, Any]] = results) -> None:
                results[i] = {"type": "tool_result", "tool_use_id": use["id"],
                              "content": tools[use["name"]](**use["input"])}

            async with anyio.create_task_group() as tg:
                for i, use in enumerate(uses):
                    tg.start_soon(call, i, use)
            messages.append({"role": "user", "content": results})


def _registry() -> Registry:
    registry = default_registry().copy()
    for k in range(4):
        registry.register_tool(_tool(k))
    return registry


def _flow(turns: int, tools: list[str]) -> dict[str, Any]:
    return {"name": "bench-agent", "nodes": [{"id": "agent", "type": "claude.agent", "input": {
        "prompt": "Call the tools as asked.", "model": MODEL, "maxTokens": MAX_TOKENS, "tools": tools,
        "maxTurns": turns + 5}}], "edges": []}


def _kernel(db: Path, base_url: str) -> Kernel:
    query = AnthropicQuery(base_url=base_url, api_key="bench", max_retries=0)
    return Kernel(SqliteStore(db), registry=_registry(), services={"query_fn": query})


async def _close(kernel: Kernel) -> None:
    """The store, and the query's HTTP client while its event loop still runs."""
    query = kernel.services.query_fn
    if isinstance(query, AnthropicQuery):
        await query.aclose()
    kernel.store.close()


async def flowkernel(base_url: str, turns: int, db: Path) -> None:
    kernel = _kernel(db, base_url)
    try:
        snap = await kernel.run(kernel.compile(_flow(turns, [f"tool_{k}" for k in range(4)])), {})
        if snap.status != "completed":
            raise SystemExit(f"flowkernel run ended {snap.status}: {snap.error}")
    finally:
        await _close(kernel)


async def resume_ms(base_url: str, fake: FakeAnthropic, turns: int, db: Path) -> float:
    """A run waiting on ask_human after half its turns, answered through a fresh Kernel: ms from the
    reply to the next model request's arrival."""
    first = _kernel(db, base_url)
    snap = await first.run(first.compile(_flow(turns, ["ask_human", *[f"tool_{k}" for k in range(4)]])), {})
    await _close(first)
    if snap.status != "waiting":
        raise SystemExit(f"the resume run ended {snap.status}, not waiting: {snap.error}")
    (waiting,) = snap.waiting.values()
    before = len(fake.requests)
    second = _kernel(db, base_url)
    try:
        start = time.monotonic()
        done = await second.reply(snap.runId, waiting.runId, "Yes, go on.")
        if done.status != "completed":
            raise SystemExit(f"the resumed run ended {done.status}: {done.error}")
        return (fake.requests[before].received_at - start) * 1000
    finally:
        await _close(second)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--tools", type=int, default=4, help="tool calls per turn")
    ap.add_argument("--repeat", type=int, default=5, help="pairs (bare, flowkernel), alternating")
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    args = ap.parse_args()
    per_turn: dict[str, list[float]] = {"bare": [], "flowkernel": []}
    totals: dict[str, list[float]] = {"bare": [], "flowkernel": []}
    resumes: list[float] = []
    with tempfile.TemporaryDirectory(prefix="fk-bench-agent-") as tmp:
        for rep in range(args.repeat + 1):  # the first pair warms both up and is not counted
            order = ("bare", "flowkernel") if rep % 2 else ("flowkernel", "bare")
            for side in order:
                with FakeAnthropic() as fake:
                    fake.script(*script(args.turns, args.tools))
                    start = time.perf_counter()
                    if side == "bare":
                        anyio.run(bare, fake.base_url, args.turns, args.tools)
                    else:
                        anyio.run(flowkernel, fake.base_url, args.turns, Path(tmp) / f"run{rep}.db")
                    elapsed = (time.perf_counter() - start) * 1000
                    if len(fake.requests) != args.turns + 1:
                        raise SystemExit(f"{side}: {len(fake.requests)} model requests, expected {args.turns + 1}")
                if rep:
                    per_turn[side].append(statistics.median(gaps_ms(fake)))
                    totals[side].append(elapsed)
            with FakeAnthropic() as fake:
                fake.script(*script(args.turns, args.tools, ask_at=args.turns // 2))
                took = anyio.run(resume_ms, fake.base_url, fake, args.turns, Path(tmp) / f"resume{rep}.db")
            if rep:
                resumes.append(took)
            print(f"pair {rep}/{args.repeat}{' (warm-up)' if not rep else ''} done", file=sys.stderr)

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    ratios = [f / b for f, b in zip(per_turn["flowkernel"], per_turn["bare"], strict=True)]
    print(f"claude.agent, {args.turns} turns x {args.tools} tools, {args.repeat} pairs (medians)")
    print(f"{'':32}{'bare SDK':>12}{'flowkernel':>12}{'fk/bare':>10}")
    print(f"{'per turn, ms':32}{med(per_turn['bare']):12.2f}{med(per_turn['flowkernel']):12.2f}"
          f"{med(ratios):10.2f}")
    print(f"{'whole run, ms':32}{med(totals['bare']):12.1f}{med(totals['flowkernel']):12.1f}"
          f"{med(totals['flowkernel']) / med(totals['bare']):10.2f}")
    print(f"{'reply -> next model request, ms':32}{'':12}{med(resumes):12.1f}")
    if args.json:
        args.json.write_text(json.dumps({"perTurnMs": per_turn, "runMs": totals, "resumeMs": resumes,
                                         "ratioPerTurn": ratios, "turns": args.turns, "tools": args.tools}))


if __name__ == "__main__":
    main()
