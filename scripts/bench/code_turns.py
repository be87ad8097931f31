"""What flowkernel adds per Claude Code turn, against the bare Claude Agent SDK driving the same session.

    python scripts/bench/code_turns.py [--turns 10] [--repeat 5] [--json out.json]

Both sides run the CLI that ``claude-agent-sdk`` bundles, hermetic (``setting_sources=[]``, a
temporary ``HOME`` and ``CLAUDE_CONFIG_DIR``, ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``), with
partial messages on, against the project's fake Messages API on 127.0.0.1 (``ANTHROPIC_BASE_URL``),
with the same script: ``--turns`` turns that each Read a small file (a real tool, run by the CLI),
then a final answer.

- ``bare``: ``ClaudeSDKClient`` with those options, its messages read and dropped: what a program that
  drives the SDK itself does (the session stays on the local disk of its ``HOME``);
- ``flowkernel``: a flow with one ``claude.code`` node on a SQLite file, which also runs the CLI under
  its supervisor, mirrors the transcript into the store (``session_store_flush="eager"``), events every
  block and stores every message and tool call.

Per turn: the median gap between the fake API's arrival times of consecutive model requests (where both
sides are seen alike). The two sides alternate, pair by pair. ``resume``: a session continued in a new
process, from the message to the arrival of its first new model request. flowkernel: a run waiting at
turn ``--turns // 2`` for the approval of a Bash call (``ask``), answered through a fresh Kernel (the
session materialised from the store into a new home). Bare: a finished session continued with
``resume=<session id>`` and ``continue`` from the home it ran in.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from agent_turns import gaps_ms
from flowkernel.agents.claude_sdk import SdkSessionQuery
from flowkernel.flowfiles.localfiles import ALLOW_DIRS_ENV
from flowkernel.plugins.registry import default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.testing.claude_code import DUMMY_API_KEY, cli_problem, hermetic_session
from flowkernel.testing.fake_api import FakeAnthropic, Response, Text, ToolUse, reply

PROMPT = "Read the notes, once per turn."
TOOLS = ["Read"]
NOTES = "a small file the session reads\n" * 5


def script(notes: Path, turns: int, *, ask_at: int | None = None) -> list[Response]:
    out = [reply(Text(f"turn {t}: reading"), ToolUse("Read", {"file_path": str(notes)})) for t in range(turns)]
    if ask_at is not None:  # stop there: the node waits for an approval; bare ends and is resumed
        out = out[:ask_at]
        # a command that writes (a read-only one would pass without asking)
        out.append(reply(ToolUse("Bash", {"command": f"echo approved > {notes.parent / 'out.txt'}"})))
    return [*out, reply(Text("All done."))]


def _work(tmp: Path, name: str) -> tuple[Path, Path]:
    work = tmp / name
    work.mkdir()
    notes = work / "notes.txt"
    notes.write_text(NOTES)
    return work, notes


async def _drain(client: Any) -> dict[str, Any]:
    from claude_agent_sdk import ResultMessage

    async for message in client.receive_messages():
        if isinstance(message, ResultMessage):
            return {"subtype": message.subtype, "is_error": message.is_error, "session_id": message.session_id}
    raise SystemExit("bare: the session ended without a result")


async def bare(base_url: str, work: Path, *, home_of: Any = None, resume: str | None = None,
               prompt: str = PROMPT) -> dict[str, Any]:
    """One session process through ``ClaudeSDKClient``; ``home_of``: an open ``hermetic_session`` to
    reuse (a resume continues in the home the session ran in)."""
    from claude_agent_sdk import ClaudeSDKClient

    def options(cc: Any) -> Any:
        ids = {"resume": resume} if resume else {"session_id": str(uuid.uuid4())}
        return cc.options(cwd=work, allowed_tools=TOOLS, include_partial_messages=True, **ids)

    async def once(cc: Any) -> dict[str, Any]:
        async with ClaudeSDKClient(options(cc)) as client:
            await client.query(prompt)
            result = await _drain(client)
        if result["subtype"] != "success" or result["is_error"]:
            raise SystemExit(f"bare session ended {result}: {''.join(cc.stderr)[-500:]}")
        return result

    if home_of is not None:
        return await once(home_of)
    with hermetic_session(base_url) as cc:
        return await once(cc)


def _flow(work: Path, ask: bool = False) -> dict[str, Any]:
    node_input: dict[str, Any] = {"prompt": PROMPT, "cwd": str(work), "allowedTools": TOOLS}
    if ask:
        node_input["ask"] = ["Bash"]
    return {"name": "bench-code", "nodes": [{"id": "code", "type": "claude.code", "input": node_input}],
            "edges": []}


def _kernel(db: Path, base_url: str) -> Kernel:
    query = SdkSessionQuery(env={"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": DUMMY_API_KEY})
    return Kernel(SqliteStore(db), registry=default_registry().copy(), services={"session_query": query})


async def flowkernel(base_url: str, base: Path, db: Path) -> None:
    kernel = _kernel(db, base_url)
    try:
        snap = await kernel.run(kernel.compile(_flow(base / "work"), base_dir=base), {})
        if snap.status != "completed":
            raise SystemExit(f"flowkernel run ended {snap.status}: {snap.error}")
    finally:
        kernel.store.close()


async def flowkernel_resume_ms(fake: FakeAnthropic, base: Path, db: Path) -> float:
    """A run waiting for the approval of a Bash call, answered through a fresh Kernel: ms from the reply
    to the next model request's arrival."""
    first = _kernel(db, fake.base_url)
    snap = await first.run(first.compile(_flow(base / "work", ask=True), base_dir=base), {})
    first.store.close()
    if snap.status != "waiting":
        raise SystemExit(f"the resume run ended {snap.status}, not waiting: {snap.error}")
    (waiting,) = snap.waiting.values()
    before = len(fake.requests)
    second = _kernel(db, fake.base_url)
    try:
        start = time.monotonic()
        done = await second.reply(snap.runId, waiting.runId, {"allow": True})
        if done.status != "completed":
            raise SystemExit(f"the resumed run ended {done.status}: {done.error}")
        return float(fake.requests[before].received_at - start) * 1000
    finally:
        second.store.close()


async def bare_resume_ms(fake: FakeAnthropic, work: Path) -> float:
    """A finished session continued with ``resume`` from its home: ms from the start of the new client
    to its first model request's arrival."""
    with hermetic_session(fake.base_url) as cc:
        first = await bare(fake.base_url, work, home_of=cc)
        before = len(fake.requests)
        start = time.monotonic()
        await bare(fake.base_url, work, home_of=cc, resume=first["session_id"], prompt="continue")
        return float(fake.requests[before].received_at - start) * 1000


def _resume_script(notes: Path, turns: int) -> list[Response]:
    """The first process's turns up to the Bash call, then the answer after the resume."""
    return script(notes, turns, ask_at=turns // 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5, help="pairs (bare, flowkernel), alternating")
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    args = ap.parse_args()
    with FakeAnthropic() as fake:
        problem = cli_problem({"ANTHROPIC_BASE_URL": fake.base_url, "HOME": tempfile.gettempdir()})
    if problem:
        raise SystemExit(f"the Claude Code CLI cannot start here: {problem}")
    per_turn: dict[str, list[float]] = {"bare": [], "flowkernel": []}
    totals: dict[str, list[float]] = {"bare": [], "flowkernel": []}
    resumes: dict[str, list[float]] = {"bare": [], "flowkernel": []}
    with tempfile.TemporaryDirectory(prefix="fk-bench-code-") as name:
        tmp = Path(name)
        # An absolute cwd, allowed: a fresh Kernel resuming the run has no flow folder to resolve against.
        os.environ[ALLOW_DIRS_ENV] = str(tmp)
        for rep in range(args.repeat + 1):  # the first pair warms both up and is not counted
            order = ("bare", "flowkernel") if rep % 2 else ("flowkernel", "bare")
            for side in order:
                base = tmp / f"{side}{rep}"
                base.mkdir()
                work, notes = _work(base, "work")
                with FakeAnthropic() as fake:
                    fake.script(*script(notes, args.turns))
                    start = time.perf_counter()
                    if side == "bare":
                        anyio.run(bare, fake.base_url, work)
                    else:
                        anyio.run(flowkernel, fake.base_url, base, base / "runs.db")
                    elapsed = (time.perf_counter() - start) * 1000
                    if len(fake.requests) != args.turns + 1:
                        raise SystemExit(f"{side}: {len(fake.requests)} model requests, expected {args.turns + 1}")
                if rep:
                    per_turn[side].append(statistics.median(gaps_ms(fake)))
                    totals[side].append(elapsed)
            for side in order:
                base = tmp / f"{side}-resume{rep}"
                base.mkdir()
                work, notes = _work(base, "work")
                with FakeAnthropic() as fake:
                    if side == "bare":
                        fake.script(*script(notes, args.turns // 2), reply(Text("Continued.")))
                        took = anyio.run(bare_resume_ms, fake, work)
                    else:
                        fake.script(*_resume_script(notes, args.turns))
                        took = anyio.run(flowkernel_resume_ms, fake, base, base / "runs.db")
                if rep:
                    resumes[side].append(took)
            print(f"pair {rep}/{args.repeat}{' (warm-up)' if not rep else ''} done", file=sys.stderr)

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    ratios = [f / b for f, b in zip(per_turn["flowkernel"], per_turn["bare"], strict=True)]
    print(f"claude.code, {args.turns} turns of one Read each, {args.repeat} pairs (medians)")
    print(f"{'':36}{'bare SDK':>12}{'flowkernel':>12}{'fk/bare':>10}")
    print(f"{'per turn, ms':36}{med(per_turn['bare']):12.1f}{med(per_turn['flowkernel']):12.1f}{med(ratios):10.2f}")
    print(f"{'whole session, ms':36}{med(totals['bare']):12.0f}{med(totals['flowkernel']):12.0f}"
          f"{med(totals['flowkernel']) / med(totals['bare']):10.2f}")
    print(f"{'resume -> first new model request, ms':36}{med(resumes['bare']):12.0f}"
          f"{med(resumes['flowkernel']):12.0f}{med(resumes['flowkernel']) / med(resumes['bare']):10.2f}")
    if args.json:
        args.json.write_text(json.dumps({"perTurnMs": per_turn, "sessionMs": totals, "resumeMs": resumes,
                                         "ratioPerTurn": ratios, "turns": args.turns}))


if __name__ == "__main__":
    main()
