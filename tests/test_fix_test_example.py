"""The shipped ``fix-test`` example: a ``claude.code`` node fixes a failing test in a small project the
example writes out, a ``python`` node runs the tests, a loop edge goes back until they pass. It runs
offline from its recorded session, as ``flowkernel examples`` lists it, from a copied-out folder: the
replay makes the recorded session's edit, so the second test run passes."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "flowkernel.cli"]


def fk(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def test_fix_test_runs_offline_from_its_fixtures_and_the_second_test_run_passes(
        clean_env: dict[str, str], tmp_path: Path) -> None:
    clean_env.pop("ANTHROPIC_API_KEY", None)
    clean_env["ANTHROPIC_BASE_URL"] = "http://127.0.0.1:9"  # nothing listens: a real call would fail
    listed = fk(clean_env, tmp_path, "examples", "--json")
    assert listed.returncode == 0, listed.stderr
    [example] = [json.loads(line) for line in listed.stdout.splitlines() if json.loads(line)["name"] == "fix-test"]
    assert example["plugins"] == ["flowkernel.examples.fix_test_tools"]
    assert example["fixtures"] == "fixtures/fix-test" and example["flow"] == "flows/fix-test.json"

    copied = fk(clean_env, tmp_path, "examples", "copy", str(tmp_path / "ex"))
    assert copied.returncode == 0, copied.stderr
    command = shlex.split(example["command"])
    assert command[0] == "flowkernel"
    done = fk(clean_env, tmp_path / "ex", *command[1:], "--json", "--db", str(tmp_path / "runs.db"))
    assert done.returncode == 0, done.stderr + done.stdout
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    tests = [e["output"] for e in events if e["type"] == "node:complete" and e["nodeId"] == "tests"]
    assert [t["passed"] for t in tests] == [False, True]
    assert "AssertionError: -1 != 5" in tests[0]["report"]
    tools = [e["toolName"] for e in events if e["type"] == "agent:tool"]
    assert tools == ["Read", "Edit", "Bash"]
    assert events[-1]["type"] == "flow:complete" and events[-1]["status"] == "completed"
