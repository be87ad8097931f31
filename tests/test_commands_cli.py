"""Commands across processes, as a user types them: every run and command is its own process."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "tests.plugins.waiters"


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", "--plugin", PLUGIN, *args], cwd=cwd, env=env,
                          text=True, capture_output=True, timeout=60)


def spawn(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "flowkernel.cli", "--plugin", PLUGIN, *args], cwd=cwd, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def events_until(stream: IO[str], predicate: Any) -> Iterator[dict[str, Any]]:
    for line in stream:
        event = json.loads(line)
        yield event
        if predicate(event):
            return
    raise AssertionError("the run ended before the expected event")


def write_flow(tmp_path: Path, name: str, nodes: list[dict[str, Any]], edges: list[dict[str, Any]] | None = None) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"name": name, "nodes": nodes, "edges": edges or []}))
    return str(path)


def test_waiting_run_survives_its_process_and_is_answered_from_a_new_one(tmp_path: Path,
                                                                        clean_env: dict[str, str]) -> None:
    flow = write_flow(tmp_path, "approve", [
        {"id": "ask", "type": "human.input", "input": {"prompt": "Ship it?", "schema": {"type": "boolean"}}},
        {"id": "result", "type": "transform", "input": {"expr": "ask ? 'shipped' : 'held'"}}],
        [{"from": "ask", "to": "result"}])
    run = fk("run", flow, "--json", cwd=tmp_path, env=clean_env)
    assert run.returncode == 3, run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines()]
    waiting = next(e for e in events if e["type"] == "node:waiting")
    assert waiting["prompt"] == "Ship it?"
    run_id = events[0]["flowRunId"]
    assert f"flowkernel reply {run_id} --to {waiting['runId']}" in run.stderr

    bad = fk("reply", run_id, "--to", waiting["runId"], "maybe", cwd=tmp_path, env=clean_env)
    assert bad.returncode == 2 and "does not match the schema" in bad.stderr
    missing = fk("send", run_id, "hello", cwd=tmp_path, env=clean_env)
    assert missing.returncode == 2 and "needs the node runId" in missing.stderr

    good = fk("reply", run_id, "--to", waiting["runId"], "true", cwd=tmp_path, env=clean_env)
    assert good.returncode == 0, good.stderr
    assert "■ completed" in good.stdout
    show = json.loads(fk("show", run_id, "--json", cwd=tmp_path, env=clean_env).stdout)["snapshot"]
    assert show["status"] == "completed" and show["outputs"]["result"] == "shipped"
    received = [e for e in json.loads("[" + ",".join(
        fk("events", run_id, "--json", cwd=tmp_path, env=clean_env).stdout.splitlines()) + "]")
        if e["type"] == "command:received"]
    assert [(e["command"], e["accepted"]) for e in received] == [("reply", False), ("send", False), ("reply", True)]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_command_from_another_process_reaches_the_executor_quickly_without_burning_a_core(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write_flow(tmp_path, "listen", [{"id": "listener", "type": "python", "input": {"function": "await_message"}}])
    proc = spawn("run", flow, "--json", "--db", str(tmp_path / "r.db"), cwd=tmp_path, env=clean_env)
    assert proc.stdout is not None
    try:
        seen = list(events_until(proc.stdout, lambda e: e["type"] == "node:start"))
        run_id, target = seen[0]["flowRunId"], seen[-1]["runId"]
        cpu_before, wall_before = _cpu_seconds(proc.pid), time.monotonic()
        time.sleep(1.0)  # measuring idle CPU over a second, not waiting for a result
        idle_share = (_cpu_seconds(proc.pid) - cpu_before) / (time.monotonic() - wall_before)
        assert idle_share < 0.2, f"an idle executor used {idle_share:.0%} of a core"

        sent = fk("send", run_id, "--to", target, "wake up", "--db", str(tmp_path / "r.db"), cwd=tmp_path,
                  env=clean_env)
        assert sent.returncode == 0, sent.stderr
        rest = list(events_until(proc.stdout, lambda e: e["type"] == "flow:complete"))
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
    received = next(e for e in rest if e["type"] == "command:received")
    done = next(e for e in rest if e["type"] == "node:complete")
    assert done["output"] == ["wake up"]
    db = sqlite3.connect(tmp_path / "r.db")
    [(created,)] = db.execute("SELECT created_at FROM commands WHERE run_id = ?", (run_id,)).fetchall()
    db.close()
    assert received["timestamp"] - created <= 250


def test_pause_from_another_process_then_resume_with_a_message(tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write_flow(tmp_path, "pausable", [
        {"id": "work", "type": "python", "input": {"function": "block_first_run"}},
        {"id": "after", "type": "noop", "input": {"got": "{{ work.inbox }}"}}], [{"from": "work", "to": "after"}])
    proc = spawn("run", flow, "--json", cwd=tmp_path, env=clean_env)
    assert proc.stdout is not None
    try:
        seen = list(events_until(proc.stdout, lambda e: e["type"] == "node:start"))
        run_id = seen[0]["flowRunId"]
        paused = fk("pause", run_id, cwd=tmp_path, env=clean_env)
        assert paused.returncode == 0, paused.stderr
        tail = [json.loads(line) for line in proc.stdout]
        assert proc.wait(timeout=10) == 3
    finally:
        proc.kill()
    assert [e["type"] for e in tail][-1] == "flow:paused"
    again = fk("resume", run_id, "--message", "please finish", "--json", cwd=tmp_path, env=clean_env)
    assert again.returncode == 0, again.stderr
    resumed = [json.loads(line) for line in again.stdout.splitlines()]
    assert [e["type"] for e in resumed].count("flow:resumed") == 1
    after = next(e for e in resumed if e["type"] == "node:complete" and e["nodeId"] == "after")
    assert after["output"] == {"got": ["please finish"]}
    refused = fk("resume", run_id, cwd=tmp_path, env=clean_env)
    assert refused.returncode == 2 and "completed" in refused.stderr


def test_sigkill_between_a_commands_acceptance_and_its_delivery_loses_nothing(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write_flow(tmp_path, "crashy", [{"id": "work", "type": "python", "input": {"function": "block_first_run"}}])
    proc = spawn("run", flow, "--json", cwd=tmp_path, env=clean_env)
    assert proc.stdout is not None
    try:
        seen = list(events_until(proc.stdout, lambda e: e["type"] == "node:start"))
        run_id, target = seen[0]["flowRunId"], seen[-1]["runId"]
        sent = fk("send", run_id, "--to", target, "do not lose me", cwd=tmp_path, env=clean_env)
        assert sent.returncode == 0, sent.stderr  # accepted and committed by the executor
        os.kill(proc.pid, signal.SIGKILL)  # before the node ever reads its inbox
        proc.wait(timeout=10)
    finally:
        proc.kill()
    resumed = fk("resume", run_id, "--json", cwd=tmp_path, env=clean_env)
    assert resumed.returncode == 0, resumed.stderr
    events = [json.loads(line) for line in resumed.stdout.splitlines()]
    done = next(e for e in events if e["type"] == "node:complete")
    assert done["output"]["inbox"] == ["do not lose me", "continue"]
    assert done["output"]["resumedFrom"] == target


@pytest.mark.parametrize("attempt", range(5))
def test_two_racing_resumers_exactly_one_executes(attempt: int, tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = write_flow(tmp_path, "race", [
        {"id": "slow", "type": "python",
         "input": {"function": "wait_for_file", "args": {"path": str(tmp_path / "gate"), "value": 1}}}])
    # A stored run that no process executes (as after a crash): both racers try to take it over.
    code = (
        "import anyio, json, sys\n"
        "from flowkernel.run.kernel import Kernel\n"
        "import tests.plugins.waiters\n"
        "k = Kernel(sys.argv[1])\n"
        "f = k.load_flow(sys.argv[2])\n"
        "print(k.create_run(f, {}))\n"
    )
    made = subprocess.run([sys.executable, "-c", code, str(tmp_path / "runs.db"), flow],
                          cwd=tmp_path, env=clean_env, text=True, capture_output=True, timeout=30)
    assert made.returncode == 0, made.stderr
    run_id = made.stdout.strip()
    racers = [spawn("resume", run_id, "--json", "--db", str(tmp_path / "runs.db"), cwd=tmp_path, env=clean_env)
              for _ in range(2)]
    # The winner's node holds until the gate opens, so the loser meets a run still being executed
    # however slowly either process starts; the gate opens once one racer has given up.
    deadline = time.monotonic() + 60
    while all(p.poll() is None for p in racers):
        assert time.monotonic() < deadline, "neither resumer gave up while the other held the run"
        time.sleep(0.02)
    (tmp_path / "gate").touch()
    results = [(p.wait(timeout=30), p.stdout.read() if p.stdout else "", p.stderr.read() if p.stderr else "")
               for p in racers]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 1], results
    assert attempt >= 0
    loser = next(r for r in results if r[0] != 0)
    assert "is being executed by" in loser[2], loser
    log = fk("events", run_id, "--json", "--db", str(tmp_path / "runs.db"), cwd=tmp_path, env=clean_env)
    stored = [json.loads(line) for line in log.stdout.splitlines()]
    assert [e["type"] for e in stored].count("node:complete") == 1
    assert [e["type"] for e in stored].count("flow:resumed") == 1
