"""The supervisor the Claude Code CLI runs under (``flowkernel/agents/cli_supervisor.py``).

WHEN the CLI exits and leaves a process behind (a tool's shell runs in a session of its own) THEN the
supervisor kills it before exiting, and exits with the CLI's status; WHEN the CLI leaves nothing THEN
the supervisor exits with the CLI's status too (it no longer waits for leftovers that are not there)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from flowkernel.agents.claude_sdk import SUPERVISOR


def _with_token(token: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline:
                found.append(int(entry))
    return found


def _supervise(cli: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SUPERVISOR)], env={**os.environ, "FLOWKERNEL_CC_CLI": str(cli)},
                          capture_output=True, text=True, timeout=30)


def test_what_the_cli_leaves_behind_is_killed_when_it_exits(tmp_path: Path) -> None:
    token = f"{1000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"
    cli = tmp_path / "cli"
    cli.write_text(f"#!/bin/sh\nsetsid sleep {token} &\necho started\nexit 7\n")
    cli.chmod(0o755)
    done = _supervise(cli)
    assert done.returncode == 7 and done.stdout == "started\n", done.stderr
    deadline = time.monotonic() + 5
    while _with_token(token) and time.monotonic() < deadline:  # a killed process takes a moment to go
        time.sleep(0.05)
    assert _with_token(token) == []


def test_a_cli_that_leaves_nothing_behind_gives_its_status(tmp_path: Path) -> None:
    cli = tmp_path / "cli"
    cli.write_text("#!/bin/sh\necho done\nexit 3\n")
    cli.chmod(0o755)
    done = _supervise(cli)
    assert done.returncode == 3 and done.stdout == "done\n", done.stderr
