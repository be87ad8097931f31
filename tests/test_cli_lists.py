"""Lists never hide rows: ``runs`` says how many it left out and the command that lists them, and
``workers --json`` gives every worker every field, an idle one's empty ``runs`` included."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flowkernel.run.kernel import Kernel
from flowkernel.store.open import open_store

from tests.test_postgres import needs_pg, pg_url  # noqa: F401 (pg_url is a fixture)

CLI = [sys.executable, "-m", "flowkernel"]


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=60)


def queue_runs(db: Path, n: int) -> None:
    kernel = Kernel(str(db))
    try:
        flow = kernel.compile({"name": "queued", "nodes": [{"id": "a", "type": "noop"}]})
        for _ in range(n):
            kernel.enqueue(flow, {})
    finally:
        kernel.close()


def test_runs_says_how_many_it_left_out_and_the_command_it_prints_lists_them_all(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = tmp_path / "runs.db"
    queue_runs(db, 53)
    listed = fk("runs", "--db", str(db), cwd=tmp_path, env=clean_env)
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == 1 + 50  # the header and the 50 newest
    assert listed.stderr.startswith("flowkernel: … 3 more runs not listed; all of them: "), listed.stderr
    command = shlex.split(listed.stderr.split("all of them: ", 1)[1])
    assert command[0] == "flowkernel"
    everything = subprocess.run([*CLI, *command[1:]], cwd=tmp_path, env=clean_env, text=True,
                                capture_output=True, timeout=60)
    assert everything.returncode == 0 and everything.stderr == "", everything.stderr
    assert len(everything.stdout.splitlines()) == 1 + 53

    # Filters and --json are kept in the command; the JSON lines stay on stdout, the note on stderr.
    page = fk("runs", "--status", "queued", "--limit", "52", "--json", "--db", str(db), cwd=tmp_path, env=clean_env)
    assert len([json.loads(line) for line in page.stdout.splitlines()]) == 52
    assert f"1 more run not listed; all of them: flowkernel runs --status queued --limit 53 --json --db {db}" \
        in page.stderr, page.stderr
    help_text = " ".join(fk("runs", "--help", cwd=tmp_path, env=clean_env).stdout.split())
    assert "--limit N list the N newest (default 50)" in help_text, help_text


@pytest.mark.parametrize("kind", ["memory", "sqlite", pytest.param("postgres", marks=needs_pg)])
def test_every_store_counts_the_runs_a_page_leaves_out(kind: str, tmp_path: Path,
                                                       request: pytest.FixtureRequest) -> None:
    url = {"memory": "memory", "sqlite": str(tmp_path / "runs.db")}.get(kind) or request.getfixturevalue("pg_url")
    kernel = Kernel(open_store(url, create=True))
    try:
        flow = kernel.compile({"name": "counted", "nodes": [{"id": "a", "type": "noop"}]})
        other = kernel.compile({"name": "other", "nodes": [{"id": "a", "type": "noop"}]})
        for _ in range(5):
            kernel.enqueue(flow, {})
        kernel.enqueue(other, {})
        records, key = kernel.run_records(flow="counted", limit=2)
        assert len(records) == 2 and key is not None
        assert kernel.count_runs(flow="counted", before=key) == 3
        assert kernel.count_runs(status="queued") == 6 and kernel.count_runs(status="completed") == 0
        assert kernel.count_runs(status="running") == 0  # told apart by leases: counted by paging
    finally:
        kernel.close()


def test_workers_json_lists_an_idle_workers_runs_as_an_empty_list(tmp_path: Path, clean_env: dict[str, str]) -> None:
    db = str(tmp_path / "runs.db")
    worker = subprocess.Popen([*CLI, "worker", "--db", db], cwd=tmp_path, env=clean_env, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        rows: list[dict[str, object]] = []
        while not rows:  # until the worker has registered
            assert time.monotonic() < deadline and worker.poll() is None, "the worker did not register"
            shown = fk("workers", "--db", db, "--json", cwd=tmp_path, env=clean_env)
            rows = [json.loads(line) for line in shown.stdout.splitlines()]
            time.sleep(0.05)
        assert [(row["pid"], row["runs"]) for row in rows] == [(worker.pid, [])]
        assert {"workerId", "host", "startedAt", "heartbeatAt", "concurrency", "leaseMs"} <= set(rows[0])
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=30)
