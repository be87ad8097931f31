"""A private mount namespace for tests: a small tmpfs that really fills up, or a read-only bind mount.

Made with ``unshare --user --map-root-user --mount`` (no root needed where the kernel allows user
namespaces) and entered with ``nsenter``, so the CLI runs as a user would run it, against a real
"No space left on device" or "Read-only file system" from the kernel. Only commands started through
``MountNamespace.command`` see the mounts; everything else sees the plain directory underneath.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


class MountNamespace:
    """A mount namespace kept alive by an idle process; ``command`` runs a command inside it."""

    def __init__(self) -> None:
        if not (shutil.which("unshare") and shutil.which("nsenter")):
            pytest.skip("needs unshare and nsenter (util-linux)")
        # unshare execs the shell, which execs sleep: the process we hold is the namespace's anchor.
        self._anchor = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "echo ready && exec sleep 3600"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self._anchor.stdout is not None
        if self._anchor.stdout.readline().strip() != "ready":
            _, err = self._anchor.communicate(timeout=10)
            pytest.skip(f"user namespaces are not available here: {err.strip()}")

    def command(self, *args: str) -> list[str]:
        """``args`` as a command that runs inside the namespace (use absolute paths: the working
        directory inside is ``/``)."""
        return ["nsenter", "-t", str(self._anchor.pid), "--user", "--mount", "--preserve-credentials", *args]

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args), text=True, capture_output=True, timeout=60, check=False, env=env)

    def tmpfs(self, where: Path, size_bytes: int) -> None:
        """Mount a tmpfs of ``size_bytes`` on the (existing, empty) folder ``where``."""
        self._mount("-t", "tmpfs", "-o", f"size={size_bytes}", "none", str(where))

    def read_only(self, where: Path) -> None:
        """Make the folder ``where`` a read-only mount of itself."""
        self._mount("--bind", str(where), str(where))
        self._mount("-o", "remount,ro,bind", str(where))

    def _mount(self, *args: str) -> None:
        done = self.run("mount", *args)
        if done.returncode != 0:
            self.close()
            pytest.skip(f"cannot mount in a user namespace here: {done.stderr.strip()}")

    def flowkernel(self, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """The CLI inside the namespace."""
        return self.run(sys.executable, "-m", "flowkernel.cli", *args, env=env)

    def close(self) -> None:
        if self._anchor.poll() is None:
            self._anchor.kill()
        self._anchor.communicate(timeout=10)
