"""Looking at runs from the command line: `runs`, `show`, `events`, `replay`, as a user types them."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_id_once_a_node_started

ROOT = Path(__file__).resolve().parent.parent
HELLO = ROOT / "flows" / "hello.json"


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=60)


def piped(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` through a shell pipeline, with ``fk`` standing for the CLI; pipefail on."""
    cli = f"{sys.executable} -m flowkernel.cli"
    return subprocess.run(["bash", "-c", "set -o pipefail; " + command.replace("fk ", cli + " ")], cwd=cwd,
                          env=env, text=True, capture_output=True, timeout=60)


def hello_run(tmp_path: Path, env: dict[str, str]) -> tuple[str, int]:
    res = fk("run", str(HELLO), "--input", "name=Ada", "--json", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    return events[0]["flowRunId"], events[-1]["seq"]


def test_show_at_a_seq_outside_the_run_is_refused_in_one_line(tmp_path: Path, clean_env: dict[str, str]) -> None:
    run_id, last = hello_run(tmp_path, clean_env)
    for at in ("0", "-3", str(last + 1), "9999"):
        res = fk("show", run_id, "--at", at, cwd=tmp_path, env=clean_env)
        assert res.returncode == 2, (at, res.stdout)
        assert res.stderr == f"flowkernel: run {run_id}: there is no event {at}; its events are 1 to {last}\n"
    assert fk("show", run_id, "--at", str(last), cwd=tmp_path, env=clean_env).returncode == 0
    fork = fk("fork", run_id, "--at", "9999", cwd=tmp_path, env=clean_env)
    assert fork.returncode == 2 and "there is no event 9999" in fork.stderr  # the same refusal


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path, clean_env: dict[str, str]) -> None:
    # More output than a pipe holds (64 KiB), so the CLI is still writing when the reader goes away.
    script = (
        "import anyio, sys\n"
        "from flowkernel.run.kernel import Kernel\n"
        "k = Kernel(sys.argv[1])\n"
        "one = k.compile({'name': 'one', 'nodes': [{'id': 'a', 'type': 'noop', 'input': {}}], 'edges': []})\n"
        "for _ in range(800):\n"
        "    k.create_run(one, {})\n"
        "wide = k.compile({'name': 'wide', 'nodes': [{'id': 'a', 'type': 'noop', 'input': {}},\n"
        "    {'id': 'b', 'type': 'noop', 'input': {'x': '{{ i }}'}}],\n"
        "    'edges': [{'from': 'a', 'to': 'b', 'forEach': {'in': '[1..400]', 'as': 'i'}}]})\n"
        "print(anyio.run(k.run, wide, {}).runId)\n"
    )
    made = subprocess.run([sys.executable, "-c", script, str(tmp_path / ".flowkernel" / "runs.db")], cwd=tmp_path,
                          env=clean_env, text=True, capture_output=True, timeout=120)
    assert made.returncode == 0, made.stderr
    wide = made.stdout.strip()
    for command in ("fk runs --limit 1000 | head -1", "fk runs --limit 1000 --json | head -2",
                    f"fk events {wide} | head -1", f"fk events {wide} --json | head -1",
                    f"fk show {wide} --json | head -c 10", f"fk replay {wide} | head -1"):
        res = piped(command, tmp_path, clean_env)
        assert res.returncode == 0, (command, res.stderr)
        assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr, (command, res.stderr)


def test_replay_refuses_a_negative_speed(tmp_path: Path, clean_env: dict[str, str]) -> None:
    run_id, _ = hello_run(tmp_path, clean_env)
    res = fk("replay", run_id, "--speed", "-1", cwd=tmp_path, env=clean_env)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == "flowkernel: --speed -1: must be 0 (no pacing) or a positive factor\n"


def test_events_after_a_negative_seq_is_refused_rather_than_reading_another_runs_log(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    first, _ = hello_run(tmp_path, clean_env)
    second, _ = hello_run(tmp_path, clean_env)
    res = fk("events", second, "--after", "-3", "--json", cwd=tmp_path, env=clean_env)
    assert res.returncode == 2 and res.stdout == "" and first not in res.stderr


# -- 12.3: times relative to the run's start; following a run to its end ----------------------------

def _events(run_id: str, cwd: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    out = fk("events", run_id, "--json", cwd=cwd, env=env)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def _approval(tmp_path: Path, env: dict[str, str]) -> tuple[str, str]:
    """The approval example waiting for its first reply: (run id, node run id)."""
    res = fk("run", str(ROOT / "flows" / "approval.json"), "--input", "topic=dark mode in the settings page",
             "--fixtures", str(ROOT / "fixtures" / "approval"), "--json", cwd=tmp_path, env=env)
    assert res.returncode == 3, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    return events[0]["flowRunId"], next(e["runId"] for e in events if e["type"] == "node:waiting")


def test_event_times_are_since_the_run_started_or_the_wall_clock(tmp_path: Path, clean_env: dict[str, str]) -> None:
    run_id, node_run = _approval(tmp_path, clean_env)
    assert fk("reply", run_id, "--to", node_run, "Mention that it ships on Friday.", cwd=tmp_path,
              env=clean_env).returncode == 3
    stored = _events(run_id, tmp_path, clean_env)
    start = stored[0]["timestamp"]
    text = fk("events", run_id, cwd=tmp_path, env=clean_env).stdout
    stamps = [line.split()[0] for line in text.splitlines() if line.split()[0].endswith("s")]
    since_start = [f"{(e['timestamp'] - start) / 1000:.2f}s" for e in stored]
    assert stamps[0] == "0.00s" and stamps[-1] == since_start[-1]  # the reply's events: when it came
    assert set(stamps) <= set(since_start)
    wall = fk("events", run_id, "--wall", cwd=tmp_path, env=clean_env).stdout
    first = time.strftime("%H:%M:%S", time.localtime(start // 1000)) + f".{start % 1000:03d}"
    assert wall.splitlines()[0].startswith(first + " ▶ approval")
    later = fk("events", run_id, "--after", str(stored[-1]["seq"] - 1), cwd=tmp_path, env=clean_env).stdout
    assert later.split()[0] == stamps[-1]  # still timed from the run's start


def test_events_follow_stays_with_a_waiting_run_until_it_ends(tmp_path: Path, clean_env: dict[str, str]) -> None:
    run_id, _ = _approval(tmp_path, clean_env)
    follower = subprocess.Popen([sys.executable, "-m", "flowkernel.cli", "events", run_id, "--follow", "--json"],
                                cwd=tmp_path, env=clean_env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    assert follower.stdout is not None
    try:
        seen = []
        for line in follower.stdout:  # the history, up to the wait
            seen.append(json.loads(line))
            if seen[-1]["type"] == "flow:waiting":
                break
        for answer, code in (("Mention that it ships on Friday.", 3), ("approve", 0)):  # another process each
            assert fk("reply", run_id, "--to", "review", answer, cwd=tmp_path, env=clean_env).returncode == code
        rest = [json.loads(line) for line in follower.stdout]
        assert follower.wait(timeout=30) == 0
    finally:
        follower.kill()
    assert [e["type"] for e in seen + rest].count("flow:waiting") == 2
    assert rest[-1]["type"] == "flow:complete" and rest[-1]["status"] == "completed"
    assert [e["seq"] for e in seen + rest] == list(range(1, rest[-1]["seq"] + 1))


def test_ctrl_c_ends_a_follow_quietly(tmp_path: Path, clean_env: dict[str, str]) -> None:
    run_id, _ = _approval(tmp_path, clean_env)
    follower = subprocess.Popen([sys.executable, "-m", "flowkernel.cli", "events", run_id, "--follow"],
                                cwd=tmp_path, env=clean_env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    assert follower.stdout is not None and follower.stderr is not None
    try:
        for line in follower.stdout:
            if "‖ waiting" in line:
                break
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=30) == 0
        assert follower.stderr.read() == ""
    finally:
        follower.kill()


# -- 12.5: summaries count the run; what is not executing says so --------------------------------------

def test_a_resumed_run_is_summed_up_as_a_whole(tmp_path: Path, clean_env: dict[str, str]) -> None:
    env = clean_env | {"FLOWKERNEL_PLUGINS": "flowkernel.examples.research_tools"}
    first = fk("run", str(ROOT / "flows" / "research.json"), "--input",
               "question=Which database should our desktop app use?",
               "--fixtures", str(ROOT / "fixtures" / "research"), "--json", cwd=tmp_path, env=env)
    assert first.returncode == 3, first.stderr
    events = [json.loads(line) for line in first.stdout.splitlines()]
    run_id = events[0]["flowRunId"]
    waiting = next(e["runId"] for e in events if e["type"] == "node:waiting")
    done = fk("reply", run_id, "--to", waiting, "Mostly record transactions.", cwd=tmp_path, env=clean_env)
    assert done.returncode == 0, done.stderr
    stored = _events(run_id, tmp_path, clean_env)
    completes = sum(e["type"] == "node:complete" for e in stored)
    skipped = sum(e["type"] == "node:skipped" for e in stored)
    calls = sum(e["type"] == "agent:usage" and e["nodeId"] == "researcher" for e in stored)
    assert calls >= 3
    assert f"■ completed              {completes} done, {skipped} skipped" in done.stdout
    assert f"researcher             agent done: {calls} model calls" in done.stdout
    assert "turns" not in done.stdout


def _blocked_run(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    flow = tmp_path / "slow.json"
    flow.write_text(json.dumps({"name": "slow", "nodes": [
        {"id": "work", "type": "python", "input": {"function": "block_first_run"}},
        {"id": "after", "type": "noop", "input": {}}], "edges": [{"from": "work", "to": "after"}]}))
    proc = subprocess.Popen([sys.executable, "-m", "flowkernel.cli", "--plugin", "tests.plugins.waiters", "run",
                             str(flow), "--json"], cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    run_id = run_id_once_a_node_started(proc)
    if run_id is None:
        raise AssertionError("the run ended before its node started")
    return proc, run_id


def _node_line(show: str, node: str) -> str:
    return next(line for line in show.splitlines() if line.split()[1:2] == [node])


def test_a_paused_run_shows_its_stopped_node_as_interrupted(tmp_path: Path, clean_env: dict[str, str]) -> None:
    proc, run_id = _blocked_run(tmp_path, clean_env)
    try:
        assert fk("pause", run_id, cwd=tmp_path, env=clean_env).returncode == 0
        assert proc.wait(timeout=30) == 3
    finally:
        proc.kill()
    show = fk("show", run_id, cwd=tmp_path, env=clean_env).stdout
    assert "status   paused" in show
    assert _node_line(show, "work").split()[0] == "interrupted"
    assert _node_line(show, "after").split()[0] == "pending"


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_a_run_whose_process_died_is_interrupted_not_running(how: int, tmp_path: Path,
                                                            clean_env: dict[str, str]) -> None:
    proc, run_id = _blocked_run(tmp_path, clean_env)
    try:
        os.kill(proc.pid, how)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    listed = fk("runs", cwd=tmp_path, env=clean_env).stdout.splitlines()
    assert listed[1].split()[:3] == [run_id, "slow", "interrupted"]
    [row] = [json.loads(line) for line in fk("runs", "--json", cwd=tmp_path, env=clean_env).stdout.splitlines()]
    assert row["status"] == "interrupted"
    assert fk("runs", "--status", "running", cwd=tmp_path, env=clean_env).stdout == "no runs\n"
    assert run_id in fk("runs", "--status", "interrupted", cwd=tmp_path, env=clean_env).stdout
    show = fk("show", run_id, cwd=tmp_path, env=clean_env).stdout
    assert f"status   interrupted (stored as running; no process executes it: flowkernel resume {run_id})" in show
    assert _node_line(show, "work").split()[0] == "interrupted"
    again = fk("--plugin", "tests.plugins.waiters", "resume", run_id, cwd=tmp_path, env=clean_env)
    assert again.returncode == 0, again.stderr
    assert fk("runs", "--json", cwd=tmp_path, env=clean_env).stdout.count('"status": "completed"') == 1


# -- 12.6: a failed python node keeps its traceback --------------------------------------------------

def test_a_failed_python_node_keeps_its_traceback_for_show(tmp_path: Path, clean_env: dict[str, str]) -> None:
    (tmp_path / "brittle.py").write_text(
        "from flowkernel.plugins.registry import register_function\n\n"
        "def parse(text):\n"
        "    return int(text)\n\n"
        "@register_function('flaky')\n"
        "def flaky(n: int) -> int:\n"
        "    if n == 1:\n"
        "        raise RuntimeError(f'flaky failed on {n}')\n"
        "    return parse('x')\n")
    flow = tmp_path / "f.json"
    flow.write_text(json.dumps({"name": "f", "nodes": [
        {"id": "one", "type": "python", "input": {"function": "flaky", "args": {"n": 1}}}], "edges": []}))
    run = fk("--plugin", "brittle", "run", str(flow), cwd=tmp_path, env=clean_env)
    assert run.returncode == 1
    assert "Traceback" not in run.stdout + run.stderr  # not in the live view
    assert "RuntimeError: flaky failed on 1" in run.stdout
    run_id = run.stdout.split("run ", 1)[1].split()[0]
    [error] = [e for e in _events(run_id, tmp_path, clean_env) if e["type"] == "node:error"]
    trace = error["details"]["traceback"]
    assert trace.startswith("Traceback (most recent call last):")
    assert "brittle.py\", line 9, in flaky" in trace and trace.rstrip().endswith("RuntimeError: flaky failed on 1")
    show = fk("show", run_id, cwd=tmp_path, env=clean_env).stdout
    assert "RuntimeError: flaky failed on 1" in show and "brittle.py\", line 9, in flaky" in show


# -- 12.7: concurrent forEach items in the live view; show --full -------------------------------------

def test_concurrent_items_are_labelled_and_never_run_together(tmp_path: Path, clean_env: dict[str, str]) -> None:
    args = ("run", str(ROOT / "flows" / "fanout.json"), "--fixtures", str(ROOT / "fixtures" / "fanout"))
    as_json = fk(*args, "--json", cwd=tmp_path, env=clean_env)
    events = [json.loads(line) for line in as_json.stdout.splitlines()]
    item_of = {e["runId"]: e["item"] for e in events if e["type"] == "node:start" and e.get("item") is not None}
    texts: dict[int, str] = {}
    for e in events:
        if e["type"] == "agent:text:delta" and e["runId"] in item_of:
            texts[item_of[e["runId"]]] = texts.get(item_of[e["runId"]], "") + e["content"]
    assert len(texts) == 3
    view = fk(*args, cwd=tmp_path, env=clean_env).stdout
    for item, text in texts.items():
        assert f"│ describe[{item}] says: {text}\n" in view, view


def test_the_live_view_prints_interleaved_streams_one_at_a_time() -> None:
    from flowkernel.cli.live_view import LiveView
    from flowkernel.core.events import AgentTextDelta, AgentUsage, NodeStart

    out = io.StringIO()
    view = LiveView(out)
    for i, nr in enumerate(("nr_a", "nr_b")):
        view(NodeStart(nodeId="d", runId=nr, item=i, timestamp=1000))
    for nr, chunk in (("nr_a", "alpha "), ("nr_b", "beta "), ("nr_a", "one"), ("nr_b", "two")):
        view(AgentTextDelta(nodeId="d", runId=nr, content=chunk, timestamp=1001))
    view(AgentUsage(nodeId="d", runId="nr_b", model="m", timestamp=1002))
    view(AgentUsage(nodeId="d", runId="nr_a", model="m", timestamp=1003))
    lines = out.getvalue().splitlines()
    assert lines[2].endswith("│ d[0] says: alpha one") and lines[3].endswith("│ d[1] says: beta two")
    assert len(lines) == 4


def test_show_full_prints_values_whole(tmp_path: Path, clean_env: dict[str, str]) -> None:
    run_id, _ = _approval(tmp_path, clean_env)
    stored = _events(run_id, tmp_path, clean_env)
    output = next(e["output"] for e in stored if e["type"] == "node:complete" and e["nodeId"] == "drafter")
    prompt = next(e["prompt"] for e in stored if e["type"] == "node:waiting")
    assert len(prompt) > 80 and "\n" in prompt
    cut = fk("show", run_id, cwd=tmp_path, env=clean_env).stdout
    assert prompt not in cut and prompt.replace("\n", "\n    ") not in cut and "…" in cut
    full = fk("show", run_id, "--full", cwd=tmp_path, env=clean_env).stdout
    assert prompt.replace("\n", "\n    ") in full
    assert json.dumps(output, ensure_ascii=False, indent=2).replace("\n", "\n" + " " * 12) in full
    messages = fk("show", run_id, "--messages", cwd=tmp_path, env=clean_env).stdout
    whole = fk("show", run_id, "--messages", "--full", cwd=tmp_path, env=clean_env).stdout
    system = "You write short, plain product announcements."
    assert f'"text": "{output["text"]}"' in whole and len(whole) > len(messages) and system in whole
