"""Crash soak: ``flowkernel run``, ``resume`` and ``reply`` killed with SIGKILL at seeded random moments.

Each trial drives one flow to the end through the CLI, as a user would: ``run``, then ``reply`` when
the run waits for a human (the flow's replies, in order), then ``resume`` after every kill. A trial's
seed picks the moments: the first process dies right before its N-th durable write (a commit of
events, a new run, an agent message or tool-call row, a taken command; N uniform over the writes an
uninterrupted execution makes, so every state the store can be left in is reachable), and each later
process dies the same way with probability one half, up to three kills. Then the run is compared
with an uninterrupted run of the same flow:

- it completed, each of its runs (children too) has a gapless seq and one ``flow:complete``;
- no node run completed twice, and every node (and forEach item) completed as often as uninterrupted,
  with the same edge decisions;
- outputs and state are equal (session ids, durations, usage and cost aside);
- every agent conversation is the uninterrupted one (resume messages aside, and a tool call that a new
  pass found cut short told as interrupted; one its own node run's resume finds runs again), so it
  starts with its prompt and holds it once; each tool call is stored once, and one told as interrupted
  is stored with status ``error``;
- replaying each run's events gives its stored snapshot.

Processes are forked from a server that has imported flowkernel already (``--spawn`` in the script:
a fresh interpreter each, as the shell starts them), so a trial costs what the flow costs.
``python -m tests.soak`` (``scripts/soak``) runs any number of trials and prints a table.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KILLED = -signal.SIGKILL
FORKSERVER_LOST_STATUS = 255
PLUGINS = ("tests.plugins.crashpoint", "tests.plugins.crashy", "flowkernel.examples.research_tools")
MAX_KILLS = 3
MAX_PROCESSES = 16
VOLATILE = frozenset({"sessionId", "usage", "totalCostUsd", "modelUsage", "durationMs"})


@dataclass(frozen=True)
class Case:
    """A flow the soak drives: its file, input, fixtures and the replies it waits for (node -> replies)."""

    name: str
    flow: Path
    inputs: tuple[str, ...] = ()
    fixtures: Path | None = None
    replies: dict[str, tuple[str, ...]] = field(default_factory=dict)


CASES = (
    Case("review-loop", ROOT / "flows" / "review-loop.json", ("feature=CSV export",), ROOT / "fixtures" / "review-loop"),
    Case("approval", ROOT / "flows" / "approval.json", ("topic=dark mode in the settings page",),
         ROOT / "fixtures" / "approval", {"review": ("Mention that it ships on Friday.", "approve")}),
    Case("fanout", ROOT / "flows" / "fanout.json", (), ROOT / "fixtures" / "fanout"),
    Case("research", ROOT / "flows" / "research.json", ("question=Which database should our desktop app use?",),
         ROOT / "fixtures" / "research", {"researcher": ("Mostly record transactions.",)}),
    Case("subflow", ROOT / "flows" / "subflow.json", ("topic=durable workflows",), ROOT / "fixtures" / "subflow"),
    Case("fanout-loop", ROOT / "tests" / "flows" / "soak-fanout-loop.json", ("seed=7", "items=[1, 2, 3, 4]")),
    Case("patches", ROOT / "tests" / "flows" / "soak-patches.json"),
)


# -- one CLI process --------------------------------------------------------------------------

def _env(crash: str | None, count_file: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["FLOWKERNEL_PLUGINS"] = ",".join(PLUGINS)
    env["ANTHROPIC_BASE_URL"] = "http://127.0.0.1:9"  # nothing listens: a call that misses the fixtures fails fast
    env["NO_COLOR"] = "1"
    for key in ("FLOWKERNEL_DB", "FLOWKERNEL_CRASH", "FLOWKERNEL_CRASH_COUNT", "CRASH_AT"):
        env.pop(key, None)
    if crash:
        env["FLOWKERNEL_CRASH"] = crash
    if count_file:
        env["FLOWKERNEL_CRASH_COUNT"] = count_file
    return env


def _forked_main(argv: list[str], crash: str | None, log: str, count_file: str | None) -> None:
    """The body of a forked CLI process: the crash plugin armed, output to ``log``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(_env(None))
    from tests.plugins import crashpoint

    crashpoint.arm(crash)
    from flowkernel.cli import main

    code = main(argv)
    if count_file:
        Path(count_file).write_text(str(crashpoint.writes()), encoding="utf-8")
    sys.stdout.flush()
    sys.stderr.flush()
    Path(log + ".exit").write_text(str(code), encoding="utf-8")  # see Launcher.run: a lost status
    os._exit(code)


class Launcher:
    """Runs ``flowkernel`` commands as processes: forked from a server that imported everything once,
    or (``spawn``) as fresh interpreters."""

    def __init__(self, spawn: bool = False) -> None:
        self.spawn = spawn
        self._ctx: Any = None
        if not spawn:
            self._ctx = multiprocessing.get_context("forkserver")
            self._ctx.set_forkserver_preload(["tests.soak", "tests.soak_preload"])

    def run(self, argv: list[str], log: Path, crash: str | None = None, count_file: str | None = None,
            timeout: float = 120) -> int:
        if self.spawn:
            with log.open("w", encoding="utf-8") as out:
                done = subprocess.run([sys.executable, "-m", "flowkernel.cli", *argv], cwd=ROOT, stdout=out,
                                      stderr=subprocess.STDOUT, env=_env(crash, count_file), timeout=timeout)
            return done.returncode
        proc = self._ctx.Process(target=_forked_main, args=(argv, crash, str(log), count_file))
        proc.start()
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise TimeoutError(f"flowkernel {' '.join(argv)} did not finish within {timeout} s (log: {log})")
        code: int = proc.exitcode
        if code == FORKSERVER_LOST_STATUS:
            # multiprocessing's forkserver answers 255 when it could not pass the child's exit status
            # on (flowkernel never exits 255). The child wrote its own code just before it exited;
            # without that file it did not get there, which with a crash point armed is its kill.
            status = Path(f"{log}.exit")
            if status.exists():
                return int(status.read_text(encoding="utf-8"))
            if crash is not None:
                return KILLED
        return code


# -- driving a flow to the end ----------------------------------------------------------------

@dataclass
class Drive:
    run_id: str | None
    processes: int
    kills: int
    writes: list[int]  # durable writes each process made (when counted)
    log: list[str]


def _read(db: Path, fn: Callable[[Any], Any]) -> Any:
    from flowkernel.run.kernel import Kernel

    kernel = Kernel(str(db))
    try:
        return fn(kernel)
    finally:
        kernel.close()


def _runs(kernel: Any) -> list[Any]:
    return [r for r in kernel.runs() if r.parentRunId is None]


def _next_command(case: Case, db: Path, run_id: str | None) -> list[str] | None:
    """What a user types next: run; then what ``flowkernel show`` tells them: reply (the answer to the
    question the node waits on now) or resume."""
    fixtures = ["--fixtures", str(case.fixtures)] if case.fixtures else []
    if run_id is None:
        inputs = [a for kv in case.inputs for a in ("--input", kv)]
        return ["run", str(case.flow), *inputs, *fixtures, "--db", str(db)]

    def look(kernel: Any) -> tuple[str, dict[str, str], str, Counter[str]]:
        from flowkernel.cli.show import show_snapshot

        snap = kernel.snapshot(run_id)
        asked = Counter(ev.nodeId or "" for ev in kernel.events(run_id) if ev.type == "node:waiting")
        shown = io.StringIO()
        show_snapshot(kernel.store.get_run(run_id), snap, shown, live=False)  # (no process executes it now)
        return snap.status, {n: w.runId for n, w in snap.waiting.items()}, shown.getvalue(), asked

    status, waiting, shown, asked = _read(db, look)
    if status == "completed":
        return None
    if status == "waiting":
        for node, node_run in sorted(waiting.items()):
            replies = case.replies.get(node, ())
            question = asked[node] - 1  # the node's n-th wait takes its n-th reply
            if f"flowkernel reply {run_id} --to {node_run}" in shown and 0 <= question < len(replies):
                return ["reply", run_id, "--to", node_run, replies[question], *fixtures, "--db", str(db)]
    if status in ("failed", "aborted"):
        raise RuntimeError(f"run {run_id} ended {status}")
    return ["resume", run_id, *fixtures, "--db", str(db)]


def drive(case: Case, workdir: Path, launcher: Launcher, kill_at: Callable[[int], int | None],
          count: bool = False) -> Drive:
    """Run ``case`` to the end in ``workdir``; ``kill_at(i)`` is the write the i-th process dies before."""
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "runs.db"
    run_id: str | None = None
    kills = 0
    writes: list[int] = []
    log: list[str] = []
    for i in range(MAX_PROCESSES):
        argv = _next_command(case, db, run_id)
        if argv is None:
            return Drive(run_id, i, kills, writes, log)
        n = kill_at(i)
        count_file = str(workdir / f"writes-{i}") if count else None
        out = workdir / f"process-{i}.log"
        code = launcher.run(argv, out, crash=f"before-write:{n}" if n else None, count_file=count_file)
        log.append(f"{argv[0]}{f' killed before write {n}' if n else ''} -> {code}")
        if code == KILLED:
            kills += 1
        elif code not in (0, 3):
            raise RuntimeError(f"flowkernel {argv[0]} exited {code}: {out.read_text(encoding='utf-8')[-2000:]}")
        if count_file and Path(count_file).exists():
            writes.append(int(Path(count_file).read_text(encoding="utf-8")))
        if run_id is None and db.exists():
            found = _read(db, _runs)
            run_id = found[0].runId if found else None
    raise RuntimeError(f"{case.name}: not finished after {MAX_PROCESSES} processes: {log}")


# -- what a finished run looks like -----------------------------------------------------------

def _normalized(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


def _conversation(messages: Iterable[dict[str, Any]], resume_texts: set[str]) -> list[Any]:
    """Stored messages as (role, content), resume messages out, interrupted tool results marked."""
    from flowkernel.agents.tools import INTERRUPTED_RESULT
    from flowkernel.fixtures.compare import without_texts

    out: list[Any] = []
    for m in without_texts({"messages": list(messages)}, resume_texts)["messages"]:
        content = m["content"]
        if isinstance(content, list):
            content = [{"type": "tool_result", "tool_use_id": b.get("tool_use_id"), "interrupted": True}
                       if isinstance(b, dict) and b.get("type") == "tool_result" and b.get("content") == INTERRUPTED_RESULT
                       else b for b in content]
        out.append({"role": m["role"], "content": content})
    return out


@dataclass
class Outcome:
    status: str
    outputs: Any
    state: Any
    completes: Counter[tuple[str, str, int | None]]  # (run, node, item) -> node:complete count
    decisions: Counter[tuple[str, str, str]]  # (run, edge, fire | skip)
    conversations: dict[str, list[Any]]
    tool_calls: Counter[str]
    problems: list[str]


def outcome(db: Path, run_id: str) -> Outcome:
    """Everything the soak compares, read from the store, plus what is wrong whatever the reference."""
    from flowkernel.core.events import EdgeFire, EdgeSkip, FlowComplete, FlowResumed, NodeComplete
    from flowkernel.testing.audit import audit_run

    def read(kernel: Any) -> Outcome:
        snap = kernel.snapshot(run_id)
        problems: list[str] = []
        completes: Counter[tuple[str, str, int | None]] = Counter()
        decisions: Counter[tuple[str, str, str]] = Counter()
        talks: dict[str, list[Any]] = {}
        tools: Counter[str] = Counter()
        runs = [(run_id, "")]
        while runs:
            rid, key = runs.pop(0)
            events = kernel.events(rid)
            seqs = [e.seq for e in events]
            if seqs != list(range(1, len(seqs) + 1)):
                problems.append(f"{key or 'run'}: seq is not gapless: {seqs[:20]}…")
            finished = Counter(e.runId for e in events if isinstance(e, NodeComplete))
            twice = [r for r, c in finished.items() if c > 1]
            if twice:
                problems.append(f"{key or 'run'}: node runs completed twice: {twice}")
            ends = sum(1 for e in events if isinstance(e, FlowComplete))
            if ends != 1:
                problems.append(f"{key or 'run'}: {ends} flow:complete events")
            for e in events:
                if isinstance(e, NodeComplete):
                    completes[(key, e.nodeId or "", e.item)] += 1
                elif isinstance(e, EdgeFire | EdgeSkip):
                    decisions[(key, e.edgeId, e.type)] += 1
            resumed = {e.message for e in events if isinstance(e, FlowResumed) and isinstance(e.message, str)}
            by_session: dict[str, list[dict[str, Any]]] = {}
            for r in kernel.store.list_agent_messages(flow_run_id=rid, limit=100_000):
                if r["role"] != "system":
                    session = f"{key}/{r['sessionId']}".replace(rid.removeprefix("run_"), "*")
                    by_session.setdefault(session, []).append(r)
            for session, rows in by_session.items():
                talks[session] = _conversation(rows, resumed)
            for row in kernel.store.list_tool_calls(flow_run_id=rid, limit=100_000):
                tools[f"{key}/{row['toolUseId']}"] += 1
                if row["output"] == _interrupted() and row["status"] != "error":
                    problems.append(f"{key}: tool call {row['toolUseId']} interrupted but stored as {row['status']}")
            try:
                audit_run(kernel.store, rid)
            except AssertionError as exc:
                problems.append(str(exc)[:2000])
            runs += [(c.runId, f"{key}/{c.flowName}") for c in kernel.runs(parent=rid)]
        return Outcome(status=snap.status, outputs=_normalized(snap.outputs), state=_normalized(snap.state),
                       completes=completes, decisions=decisions, conversations=talks, tool_calls=tools,
                       problems=problems)

    result: Outcome = _read(db, read)
    return result


def _interrupted() -> str:
    from flowkernel.agents.tools import INTERRUPTED_RESULT

    return INTERRUPTED_RESULT


def _same_conversation(got: list[Any], want: list[Any]) -> bool:
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if g == w:
            continue
        if g["role"] != w["role"] or not isinstance(g["content"], list) or not isinstance(w["content"], list) \
                or len(g["content"]) != len(w["content"]):
            return False
        for gb, wb in zip(g["content"], w["content"], strict=True):
            if gb != wb and not (isinstance(gb, dict) and gb.get("interrupted")
                                 and wb.get("tool_use_id") == gb.get("tool_use_id")):
                return False
    return True


def differences(got: Outcome, want: Outcome) -> list[str]:
    """Why ``got`` is not what an uninterrupted run gives (empty when it is)."""
    out = list(got.problems)
    if got.status != "completed":
        out.append(f"status {got.status}")
    if got.outputs != want.outputs:
        out.append(f"outputs differ:\n  got  {_brief(got.outputs)}\n  want {_brief(want.outputs)}")
    if got.state != want.state:
        out.append(f"state differs:\n  got  {_brief(got.state)}\n  want {_brief(want.state)}")
    if got.completes != want.completes:
        out.append(f"node:complete counts differ: {_counter_diff(got.completes, want.completes)}")
    if got.decisions != want.decisions:
        out.append(f"edge decisions differ: {_counter_diff(got.decisions, want.decisions)}")
    if got.tool_calls != want.tool_calls:
        out.append(f"tool calls differ: {_counter_diff(got.tool_calls, want.tool_calls)}")
    for session in sorted(set(got.conversations) | set(want.conversations)):
        g, w = got.conversations.get(session, []), want.conversations.get(session, [])
        if not _same_conversation(g, w):
            out.append(f"conversation {session} differs:\n  got  {_brief(g)}\n  want {_brief(w)}")
    return out


def _brief(value: Any, width: int = 600) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= width else text[:width] + "…"


def _counter_diff(a: Counter[Any], b: Counter[Any]) -> str:
    keys = sorted({*a, *b}, key=str)
    return ", ".join(f"{k}: {a.get(k, 0)} (want {b.get(k, 0)})" for k in keys if a.get(k, 0) != b.get(k, 0))


# -- trials -----------------------------------------------------------------------------------

@dataclass
class Reference:
    outcome: Outcome
    writes: int  # the most durable writes one process of the uninterrupted drive made


@dataclass
class Trial:
    case: str
    seed: int
    kills: int
    failures: list[str]
    log: list[str]


def reference(case: Case, workdir: Path, launcher: Launcher) -> Reference:
    done = drive(case, workdir, launcher, lambda i: None, count=True)
    assert done.run_id is not None
    got = outcome(workdir / "runs.db", done.run_id)
    if got.problems or got.status != "completed":
        raise RuntimeError(f"{case.name}: the uninterrupted run is not clean: {got.status} {got.problems}")
    return Reference(got, max(done.writes, default=1))


def trial(case: Case, seed: int, ref: Reference, workdir: Path, launcher: Launcher) -> Trial:
    """One seeded trial: the first process is killed, later ones with probability 1/2, three at most."""
    rng = random.Random(f"{case.name}:{seed}")
    plan: list[int | None] = []

    def kill_at(i: int) -> int | None:
        while len(plan) <= i:
            killed = sum(1 for p in plan if p)
            die = killed < MAX_KILLS and (not plan or rng.random() < 0.5)
            plan.append(rng.randint(1, max(ref.writes, 1)) if die else None)
        return plan[i]

    try:
        done = drive(case, workdir, launcher, kill_at)
    except (RuntimeError, TimeoutError) as exc:
        return Trial(case.name, seed, 0, [str(exc)], [])
    assert done.run_id is not None
    return Trial(case.name, seed, done.kills, differences(outcome(workdir / "runs.db", done.run_id), ref.outcome),
                 done.log)


@dataclass
class Report:
    trials: list[Trial]

    def table(self) -> str:
        rows = [("flow", "trials", "kills mid-run", "failures")]
        for name in [c.name for c in CASES]:
            mine = [t for t in self.trials if t.case == name]
            if mine:
                rows.append((name, str(len(mine)), str(sum(t.kills for t in mine)),
                             str(sum(1 for t in mine if t.failures))))
        rows.append(("all", str(len(self.trials)), str(sum(t.kills for t in self.trials)),
                     str(sum(1 for t in self.trials if t.failures))))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                         for r in rows)

    def failures(self) -> str:
        return "\n\n".join(f"{t.case} seed {t.seed} (again: scripts/soak --case {t.case} --seed {t.seed} --trials 1):\n  "
                           + "\n  ".join(t.failures) + f"\n  processes: {t.log}"
                           for t in self.trials if t.failures)


def soak(trials: int, workdir: Path, *, cases: Sequence[Case] = CASES, first_seed: int = 0, jobs: int = 1,
         spawn: bool = False, progress: Callable[[Trial], None] | None = None) -> Report:
    """``trials`` trials spread over ``cases`` in turn (trial i: case i mod len, seed first_seed + i)."""
    launcher = Launcher(spawn)
    refs = {c.name: reference(c, workdir / "reference" / c.name, launcher) for c in cases}

    def one(i: int) -> Trial:
        case = cases[i % len(cases)]
        seed = first_seed + i
        result = trial(case, seed, refs[case.name], workdir / f"{case.name}-{seed}", launcher)
        if progress is not None:
            progress(result)
        return result

    with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        return Report(list(pool.map(one, range(trials))))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/soak", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--case", action="append", choices=[c.name for c in CASES], help="only these flows (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="the first trial's seed (trial i has seed + i)")
    p.add_argument("--jobs", type=int, default=2, help="trials at once")
    p.add_argument("--spawn", action="store_true", help="start each process as a fresh interpreter")
    p.add_argument("--keep", metavar="DIR", help="keep every database and process log in DIR")
    args = p.parse_args(argv)
    cases = [c for c in CASES if not args.case or c.name in args.case]
    began = time.monotonic()
    done = [0]

    def progress(t: Trial) -> None:
        done[0] += 1
        mark = "FAIL" if t.failures else "ok"
        print(f"[{done[0]}/{args.trials}] {t.case} seed {t.seed}: {t.kills} kill(s), {mark}", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="flowkernel-soak-") as tmp:
        workdir = Path(args.keep) if args.keep else Path(tmp)
        report = soak(args.trials, workdir, cases=cases, first_seed=args.seed, jobs=args.jobs, spawn=args.spawn,
                      progress=progress)
    print(report.table())
    print(f"({time.monotonic() - began:.0f} s)")
    if report.failures():
        print("\n" + report.failures())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
