"""Runs remember how they were started (fixtures directory, plugin modules), so the commands the CLI
prints work as printed, from another process and another directory; a setting that is gone refuses the
command before anything is recorded, naming it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import run_id_once_a_node_started

ROOT = Path(__file__).resolve().parent.parent
ANSWER = "Mostly record transactions."  # what the research fixtures recorded


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=120)


def as_printed(hint: str, answer: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a command the CLI printed, pasted into a shell, with the placeholder answered."""
    line = hint.replace("'ANSWER'", f"'{answer}'")
    script = f'flowkernel() {{ "{sys.executable}" -m flowkernel.cli "$@"; }}\n{line}'
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, text=True, capture_output=True, timeout=120)


def hint_of(stderr: str) -> str:
    match = re.search(r"waits for a reply: (flowkernel reply .*)$", stderr, re.M)
    assert match, stderr
    return match.group(1)


def plain_env(env: dict[str, str]) -> dict[str, str]:
    """No PYTHONPATH: only installed modules (and a plugin's own directory) import."""
    out = dict(env)
    out.pop("PYTHONPATH", None)
    return out


def events(run_id: str, db: Path, cwd: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    res = fk("events", run_id, "--json", "--db", str(db), cwd=cwd, env=env)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def test_the_printed_reply_works_as_printed_from_another_directory(tmp_path: Path, clean_env: dict[str, str]) -> None:
    env = plain_env(clean_env)
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    first = fk("--plugin", "flowkernel.examples.research_tools", "run", str(ROOT / "flows" / "research.json"),
               "--input", "question=Which database should our desktop app use?",
               "--fixtures", str(ROOT / "fixtures" / "research"), "--db", "runs.db", cwd=here, env=env)
    assert first.returncode == 3, first.stderr
    hint = hint_of(first.stderr)
    assert hint.endswith(f" --db {here / 'runs.db'}") and "--fixtures" not in hint and "--plugin" not in hint
    done = as_printed(hint, ANSWER, there, env)  # no --plugin, no --fixtures, another directory
    assert done.returncode == 0, done.stderr
    assert "■ completed" in done.stdout
    shown = json.loads(fk("show", hint.split()[2], "--json", "--db", str(here / "runs.db"), cwd=there,
                          env=env).stdout)
    assert shown["run"]["settings"] == {"fixtures": str(ROOT / "fixtures" / "research"),
                                        "plugins": ["flowkernel.examples.research_tools"]}
    readable = fk("show", hint.split()[2], "--db", str(here / "runs.db"), cwd=there, env=env).stdout
    assert f"settings --fixtures {ROOT / 'fixtures' / 'research'} --plugin flowkernel.examples.research_tools" \
        in readable


def test_a_fixtures_directory_that_is_gone_is_refused_before_the_reply_counts(tmp_path: Path,
                                                                              clean_env: dict[str, str]) -> None:
    fixtures = tmp_path / "fx"
    shutil.copytree(ROOT / "fixtures" / "approval", fixtures)
    db = tmp_path / "runs.db"
    first = fk("run", str(ROOT / "flows" / "approval.json"), "--input", "topic=dark mode in the settings page",
               "--fixtures", str(fixtures), "--db", str(db), cwd=tmp_path, env=clean_env)
    assert first.returncode == 3, first.stderr
    hint = hint_of(first.stderr)
    run_id, node_run = hint.split()[2], hint.split()[4]
    before = events(run_id, db, tmp_path, clean_env)
    moved = fixtures.rename(tmp_path / "moved")

    for refused in (fk("reply", run_id, "--to", node_run, "Mention that it ships on Friday.", "--db", str(db),
                       cwd=tmp_path, env=clean_env),
                    fk("resume", run_id, "--db", str(db), cwd=tmp_path, env=clean_env)):
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr == (f"flowkernel: run {run_id} serves its model calls from --fixtures {fixtures}, "
                                  "which is not a directory now; pass --fixtures DIR to use another one\n")
    assert events(run_id, db, tmp_path, clean_env) == before  # nothing recorded, not even a refusal

    again = fk("reply", run_id, "--to", node_run, "Mention that it ships on Friday.", "--fixtures", str(moved),
               "--db", str(db), cwd=tmp_path, env=clean_env)
    assert again.returncode == 3, again.stderr  # revised, and waiting for the next reply
    last = fk("reply", run_id, "--to", "review", "approve", "--db", str(db), cwd=tmp_path, env=clean_env)
    assert last.returncode == 0, last.stderr  # the override was kept for the run
    shown = json.loads(fk("show", run_id, "--json", "--db", str(db), cwd=tmp_path, env=clean_env).stdout)
    assert shown["run"]["settings"] == {"fixtures": str(moved)}
    assert shown["snapshot"]["status"] == "completed"


def test_a_plugin_that_does_not_import_here_is_named_and_nothing_is_recorded(tmp_path: Path,
                                                                            clean_env: dict[str, str]) -> None:
    env = plain_env(clean_env)
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "myplug.py").write_text(
        "from flowkernel.plugins.registry import register_function\n\n"
        "@register_function('excite')\n"
        "def excite(text: str) -> str:\n"
        "    return text + '!'\n")
    flow = project / "ask.json"
    flow.write_text(json.dumps({"name": "ask", "nodes": [
        {"id": "ask", "type": "human.input", "input": {"prompt": "Say something"}},
        {"id": "loud", "type": "python", "input": {"function": "excite", "args": {"text": "{{ ask }}"}}}],
        "edges": [{"from": "ask", "to": "loud"}]}))
    db = tmp_path / "runs.db"
    first = fk("--plugin", "myplug", "run", str(flow), "--db", str(db), cwd=project, env=env)
    assert first.returncode == 3, first.stderr
    run_id = hint_of(first.stderr).split()[2]
    before = events(run_id, db, project, env)

    refused = fk("reply", run_id, "--to", "ask", "hi", "--db", str(db), cwd=elsewhere, env=env)
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"flowkernel: run {run_id} was started with --plugin myplug, which cannot be "
                                     "imported here")
    assert refused.stderr.count("\n") == 1
    assert events(run_id, db, project, env) == before

    done = fk("reply", run_id, "--to", "ask", "hi", "--db", str(db), "--json", cwd=project, env=env)
    assert done.returncode == 0, done.stderr  # no --plugin: the run remembers it
    outputs = [e["output"] for e in map(json.loads, done.stdout.splitlines())
               if e["type"] == "node:complete" and e["nodeId"] == "loud"]
    assert outputs == ["hi!"]


def test_ctrl_c_names_the_run_it_interrupted(tmp_path: Path, clean_env: dict[str, str]) -> None:
    flow = tmp_path / "slow.json"
    flow.write_text(json.dumps({"name": "slow", "nodes": [
        {"id": "work", "type": "python", "input": {"function": "block_first_run"}}], "edges": []}))
    proc = subprocess.Popen([sys.executable, "-m", "flowkernel.cli", "--plugin", "tests.plugins.waiters", "run",
                             str(flow), "--json", "--db", "r.db"], cwd=tmp_path, env=clean_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        run_id = ""
        for line in proc.stdout:
            event = json.loads(line)
            run_id = run_id or event["flowRunId"]
            if event["type"] == "node:start":
                break
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 1
        stderr = proc.stderr.read()
    finally:
        proc.kill()
    assert stderr.endswith(f"flowkernel: interrupted; continue the run with: flowkernel resume {run_id} "
                           f"--db {tmp_path / 'r.db'}\n"), stderr
    resumed = fk("--plugin", "tests.plugins.waiters", "resume", run_id, "--db", "r.db", cwd=tmp_path, env=clean_env)
    assert resumed.returncode == 0, resumed.stderr


def _hint(stderr: str, pattern: str) -> str:
    match = re.search(pattern + r"(flowkernel (?:resume|retry) \S+ --db \S+)$", stderr, re.M)
    assert match, stderr
    return match.group(1)


def test_the_printed_resume_and_retry_hints_work_as_printed_from_another_directory(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    """paused → resume, failed → retry, Ctrl-C → resume: each copied as printed, without the plugin that
    defines the node's function, run from another directory."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    (here / "blocked.json").write_text(json.dumps({"name": "blocked", "nodes": [
        {"id": "work", "type": "python", "input": {"function": "block_first_run"}}], "edges": []}))
    (here / "flaky.json").write_text(json.dumps({"name": "flaky", "nodes": [
        {"id": "b", "type": "python", "input": {"function": "fail_first_time",
                                                "args": {"marker": str(tmp_path / "failed-once")}}}]}))

    def started(plugin: str, flow: str) -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen([sys.executable, "-m", "flowkernel.cli", "--plugin", plugin, "run", flow,
                                 "--json", "--db", "r.db"], cwd=here, env=clean_env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        run_id = run_id_once_a_node_started(proc)
        if run_id is None:
            raise AssertionError(proc.communicate())
        return proc, run_id

    # paused from another process: the run's own process prints how to continue it
    proc, run_id = started("tests.plugins.waiters", "blocked.json")
    try:
        assert fk("pause", run_id, "--db", "r.db", cwd=here, env=clean_env).returncode == 0
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 3, stderr
    finally:
        proc.kill()
    done = as_printed(_hint(stderr, r"paused; continue with: "), "", there, clean_env)
    assert done.returncode == 0, done.stderr
    assert "■ completed" in done.stdout

    # Ctrl-C
    proc, run_id = started("tests.plugins.waiters", "blocked.json")
    try:
        os.kill(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    done = as_printed(_hint(stderr, r"interrupted; continue the run with: "), "", there, clean_env)
    assert done.returncode == 0, done.stderr

    # failed
    failed = fk("--plugin", "tests.plugins.extras", "run", "flaky.json", "--db", "r.db", cwd=here, env=clean_env)
    assert failed.returncode == 1, failed.stderr
    done = as_printed(_hint(failed.stderr, r"re-run its failed nodes with: "), "", there, clean_env)
    assert done.returncode == 0, done.stderr
    assert "■ completed" in done.stdout


def test_a_worker_executes_a_queued_run_with_the_plugins_it_was_queued_with(tmp_path: Path,
                                                                             clean_env: dict[str, str]) -> None:
    """The worker is given no --plugin: the run's own (remembered at `run --queue`) are imported."""
    flow = tmp_path / "plug.json"
    flow.write_text(json.dumps({"name": "plug", "nodes": [
        {"id": "s", "type": "python", "input": {"function": "shout", "args": {"text": "hi"}}}]}))
    db = tmp_path / "runs.db"
    queued = fk("--plugin", "tests.plugins.extras", "run", str(flow), "--queue", "--db", str(db), cwd=tmp_path,
                env=clean_env)
    assert queued.returncode == 0, queued.stderr
    run_id = queued.stdout.strip()
    worker = subprocess.Popen([sys.executable, "-m", "flowkernel", "worker", "--db", str(db)], cwd=tmp_path,
                              env=clean_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        followed = fk("events", run_id, "--follow", "--json", "--db", str(db), cwd=tmp_path, env=clean_env)
    finally:
        worker.terminate()
        _, worker_log = worker.communicate(timeout=60)
    assert followed.returncode == 0, followed.stderr + worker_log
    done = [e for e in map(json.loads, followed.stdout.splitlines()) if e["type"] == "node:complete"]
    assert [e["output"] for e in done] == ["HI!"], worker_log
