"""Store faults as a user meets them: a disk that fills up mid-run, a database on a read-only mount,
a database path that cannot exist. One line on stderr, never a traceback, nothing committed lost,
and the run recoverable once the fault is gone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mounts import MountNamespace
from tests.proxy import CuttableProxy
from tests.test_postgres import ENV_VAR, needs_pg, schema_url

BLOB = "x" * 100_000


def fk(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=60)


def growing_flow(tmp_path: Path) -> Path:
    """Ten loop iterations, each storing a new 100 kB output (no two alike, so none is stored once for
    all): about 2 MB of database in all."""
    path = tmp_path / "growing.json"
    path.write_text(json.dumps({"name": "growing", "nodes": [
        {"id": "make", "type": "noop", "input": {"blob": "{{ $count(state.n) }}" + BLOB}},
        {"id": "measure", "type": "transform", "input": {"expr": "$length(make.blob)"}},
        {"id": "count", "type": "state.set", "input": {"path": "n", "op": "append", "value": 1}}],
        "edges": [{"from": "make", "to": "measure"}, {"from": "measure", "to": "count"},
                  {"from": "count", "to": "make", "maxIterations": 9}]}))
    return path


def assert_one_line(stderr: str, *fragments: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def namespace() -> Iterator[MountNamespace]:
    ns = MountNamespace()
    try:
        yield ns
    finally:
        ns.close()


def test_disk_full_mid_run_is_one_line_and_the_run_finishes_on_resume_once_space_is_freed(
        tmp_path: Path, clean_env: dict[str, str], namespace: MountNamespace) -> None:
    # A real filesystem that runs out of space (a tmpfs), not a simulated error: SQLite sees ENOSPC.
    disk = tmp_path / "disk"
    disk.mkdir()
    namespace.tmpfs(disk, 8 * 1024 * 1024)
    filler = disk / "filler"
    assert namespace.run("dd", "if=/dev/zero", f"of={filler}", "bs=1024", f"count={8 * 1024 - 700}").returncode == 0
    db = str(disk / "runs.db")
    flow = str(growing_flow(tmp_path))

    run = namespace.flowkernel("run", flow, "--db", db, "--json", env=clean_env)
    assert run.returncode == 1
    assert_one_line(run.stderr, "database or disk is full", "flowkernel resume run_")
    shown = [json.loads(line) for line in run.stdout.splitlines()]
    run_id = shown[0]["flowRunId"]

    # Reading still works on the full disk; the run waits, as it was last saved, to be resumed.
    [record] = [json.loads(line) for line in namespace.flowkernel("runs", "--json", "--db", db,
                                                                     env=clean_env).stdout.splitlines()]
    assert record["status"] == "interrupted" and record["runId"] == run_id  # running, with no executor
    stored = [json.loads(line) for line in namespace.flowkernel("events", run_id, "--json", "--db", db,
                                                                 env=clean_env).stdout.splitlines()]
    assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    assert stored == shown  # every event the run showed was saved, and nothing else
    assert not any(e["type"] == "flow:complete" for e in stored)

    assert namespace.run("rm", str(filler)).returncode == 0
    resumed = namespace.flowkernel("resume", run_id, "--db", db, "--json", env=clean_env)
    assert resumed.returncode == 0, resumed.stderr
    show = json.loads(namespace.flowkernel("show", run_id, "--json", "--db", db, env=clean_env).stdout)
    assert show["snapshot"]["status"] == "completed"
    assert show["snapshot"]["outputs"]["measure"] == len(BLOB) + 1  # "9" + BLOB
    assert show["snapshot"]["loopCounters"] == {"count->make": 9} and show["snapshot"]["state"]["n"] == [1] * 10
    # Out of the namespace, for the replay audit every test gets.
    assert namespace.run("cp", db, str(tmp_path / "copy.db")).returncode == 0


@pytest.mark.parametrize("command", ["run", "runs"])
def test_a_database_path_under_a_file_is_a_one_line_error(command: str, tmp_path: Path,
                                                         clean_env: dict[str, str]) -> None:
    (tmp_path / "afile").write_text("not a folder")
    db = str(tmp_path / "afile" / "x.db")
    args = ["run", str(growing_flow(tmp_path))] if command == "run" else ["runs"]
    res = fk(*args, "--db", db, cwd=tmp_path, env=clean_env)
    assert res.returncode == 1
    assert_one_line(res.stderr, db)
    assert "afile is a file, not a folder" in res.stderr or "no such database" in res.stderr
    assert (tmp_path / "afile").read_text() == "not a folder"


def _spawn(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "flowkernel.cli", "--plugin", "tests.plugins.waiters", *args],
                            cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _kill_mid_node(db: str, tmp_path: Path, env: dict[str, str]) -> None:
    """A run killed while a node runs: its events stay in the ``-wal`` file, not yet in the database file."""
    blocked = tmp_path / "blocked.json"
    blocked.write_text(json.dumps({"name": "blocked", "nodes": [
        {"id": "first", "type": "noop", "input": {"n": 1}},
        {"id": "work", "type": "python", "input": {"function": "block_first_run"}}],
        "edges": [{"from": "first", "to": "work"}]}))
    proc = _spawn("run", str(blocked), "--db", db, "--json", cwd=tmp_path, env=env)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            event = json.loads(line)
            if event["type"] == "node:start" and event["nodeId"] == "work":
                break
    finally:
        proc.kill()
        proc.communicate(timeout=10)


@pytest.mark.parametrize("left", ["closed cleanly", "with a -wal file after a crash"])
def test_read_commands_work_on_a_database_on_a_read_only_mount(left: str, tmp_path: Path, clean_env: dict[str, str],
                                                              namespace: MountNamespace) -> None:
    folder = tmp_path / "ro"
    db = str(folder / "runs.db")
    done = fk("run", str(Path(__file__).resolve().parent.parent / "flows" / "hello.json"), "--input", "name=Ada",
              "--db", db, "--json", cwd=tmp_path, env=clean_env)
    assert done.returncode == 0, done.stderr
    expected = {"hello": "completed"}
    if left != "closed cleanly":
        _kill_mid_node(db, tmp_path, clean_env)
        assert (folder / "runs.db-wal").exists()
        expected["blocked"] = "interrupted"  # running, with no executor
    else:
        assert not (folder / "runs.db-wal").exists()
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    namespace.read_only(folder)
    assert namespace.run("touch", str(folder / "probe")).returncode != 0  # really read-only

    runs = namespace.flowkernel("runs", "--json", "--db", db, env=clean_env)
    assert runs.returncode == 0, runs.stderr
    records = {r["flowName"]: r for r in map(json.loads, runs.stdout.splitlines())}
    assert {name: r["status"] for name, r in records.items()} == expected
    for name, record in records.items():
        run_id = record["runId"]
        show = namespace.flowkernel("show", run_id, "--json", "--db", db, env=clean_env)
        assert show.returncode == 0, show.stderr
        shown = json.loads(show.stdout)
        assert shown["run"]["status"] == record["status"]
        assert shown["snapshot"]["status"] == ("running" if record["status"] == "interrupted" else record["status"])
        readable = namespace.flowkernel("show", run_id, "--db", db, env=clean_env)
        assert readable.returncode == 0 and f"status   {record['status']}" in readable.stdout
        events = namespace.flowkernel("events", run_id, "--json", "--db", db, env=clean_env)
        assert events.returncode == 0, events.stderr
        seen = [json.loads(line) for line in events.stdout.splitlines()]
        assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
        if name == "hello":
            assert [json.loads(line) for line in done.stdout.splitlines()] == seen
        else:  # the events only the -wal file holds
            assert seen[-1]["type"] == "node:start" and seen[-1]["nodeId"] == "work"

    # A command that must write says why it cannot, in one line.
    writer = namespace.flowkernel("abort", records["hello"]["runId"], "--db", db, env=clean_env)
    assert writer.returncode == 1
    assert_one_line(writer.stderr, db)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL whose tables live in a schema of their own."""
    with schema_url(os.environ[ENV_VAR]) as url:
        yield url


@needs_pg
def test_postgres_unreachable_is_one_line(tmp_path: Path, clean_env: dict[str, str], pg_url: str) -> None:
    proxy = CuttableProxy(_pg_target(pg_url))
    proxy.cut()
    try:
        url = _via(pg_url, proxy.port)
        for args in (["run", str(growing_flow(tmp_path))], ["runs"]):
            res = fk(*args, "--db", url, cwd=tmp_path, env=clean_env)
            assert res.returncode == 1
            assert_one_line(res.stderr, "cannot reach the PostgreSQL server", f"127.0.0.1:{proxy.port}")
            assert "flowkernel:***@" in res.stderr  # never the password
    finally:
        proxy.close()


@needs_pg
def test_postgres_gone_mid_run_is_one_line_and_the_run_resumes_when_it_is_back(
        tmp_path: Path, clean_env: dict[str, str], pg_url: str) -> None:
    proxy = CuttableProxy(_pg_target(pg_url))
    url = _via(pg_url, proxy.port)
    release = tmp_path / "release"
    flow = tmp_path / "waits.json"
    flow.write_text(json.dumps({"name": "waits", "nodes": [
        {"id": "first", "type": "noop", "input": {"n": 1}},
        {"id": "wait", "type": "python", "input": {"function": "faulty.wait_for_file", "args": {"path": str(release)}}},
        {"id": "last", "type": "noop", "input": {"got": "{{ wait }}"}}],
        "edges": [{"from": "first", "to": "wait"}, {"from": "wait", "to": "last"}]}))
    try:
        proc = subprocess.Popen([sys.executable, "-m", "flowkernel.cli", "--plugin", "tests.plugins.faulty", "run",
                                 str(flow), "--db", url, "--json"], cwd=tmp_path, env=clean_env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        try:
            shown = []
            for line in proc.stdout:
                shown.append(json.loads(line))
                if shown[-1]["type"] == "node:start" and shown[-1]["nodeId"] == "wait":
                    break
            proxy.cut()  # the server goes away while the node runs
            release.write_text("done")
            shown += [json.loads(line) for line in proc.stdout]
            assert proc.wait(timeout=60) == 1
            stderr = proc.stderr.read()
        finally:
            proc.kill()
            proc.communicate(timeout=10)
        run_id = shown[0]["flowRunId"]
        assert_one_line(stderr, f"run {run_id}: cannot save the snapshot", f"PostgreSQL server at 127.0.0.1:{proxy.port}",
                        f"flowkernel resume {run_id}")

        proxy.restore()  # the server is back
        [record] = [json.loads(line) for line in fk("runs", "--json", "--db", url, cwd=tmp_path,
                                                      env=clean_env).stdout.splitlines()]
        assert record["status"] == "interrupted"  # running, with no executor
        stored = [json.loads(line) for line in fk("events", run_id, "--json", "--db", url, cwd=tmp_path,
                                                  env=clean_env).stdout.splitlines()]
        assert stored == shown  # what was shown was saved; nothing after the cut was
        resumed = subprocess.run([sys.executable, "-m", "flowkernel.cli", "--plugin", "tests.plugins.faulty", "resume",
                                  run_id, "--db", url, "--json"], cwd=tmp_path, env=clean_env, text=True,
                                 capture_output=True, timeout=60)
        assert resumed.returncode == 0, resumed.stderr
        show = json.loads(fk("show", run_id, "--json", "--db", url, cwd=tmp_path, env=clean_env).stdout)
        assert show["snapshot"]["status"] == "completed" and show["snapshot"]["outputs"]["last"] == {"got": "done"}
    finally:
        proxy.close()


def _pg_target(url: str) -> tuple[str, int]:
    from psycopg import conninfo

    params = conninfo.conninfo_to_dict(url)
    return str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)


def _via(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    return re.sub(r"@[^/@]+/", f"@127.0.0.1:{port}/", url, count=1)
