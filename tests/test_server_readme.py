"""The README's HTTP API examples work when copied: the shell block runs as it is in bash (on a free
port and a fresh database), and the httpx block runs against a `flowkernel serve` started as it shows."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.server_support import wait_for

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def readme_block(language: str) -> str:
    text = README.read_text(encoding="utf-8")
    found = re.findall(rf"^<!-- tested: tests/test_server_readme\.py[^\n]*-->\n```{language}\n(.*?)^```", text,
                       re.S | re.M)
    assert len(found) == 1, f"one tested {language} block in the README"
    return str(found[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def env() -> dict[str, str]:
    out = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    out["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{out.get('PATH', '')}"  # the `flowkernel` script
    for name in ("FLOWKERNEL_API_TOKEN", "FLOWKERNEL_DB", "ANTHROPIC_API_KEY"):
        out.pop(name, None)
    return out


@pytest.mark.skipif(shutil.which("jq") is None or shutil.which("curl") is None, reason="needs curl and jq")
def test_the_readme_shell_example_starts_follows_and_replies(tmp_path: Path) -> None:
    port = free_port()
    script = readme_block("sh").replace("8765", str(port)).replace("runs.db", str(tmp_path / "runs.db"))
    assert f"--port {port}" in script, "the server and the requests use the same port"
    # The script stops its server itself; if it fails first, the trap does.
    script = "trap 'kill $SERVE 2>/dev/null || true' EXIT\n" + script + "wait $SERVE\n"
    shell = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", script], cwd=str(ROOT), env=env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = shell.communicate(timeout=180)
    finally:
        if shell.poll() is None:  # stuck: end the script and the server it started (its own session)
            os.killpg(shell.pid, signal.SIGTERM)
            shell.communicate(timeout=60)
    done = subprocess.CompletedProcess(shell.args, shell.returncode, out, err)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any("dark mode" in line.lower() for line in lines), done.stdout  # the draft it waits on
    assert '{"accepted":true' in done.stdout
    events = [line for line in lines if line.startswith("event: ")]
    assert events[0] == "event: flow:start" and events[-1] == "event: flow:complete", events
    assert "event: command:received" in events
    assert "Traceback" not in done.stderr


def test_the_readme_httpx_example_runs_against_serve(tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(["flowkernel", "serve", "--port", str(port), "--db", str(tmp_path / "runs.db"),
                                "--flows", "flows", "--fixtures", "fixtures"], cwd=str(ROOT), env=env(),
                               stderr=subprocess.PIPE, text=True)
    try:
        def answering() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(answering, what="serve to answer")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(readme_block("python").replace("8765", str(port)), str(README), "exec"), {})
        assert out.getvalue().startswith('{"type":"flow:complete"') and '"status":"completed"' in out.getvalue()
    finally:
        process.terminate()
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0 and "Traceback" not in err, err
