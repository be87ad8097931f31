"""Runs a worker cannot execute, and a store it cannot reach: never claimed again and again.

WHEN a queued run needs what the worker cannot provide (a plugin module kept with the run that does
not import there) THEN the run ends ``failed`` at once, saying why and what continues it, the worker
says so in one line and goes on; once a worker can provide it, ``retry`` completes the run.
WHEN the store is unreachable THEN the worker tries again less and less often, and carries on when
it is back.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flowkernel.plugins.registry import load_plugins
from flowkernel.run.kernel import Kernel
from flowkernel.run.settings import RunSettings
from flowkernel.store.open import open_store

from tests.proxy import CuttableProxy
from tests.test_postgres import needs_pg, pg_url  # noqa: F401 (pg_url is a fixture)
from tests.test_store_faults import _pg_target, _via
from tests.test_workers_cli import db_url, wait_for  # noqa: F401 (db_url is a fixture)

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = '''
from flowkernel.plugins.registry import register_function


@register_function("elsewhere.shout")
def shout(text: str) -> str:
    return text.upper()
'''
FLOW = {"name": "needs-plugin",
        "nodes": [{"id": "a", "type": "python", "input": {"function": "elsewhere.shout", "args": {"text": "hi"}}}]}


def _worker(db: str, env: dict[str, str], log: Path, cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    with open(log, "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "flowkernel", "worker", "--db", db], cwd=cwd, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_queued_run_whose_plugin_does_not_import_on_the_worker_fails_once_saying_why_and_retry_completes_it(
        db_url: str, clean_env: dict[str, str], tmp_path: Path,  # noqa: F811 (db_url is a fixture)
        monkeypatch: pytest.MonkeyPatch) -> None:
    plugins = tmp_path / "project"
    plugins.mkdir()
    (plugins / "elsewhere_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(plugins))  # this process imports it (queuing validates the flow)
    load_plugins(["elsewhere_plugin"])
    kernel = Kernel(open_store(db_url), settings=RunSettings.of(plugins=["elsewhere_plugin"]))
    stranded = kernel.enqueue(kernel.compile(FLOW), {})
    fine = Kernel(open_store(db_url))
    plain = fine.enqueue(fine.compile({"name": "plain", "nodes": [{"id": "only", "type": "noop", "input": {}}]}), {})

    log = tmp_path / "worker.log"
    worker = _worker(db_url, clean_env, log)  # its PYTHONPATH has no elsewhere_plugin
    try:
        wait_for(lambda: kernel.store.get_run(stranded).status == "failed", f"run {stranded} to fail: {log.read_text()}",
                 timeout_s=60)
        wait_for(lambda: kernel.store.get_run(plain).status == "completed", "the worker to go on with the next run",
                 timeout_s=60)
        # A window in which a worker that claims the run again and again would say so many times.
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            assert worker.poll() is None, log.read_text()
            time.sleep(0.05)
        # Claimed once (the claim is logged), and why it cannot run here said once.
        lines = [line for line in log.read_text().splitlines() if stranded in line]
        assert len([line for line in lines if f"claimed {stranded}" in line]) == 1, log.read_text()
        reported = [line for line in lines if f"claimed {stranded}" not in line]
        assert len(reported) == 1, log.read_text()
        assert "--plugin elsewhere_plugin" in reported[0] and "Traceback" not in log.read_text()
    finally:
        _stop(worker)

    record = kernel.store.get_run(stranded)
    assert record.leaseOwner is None
    events = kernel.events(stranded)
    assert [e.type for e in events] == ["flow:start", "flow:complete"]
    error = getattr(events[-1], "error", None) or ""
    assert getattr(events[-1], "status", None) == "failed" and error == record.error
    assert "cannot execute the run" in error and "--plugin elsewhere_plugin, which cannot be imported" in error
    assert f"flowkernel retry {stranded}" in error

    # Fixed: a worker where the module imports; the retry goes back to the pool and completes the run.
    env = dict(clean_env, PYTHONPATH=f"{plugins}:{clean_env['PYTHONPATH']}")
    log2 = tmp_path / "worker2.log"
    worker = _worker(db_url, env, log2)
    try:
        import anyio

        anyio.run(lambda: kernel.retry(stranded, queue=True))
        wait_for(lambda: kernel.store.get_run(stranded).status == "completed", f"the retried run: {log2.read_text()}",
                 timeout_s=60)
    finally:
        _stop(worker)
    assert kernel.snapshot(stranded).outputs["a"] == "HI"
    kernel.close()
    fine.close()


@needs_pg
def test_a_worker_whose_postgres_goes_away_retries_less_and_less_often_and_goes_on_when_it_is_back(
        pg_url: str, clean_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811 (pg_url is a fixture)
    kernel = Kernel(open_store(pg_url, create=True))
    proxy = CuttableProxy(_pg_target(pg_url))
    log = tmp_path / "worker.log"
    worker = _worker(_via(pg_url, proxy.port), clean_env, log)
    try:
        wait_for(lambda: any(w.pid == worker.pid for w in kernel.store.list_workers()),
                 f"the worker to register: {log.read_text()}", timeout_s=60)
        proxy.cut()
        wait_for(lambda: "cannot claim runs" in log.read_text(), f"the worker to meet the cut: {log.read_text()}",
                 timeout_s=30)
        before = log.read_text().count("cannot claim runs")
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            assert worker.poll() is None, log.read_text()
            time.sleep(0.05)
        text = log.read_text()
        # Polling every 250 ms would say it 12 times in 3 s; backing off from 100 ms, doubling, at most 5.
        assert text.count("cannot claim runs") - before <= 6, text
        assert text.count("lost the notification connection") == 1, text
        assert "Traceback" not in text
        run_id = kernel.enqueue(kernel.compile({"name": "after", "nodes": [{"id": "x", "type": "noop", "input": {}}]}),
                                {})
        proxy.restore()
        wait_for(lambda: kernel.store.get_run(run_id).status == "completed", f"the run after the store came back: "
                 f"{log.read_text()}", timeout_s=60)
    finally:
        _stop(worker)
        proxy.close()
        kernel.close()


class _Held:
    """A test's write transaction on a SQLite database: every other writer meets "database is locked"."""

    def __init__(self, path: str) -> None:
        import sqlite3

        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("BEGIN IMMEDIATE")

    def close(self) -> None:
        self.db.execute("ROLLBACK")
        self.db.close()


@pytest.mark.parametrize("command", [["worker"], ["serve", "--port", "0", "--workers", "2"]])
@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgres", marks=needs_pg)])
def test_a_store_that_fails_after_it_opened_ends_worker_and_serve_with_one_line_and_no_traceback(
        store: str, command: list[str], request: pytest.FixtureRequest, clean_env: dict[str, str],
        tmp_path: Path) -> None:
    """WHEN the store fails between being opened and the worker registering in it (a SQLite file another
    process holds locked; a PostgreSQL server that stops right then) THEN ``worker`` and ``serve`` say so in
    one line and exit 1, with no traceback (the task group that runs the worker wraps the error)."""
    env = dict(clean_env)
    held: _Held | None = None
    proxy: CuttableProxy | None = None
    if store == "sqlite":
        db = str(tmp_path / "runs.db")
        open_store(db, create=True).close()
        held = _Held(db)
        env["FLOWKERNEL_BUSY_TIMEOUT_MS"] = "200"
        expected = "database is locked"
    else:
        url = request.getfixturevalue("pg_url")
        open_store(url, create=True).close()
        # Each store object holds one connection (serve opens three), and the worker listens on one more:
        # the server stops before that last one.
        proxy = CuttableProxy(_pg_target(url), serve_only=1 if command == ["worker"] else 3)
        db = _via(url, proxy.port)
        expected = f"127.0.0.1:{proxy.port}"
    try:
        res = subprocess.run([sys.executable, "-m", "flowkernel", *command, "--db", db], cwd=tmp_path, env=env,
                             text=True, capture_output=True, timeout=120)
    finally:
        if held is not None:
            held.close()
        if proxy is not None:
            proxy.close()
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flowkernel: ") and expected in lines[0], res.stderr
