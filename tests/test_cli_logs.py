"""Logs an operator can read: a worker says, one line each, which runs it claims and how each ended
here; ``serve`` logs one access line per request, never a token, a query value or a body; and
``--log-level`` (before or after the command) sets what is logged."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from flowkernel.run.kernel import Kernel

import tests.plugins.waiters  # noqa: F401 (its functions, known here too: queuing a flow validates it)

CLI = [sys.executable, "-m", "flowkernel"]
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARNING|ERROR) flowkernel\.[\w.]+: .+$")


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def enqueue(db: Path, doc: dict[str, object]) -> str:
    kernel = Kernel(str(db))
    try:
        return kernel.enqueue(kernel.compile(doc), {})
    finally:
        kernel.close()


def status(db: Path, run_id: str) -> str:
    kernel = Kernel(str(db))
    try:
        return kernel.store.get_run(run_id).status
    finally:
        kernel.close()


def worker(db: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, "worker", "--db", str(db), *args], cwd=db.parent, env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def stopped(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def logged(err: str) -> list[str]:
    lines = [line for line in err.splitlines() if " flowkernel." in line]
    assert all(LINE.match(line) for line in lines), lines
    return lines


def test_a_worker_logs_each_run_it_claims_and_how_each_ended(tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = tmp_path / "runs.db"
    ok = enqueue(db, {"name": "fine", "nodes": [{"id": "a", "type": "noop"}]})
    bad = enqueue(db, {"name": "broken", "nodes": [{"id": "a", "type": "transform",
                                                    "input": {"expr": "$number('x')"}}]})
    proc = worker(db, clean_env)
    try:
        wait_for(lambda: status(db, ok) == "completed" and status(db, bad) == "failed", "the worker to run both")
    finally:
        err = stopped(proc)
    lines = logged(err)
    assert any(line.endswith(f"INFO flowkernel.worker: claimed {ok} (queued)") for line in lines), err
    assert any(re.search(rf"INFO flowkernel\.worker: {ok} completed after \d+\.\d\d s$", line) for line in lines), err
    assert any(f"WARNING flowkernel.worker: {bad} failed after" in line and "node 'a' failed" in line
               for line in lines), err
    assert len([line for line in lines if ok in line]) == 2  # one line per event


def test_log_level_warning_leaves_out_the_routine_lines_given_before_or_after_the_command(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = tmp_path / "runs.db"
    for where in ("before", "after"):
        run_id = enqueue(db, {"name": "fine", "nodes": [{"id": "a", "type": "noop"}]})
        args = ["--log-level", "warning"]
        proc = subprocess.Popen([*CLI, *(args if where == "before" else []), "worker", "--db", str(db),
                                 *(args if where == "after" else [])], cwd=tmp_path, env=clean_env, text=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for(lambda run_id=run_id: status(db, run_id) == "completed", "the worker to run it")
        finally:
            err = stopped(proc)
        assert run_id not in err and "flowkernel.worker" not in err, err


def test_a_worker_stopped_mid_run_logs_that_it_handed_the_run_over(tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = tmp_path / "runs.db"
    gate = tmp_path / "never"
    run_id = enqueue(db, {"name": "held", "nodes": [
        {"id": "a", "type": "python", "input": {"function": "wait_for_file", "args": {"path": str(gate)}}}]})
    proc = worker(db, clean_env, "--plugin", "tests.plugins.waiters", "--grace-s", "0.1")
    try:
        wait_for(lambda: status(db, run_id) == "running", "the worker to start it")
    finally:
        err = stopped(proc)
    assert any(re.search(rf"INFO flowkernel\.worker: handed {run_id} over after .* \(stopping\)$", line)
               for line in logged(err)), err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_serve_logs_one_access_line_per_request_without_the_token_query_values_or_body(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    token = "tok-SECRET-4f2a"
    port = free_port()
    proc = subprocess.Popen([*CLI, "serve", "--port", str(port), "--db", str(tmp_path / "runs.db"),
                             "--workers", "0"], cwd=tmp_path, env=clean_env | {"FLOWKERNEL_API_TOKEN": token},
                            text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}/api/v1"

        def answering() -> bool:
            try:
                return httpx.get(f"{base}/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(answering, "serve to answer")
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{base}/runs", params={"limit": 5, "status": "cursor-SECRET"}, headers=auth).status_code == 400
        assert httpx.get(f"{base}/runs", headers={"Authorization": "Bearer wrong-SECRET"}).status_code == 401
        created = httpx.post(f"{base}/runs", headers=auth, json={
            "flowDocument": {"name": "x", "nodes": [{"id": "a", "type": "noop"}]}, "input": {"pw": "body-SECRET"}})
        assert created.status_code == 201, created.text
    finally:
        err = stopped(proc)
    access = [line for line in logged(err) if "flowkernel.server.access" in line]
    assert [line.split("flowkernel.server.access: ", 1)[1].rsplit(" ", 2)[0] for line in access] == [
        "127.0.0.1 GET /api/v1/health 200",
        "127.0.0.1 GET /api/v1/runs?limit=…&status=… 400",
        "127.0.0.1 GET /api/v1/runs 401",
        "127.0.0.1 POST /api/v1/runs 201",
    ], err
    assert all(re.search(r" \d+ ms$", line) for line in access), access
    assert "SECRET" not in err and json.dumps(token) not in err
