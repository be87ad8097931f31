"""The Claude Code CLI under a supervisor that takes its whole process tree down with it (Linux).

Run as a script (``python cli_supervisor.py ARGS…``, the real CLI in ``FLOWKERNEL_CC_CLI``) in place of
the CLI: the SDK's pipes pass straight through. The SDK alone stops only the CLI's own pid, and a
Bash tool's shell runs in a session of its own; a worker killed with SIGKILL would leave the CLI
running the session on its own. Here:

- ``PR_SET_PDEATHSIG(SIGTERM)``: the death of the process that started the supervisor (even by
  SIGKILL) stops it;
- ``PR_SET_CHILD_SUBREAPER``: what the CLI leaves orphaned is re-parented here, so it is still found;
- on SIGTERM/SIGINT: SIGTERM to the CLI, a grace period, then SIGKILL to every descendant;
- when the CLI exits: whatever it left behind is killed, and the CLI's status is the supervisor's.

It imports nothing of flowkernel (it starts in a fresh interpreter for every session).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
GRACE_S = float(os.environ.get("FLOWKERNEL_CC_GRACE_S", "3"))


def descendants() -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError):
                pass
    found: list[int] = []
    frontier = [os.getpid()]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent:
                found.append(pid)
                frontier.append(pid)
    return found


def kill_all(sig: int) -> None:
    for pid in descendants():
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def main() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    parent = os.getppid()
    cli = subprocess.Popen([os.environ["FLOWKERNEL_CC_CLI"], *sys.argv[1:]])
    stopping = False

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        try:
            cli.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and cli.poll() is None:
            time.sleep(0.05)
        kill_all(signal.SIGKILL)
        reap()
        os._exit(143)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if os.getppid() != parent:  # the parent died before the death signal was armed
        on_term(signal.SIGTERM, None)
    code = cli.wait()
    if descendants():  # what the CLI left (re-parented here by now): a moment to end, then killed
        kill_all(signal.SIGTERM)
        time.sleep(0.1)
        kill_all(signal.SIGKILL)
    reap()
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
