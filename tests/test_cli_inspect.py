"""Looking at runs from the command line: `runs`, `show`, `events`, `replay`, as a user types them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
        "from flowkernel.api import Kernel\n"
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
