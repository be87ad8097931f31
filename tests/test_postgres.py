"""PostgresStore: the store protocol, real runs, the CLI and several workers on a real PostgreSQL server.

Needs ``FLOWKERNEL_TEST_PG=postgresql://user:password@host:port/database`` naming a database the user
may create schemas in (``.ci/run`` starts a server and sets it); without it every test here skips.
Each test gets a fresh schema (``?options=-csearch_path%3D<schema>``), dropped afterwards, so runs
never collide. The contract tests run on SqliteStore too: the two stores must behave alike.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from flowkernel.errors import StoreError, UnknownRunError
from flowkernel.run.kernel import Kernel
from flowkernel.store.base import Lease, RunRecord, Store
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.testing.audit import audit_store
from msgspec.structs import replace

from tests.test_crash import Stored, assert_resume_is_exact, crash_flow, stored_run

ROOT = Path(__file__).resolve().parent.parent
HELLO = str(ROOT / "flows" / "hello.json")
ENV_VAR = "FLOWKERNEL_TEST_PG"
TIMEOUT_S = 60
CRASH_INPUT = ["--input", "seed=7", "--input", "items=[1, 2, 3, 4, 5, 6]"]


def _server_problem() -> str | None:
    """Why the Postgres tests cannot run here, or None if they can."""
    url = os.environ.get(ENV_VAR)
    if not url:
        return (f"{ENV_VAR} is not set; point it at a PostgreSQL database the tests may create schemas in "
                "(postgresql://user:password@127.0.0.1:5432/db; .ci/run starts one)")
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]')"
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as exc:
        return f"{ENV_VAR} server unreachable: {str(exc).strip().splitlines()[0]}"
    return None


_PROBLEM = _server_problem()
needs_pg = pytest.mark.skipif(_PROBLEM is not None, reason=_PROBLEM or "")


def _with_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"


@contextmanager
def schema_url(base: str) -> Iterator[str]:
    """``base`` with a fresh schema of its own as the search path; the schema is dropped afterwards."""
    import psycopg

    schema = f"fk_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield _with_schema(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL whose tables live in a schema of their own, dropped after the test."""
    if _PROBLEM is not None:
        pytest.skip(_PROBLEM)
    with schema_url(os.environ[ENV_VAR]) as url:
        yield url


def _pg_store(url: str) -> Store:
    from flowkernel.store.sql.postgres import PostgresStore

    return PostgresStore(url)


def _audited(url: str) -> int:
    """Every run in the Postgres store must replay to its stored snapshot (conftest audits SQLite only)."""
    store = _pg_store(url)
    try:
        return audit_store(store)
    finally:
        store.close()


# -- the store contract, on both stores ------------------------------------------------------------
# These tests store hand-made rows (a flow "f", checkpoints like b'{"cp": 1}'), not runs of a flow, so
# the replay audit has nothing meaningful to fold: it is skipped for them (every test below that runs a
# real flow audits its Postgres store at the end).

@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=needs_pg)])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Opens a new connection to one fresh store (call it twice for two workers)."""
    opened: list[Store] = []
    if request.param == "sqlite":
        def make() -> Store:
            opened.append(SqliteStore(tmp_path / "runs.db"))
            return opened[-1]
        yield make
    else:
        url = request.getfixturevalue("pg_url")

        def make() -> Store:
            opened.append(_pg_store(url))
            return opened[-1]
        yield make
    for s in opened:
        s.close()


def _record(run_id: str, *, status: str = "running", parent: str | None = None, created: int = 1000) -> RunRecord:
    return RunRecord(runId=run_id, flowName="f", flowHash="h1", status=status, seq=1, input={"x": [1, "é"]},
                     createdAt=created, updatedAt=created, parentRunId=parent)


def _event(seq: int, ts: int = 2000) -> tuple[int, int, bytes]:
    return (seq, ts + seq, json.dumps({"seq": seq, "text": "ünïcode"}).encode())


@pytest.mark.no_audit
def test_runs_events_and_checkpoints_round_trip(open_store: Callable[[], Store]) -> None:
    store = open_store()
    store.put_flow("h1", "f", '{"name": "f"}')
    store.put_flow("h1", "f", '{"name": "f"}')  # idempotent
    assert store.get_flow("h1") == '{"name": "f"}'
    store.create_run(_record("run_a"), [_event(1)], b'{"cp": 1}', {"k1": b"blob one"})
    assert store.read_checkpoint("run_a") == (1, b'{"cp": 1}')

    store.commit("run_a", [_event(2), _event(3)], "running", 3, None, None)
    store.commit("run_a", [_event(4)], "failed", 4, "boom", b'{"cp": 4}', {"k1": b"blob one", "k2": b"\x00two"})
    run = store.get_run("run_a")
    assert (run.status, run.seq, run.error, run.updatedAt) == ("failed", 4, "boom", _event(4)[1])
    assert run.input == {"x": [1, "é"]}
    assert store.read_events("run_a") == [_event(i)[2] for i in range(1, 5)]
    assert store.read_events("run_a", after=1, until=3) == [_event(2)[2], _event(3)[2]]
    assert store.read_checkpoint("run_a") == (4, b'{"cp": 4}')
    assert store.read_checkpoint("run_a", at_most=3) is None, "compaction keeps only the newest checkpoint"
    assert store.read_blobs(["k1", "k2", "missing"]) == {"k1": b"blob one", "k2": b"\x00two"}
    assert store.read_blobs([]) == {}


@pytest.mark.no_audit
def test_the_log_refuses_a_second_writer_and_unknown_runs_are_named(open_store: Callable[[], Store]) -> None:
    store = open_store()
    store.create_run(_record("run_a"), [_event(1)], b"{}")
    with pytest.raises(StoreError, match="out of order"):
        store.commit("run_a", [_event(1)], "running", 1, None, None)
    with pytest.raises(StoreError):  # Postgres says "run … already exists", SQLite names the constraint
        store.create_run(_record("run_a"), [_event(1)], b"{}")
    store.commit("run_a", [_event(2)], "running", 2, None, None)  # the store is still usable
    assert len(store.read_events("run_a")) == 2
    with pytest.raises(UnknownRunError, match="run_nope"):
        store.get_run("run_nope")
    with pytest.raises(UnknownRunError):
        store.read_events("run_nope")
    with pytest.raises(UnknownRunError):
        store.acquire_lease("run_nope", "w1", 0, 1000)
    with pytest.raises(StoreError, match="missing"):
        store.get_flow("nope")


@pytest.mark.no_audit
def test_a_run_is_created_with_its_flow_and_its_lease_in_one_transaction(open_store: Callable[[], Store]) -> None:
    store = open_store()
    leased = replace(_record("run_a"), leaseOwner="w1", leaseExpiresAt=5000)
    store.create_run(leased, [_event(1)], b"{}", document='{"name": "f"}')
    assert store.get_flow("h1") == '{"name": "f"}'
    assert (store.get_run("run_a").leaseOwner, store.get_run("run_a").leaseExpiresAt) == ("w1", 5000)
    assert store.acquire_lease("run_a", "w2", now_ms=4000, ttl_ms=500).owner == "w1"
    # A second run of a stored flow leaves the stored document as it is.
    store.create_run(_record("run_b"), [_event(1)], b"{}", document='{"name": "f"}')
    assert store.get_flow("h1") == '{"name": "f"}'
    # A refused run stores nothing, not even its flow.
    with pytest.raises(StoreError):
        store.create_run(replace(_record("run_a"), flowHash="h2"), [_event(1)], b"{}", document='{"name": "g"}')
    with pytest.raises(StoreError, match="missing"):
        store.get_flow("h2")


@pytest.mark.no_audit
def test_the_commit_that_stops_a_run_can_end_its_holders_lease(open_store: Callable[[], Store]) -> None:
    store = open_store()
    store.create_run(replace(_record("run_a"), leaseOwner="w1", leaseExpiresAt=5000, leaseEpoch=1), [_event(1)], b"{}")
    store.commit("run_a", [_event(2)], "completed", 2, None, None, lease=Lease("w1", 1), release=True)
    run = store.get_run("run_a")
    assert (run.status, run.seq, run.leaseOwner, run.leaseExpiresAt) == ("completed", 2, None, None)


@pytest.mark.no_audit
def test_list_runs_filters_by_status_and_parent_newest_first(open_store: Callable[[], Store]) -> None:
    store = open_store()
    store.create_run(_record("run_a", created=1), [_event(1)], b"{}")
    store.create_run(_record("run_b", created=2, parent="run_a"), [_event(1)], b"{}")
    store.create_run(_record("run_c", created=3, status="completed"), [_event(1)], b"{}")
    assert [r.runId for r in store.list_runs()] == ["run_c", "run_b", "run_a"]
    assert [r.runId for r in store.list_runs(status="running")] == ["run_b", "run_a"]
    assert [r.runId for r in store.list_runs(parent="run_a")] == ["run_b"]
    assert [r.runId for r in store.list_runs(limit=1)] == ["run_c"]


@pytest.mark.no_audit
def test_commands_from_another_worker_change_the_token_and_are_taken_once(open_store: Callable[[], Store]) -> None:
    executor, sender = open_store(), open_store()
    executor.create_run(_record("run_a"), [_event(1)], b"{}")
    token = executor.change_token()
    first = sender.enqueue_command("run_a", {"kind": "pause"})
    assert executor.change_token() != token, "the executor notices a command stored by another connection"
    second = sender.enqueue_command("run_a", {"kind": "send", "content": "hi"})
    sender.enqueue_command("run_other", {"kind": "abort"})
    pending = executor.pending_commands("run_a")
    assert [(c.id, c.body) for c in pending] == [(first, {"kind": "pause"}),
                                                 (second, {"kind": "send", "content": "hi"})]
    executor.finish_command(first, 2)
    assert [c.id for c in sender.pending_commands("run_a")] == [second]


@pytest.mark.no_audit
def test_leases_have_one_holder_until_released_expired_or_stolen_from_the_dead(
        open_store: Callable[[], Store]) -> None:
    w1, w2 = open_store(), open_store()
    w1.create_run(_record("run_a"), [_event(1)], b"{}")
    first = w1.acquire_lease("run_a", "w1", now_ms=1000, ttl_ms=500)
    assert first == Lease("w1", 1)
    assert w1.renew_lease("run_a", first, now_ms=1200, ttl_ms=500), "the holder renews"
    assert w2.acquire_lease("run_a", "w2", now_ms=1300, ttl_ms=500) == first, "held: the holder's lease comes back"
    assert w2.get_run("run_a").leaseOwner == "w1"
    stolen = w2.acquire_lease("run_a", "w2", now_ms=1300, ttl_ms=500, steal_from="w1")
    assert stolen == Lease("w2", 2), "every grant is a new epoch"
    assert w1.acquire_lease("run_a", "w1", now_ms=1400, ttl_ms=500) == stolen
    assert not w1.renew_lease("run_a", first, now_ms=1400, ttl_ms=500), "a lease taken over cannot be renewed"
    w1.release_lease("run_a", first)  # not the holder: changes nothing
    assert w1.get_run("run_a").leaseOwner == "w2"
    again = w1.acquire_lease("run_a", "w1", now_ms=1801, ttl_ms=500)
    assert again == Lease("w1", 3), "an expired lease is free"
    w1.release_lease("run_a", again)
    assert w2.get_run("run_a").leaseOwner is None
    assert w2.acquire_lease("run_a", "w2", now_ms=1900, ttl_ms=500) == Lease("w2", 4)


@pytest.mark.no_audit
def test_agent_messages_and_tool_calls_page_and_filter(open_store: Callable[[], Store]) -> None:
    store = open_store()
    base = {"flowRunId": "run_a", "nodeId": "writer", "sessionId": "s1"}
    ids = [store.add_agent_message({**base, "runId": "nr_1", "role": role, "content": [{"text": role}], "step": i,
                                    "createdAt": 10 + i})
           for i, role in enumerate(["system", "user", "assistant"])]
    store.add_agent_message({**base, "runId": "nr_2", "sessionId": "s2", "role": "user", "content": "x", "step": 0})
    page = store.list_agent_messages(run_id="nr_1", limit=2)
    assert [(m["id"], m["role"], m["content"], m["step"]) for m in page] == [
        (ids[0], "system", [{"text": "system"}], 0), (ids[1], "user", [{"text": "user"}], 1)]
    assert [m["id"] for m in store.list_agent_messages(run_id="nr_1", after=ids[1])] == [ids[2]]
    assert len(store.list_agent_messages(flow_run_id="run_a")) == 4
    assert [m["runId"] for m in store.list_agent_messages(session_id="s2")] == ["nr_2"]

    call = {**base, "runId": "nr_1", "messageId": ids[2], "toolUseId": "tu_1", "durationMs": 5, "step": 2}
    t1 = store.add_tool_call({**call, "toolName": "search", "input": {"q": "a"}, "output": {"hits": 1},
                              "status": "completed"})
    t2 = store.add_tool_call({**call, "toolName": "fetch", "input": None, "output": None, "status": "error"})
    assert t2 > t1
    [row] = store.list_tool_calls(run_id="nr_1", tool_name="search")
    assert (row["input"], row["output"], row["status"], row["messageId"], row["durationMs"]) == (
        {"q": "a"}, {"hits": 1}, "completed", ids[2], 5)
    assert [t["id"] for t in store.list_tool_calls(flow_run_id="run_a", status="error")] == [t2]
    assert [t["id"] for t in store.list_tool_calls(session_id="s1", after=t1)] == [t2]


# -- Postgres specifics ----------------------------------------------------------------------------

@needs_pg
def test_racing_workers_on_one_lease_get_exactly_one_winner(pg_url: str) -> None:
    setup = _pg_store(pg_url)
    workers = [_pg_store(pg_url) for _ in range(6)]
    try:
        for attempt in range(10):
            run_id = f"run_{attempt}"
            setup.create_run(_record(run_id), [_event(1)], b"{}")
            results: dict[str, str] = {}
            start = threading.Barrier(len(workers))

            def race(i: int, store: Store, run_id: str, start: threading.Barrier,
                     results: dict[str, str]) -> None:
                start.wait()
                results[f"w{i}"] = store.acquire_lease(run_id, f"w{i}", 1000, 60_000).owner

            threads = [threading.Thread(target=race, args=(i, s, run_id, start, results))
                       for i, s in enumerate(workers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            winners = [w for w, holder in results.items() if holder == w]
            assert len(winners) == 1, results
            assert all(holder == winners[0] for w, holder in results.items() if w != winners[0]), results
            assert setup.get_run(run_id).leaseOwner == winners[0]
    finally:
        for s in [setup, *workers]:
            s.close()
    # Hand-made rows, like the contract tests above: nothing for the replay audit to fold.


@needs_pg
def test_unreachable_server_wrong_password_and_missing_database_are_one_line_errors() -> None:
    import psycopg.conninfo
    from flowkernel.store.sql.postgres import PostgresStore

    parts = psycopg.conninfo.conninfo_to_dict(os.environ[ENV_VAR])
    host, port, user = parts.get("host") or "127.0.0.1", int(parts.get("port") or 5432), parts.get("user") or "x"
    cases = {
        f"postgresql://{user}:pw@127.0.0.1:1/x": "cannot reach the PostgreSQL server at 127.0.0.1:1",
        f"postgresql://{user}:definitely-wrong@{host}:{port}/{parts.get('dbname')}": "authentication failed",
        f"postgresql://{user}:{parts.get('password') or ''}@{host}:{port}/fk_no_such_db": "does not exist",
    }
    for url, expected in cases.items():
        with pytest.raises(StoreError, match=expected) as info:
            PostgresStore(url)
        assert "\n" not in str(info.value)
        assert "definitely-wrong" not in str(info.value), "passwords never appear in messages"


# -- a real flow through the Python API ------------------------------------------------------------

@needs_pg
def test_hello_flow_runs_on_postgres_like_on_sqlite_and_replays(pg_url: str, tmp_path: Path) -> None:
    kernel = Kernel(_pg_store(pg_url))
    try:
        snap = anyio.run(lambda: kernel.run(kernel.load_flow(HELLO), {"name": "Ada"}))
        assert snap.status == "completed"
        assert snap.outputs["finish"] == {"greeting": "Hello, Ada! That is a short name.", "drafts": 3,
                                          "letters": "A-D-A!"}
        events = kernel.events(snap.runId)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert kernel.snapshot(snap.runId) == snap
        assert kernel.store.get_run(snap.runId).leaseOwner is None, "the lease is released when the run stops"
        half = events[len(events) // 2].seq
        assert kernel.snapshot(snap.runId, at=half).seq == half, "time travel rebuilds past snapshots"
    finally:
        kernel.close()

    reference = Kernel(str(tmp_path / "runs.db"))
    try:
        ref = anyio.run(lambda: reference.run(reference.load_flow(HELLO), {"name": "Ada"}))
        assert [e.type for e in reference.events(ref.runId)] == [e.type for e in events]
        assert (ref.outputs, ref.state, ref.nodeStatus) == (snap.outputs, snap.state, snap.nodeStatus)
    finally:
        reference.close()
    assert _audited(pg_url) == 1


# -- the CLI ---------------------------------------------------------------------------------------

def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    for name in ("FLOWKERNEL_DB", "FLOWKERNEL_PLUGINS", "CRASH_AT"):
        env.pop(name, None)
    env["NO_COLOR"] = "1"
    env.update(extra)
    return env


def _fk(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=_env(**env), text=True,
                          capture_output=True, timeout=TIMEOUT_S)


def _spawn(*args: str, cwd: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "flowkernel.cli", *args], cwd=cwd, env=_env(**env), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@needs_pg
def test_cli_runs_lists_and_shows_a_run_stored_in_postgres(pg_url: str, tmp_path: Path) -> None:
    ran = _fk("run", HELLO, "--input", "name=Grace", "--db", pg_url, "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    events = [json.loads(line) for line in ran.stdout.splitlines()]
    run_id = events[0]["flowRunId"]
    assert events[-1]["type"] == "flow:complete"
    assert not (tmp_path / ".flowkernel").exists(), "--db postgresql://… never touches the SQLite default"

    listed = _fk("runs", "--db", pg_url, "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    [row] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (row["runId"], row["status"], row["seq"]) == (run_id, "completed", len(events))

    shown = _fk("show", run_id, "--db", pg_url, "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    snapshot = json.loads(shown.stdout)["snapshot"]
    assert snapshot["outputs"]["finish"]["letters"] == "G-R-A-C-E!"
    assert _fk("show", run_id, "--db", pg_url, cwd=tmp_path).returncode == 0

    stored = _fk("events", run_id, "--db", pg_url, "--json", cwd=tmp_path)
    assert [json.loads(line) for line in stored.stdout.splitlines()] == events
    missing = _fk("show", "run_nope", "--db", pg_url, cwd=tmp_path)
    assert missing.returncode == 2 and "no run 'run_nope'" in missing.stderr
    assert _audited(pg_url) == 1


@needs_pg
def test_cli_unreachable_server_is_one_line_without_traceback(tmp_path: Path) -> None:
    done = _fk("runs", "--db", "postgresql://u:secret@127.0.0.1:1/db", cwd=tmp_path)
    assert done.returncode == 1
    assert "cannot reach the PostgreSQL server at 127.0.0.1:1" in done.stderr
    assert "Traceback" not in done.stderr and "secret" not in done.stderr


def _stored(url: str) -> Stored:
    return stored_run(Kernel(_pg_store(url)))


@pytest.fixture(scope="module")
def crash_flow_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pg-crash") / "crash.json"
    path.write_text(json.dumps(crash_flow()), encoding="utf-8")
    return path


@needs_pg
@pytest.mark.slow
@pytest.mark.parametrize("crash_at", [1, 38, 99])
def test_cli_run_sigkilled_mid_node_resumes_on_postgres_to_the_uninterrupted_result(
        crash_at: int, crash_flow_file: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    plugin = {"FLOWKERNEL_PLUGINS": "tests.plugins.crashy"}
    reference_url = request.getfixturevalue("pg_url")
    done = _fk("run", str(crash_flow_file), *CRASH_INPUT, "--db", reference_url, "--json", cwd=tmp_path, **plugin)
    assert done.returncode == 0, done.stderr
    reference = _stored(reference_url)

    url = _with_schema(os.environ[ENV_VAR], _fresh_schema(request))
    crashed = _fk("run", str(crash_flow_file), *CRASH_INPUT, "--db", url, "--json", cwd=tmp_path,
                  CRASH_AT=str(crash_at), **plugin)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    before = _stored(url)
    assert before.status == "running" and "running" in before.node_status.values()

    resumed = _fk("resume", before.run_id, "--db", url, "--json", cwd=tmp_path, **plugin)
    assert resumed.returncode == 0, resumed.stderr
    assert_resume_is_exact(before, _stored(url), reference)
    assert _audited(url) == 1 and _audited(reference_url) == 1


def _fresh_schema(request: pytest.FixtureRequest) -> str:
    """A second schema for one test, dropped at its end."""
    import psycopg

    schema = f"fk_test_{uuid.uuid4().hex[:12]}"
    base = os.environ[ENV_VAR]
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")

    def drop() -> None:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")
    request.addfinalizer(drop)
    return schema


# -- several workers -------------------------------------------------------------------------------

def _race_flow(tmp_path: Path) -> str:
    path = tmp_path / "race.json"
    path.write_text(json.dumps({"name": "race", "nodes": [
        {"id": "slow", "type": "python",
         "input": {"function": "wait_for_file", "args": {"path": str(tmp_path / "gate"), "value": 1}}}],
        "edges": []}))
    return str(path)


@needs_pg
@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(3))
def test_two_workers_racing_to_resume_one_run_exactly_one_executes(attempt: int, pg_url: str, tmp_path: Path) -> None:
    # A stored run that no process executes (as after a crash): both workers try to take it over.
    kernel = Kernel(_pg_store(pg_url))
    try:
        import tests.plugins.waiters  # noqa: F401  (registers wait_for_file for the flow's validation)

        run_id = kernel.create_run(kernel.load_flow(_race_flow(tmp_path)), {})
    finally:
        kernel.close()
    plugin = {"FLOWKERNEL_PLUGINS": "tests.plugins.waiters"}
    racers = [_spawn("resume", run_id, "--json", "--db", pg_url, cwd=tmp_path, **plugin) for _ in range(2)]
    # The winner's node holds until the gate opens, so the loser meets a run still being executed
    # however slowly either process starts; the gate opens once one racer has given up.
    deadline = time.monotonic() + TIMEOUT_S
    while all(p.poll() is None for p in racers):
        assert time.monotonic() < deadline, "neither resumer gave up while the other held the run"
        time.sleep(0.02)
    (tmp_path / "gate").touch()
    results = [(p.wait(timeout=TIMEOUT_S), *p.communicate()) for p in racers]
    assert sorted(code for code, _, _ in results) == [0, 1], results
    loser = next(r for r in results if r[0] == 1)
    assert "is being executed by" in loser[2], loser
    reader = Kernel(_pg_store(pg_url))
    try:
        stored = [e.type for e in reader.events(run_id)]
    finally:
        reader.close()
    assert stored.count("node:complete") == 1, "exactly one worker executed the node"
    assert stored.count("flow:resumed") == 1
    assert attempt >= 0
    assert _audited(pg_url) == 1


@needs_pg
def test_a_message_sent_from_another_process_reaches_the_worker_executing_the_run(
        pg_url: str, tmp_path: Path) -> None:
    flow = tmp_path / "inbox.json"
    flow.write_text(json.dumps({"name": "inbox", "nodes": [
        {"id": "wait", "type": "python", "input": {"function": "await_message"}}], "edges": []}))
    plugin = {"FLOWKERNEL_PLUGINS": "tests.plugins.waiters"}
    worker = _spawn("run", str(flow), "--db", pg_url, "--json", cwd=tmp_path, **plugin)
    try:
        assert worker.stdout is not None
        for line in worker.stdout:
            event = json.loads(line)
            if event["type"] == "node:start":
                break
        sent = _fk("send", event["flowRunId"], "--to", event["runId"], "hello from afar", "--db", pg_url,
                   cwd=tmp_path, **plugin)
        assert sent.returncode == 0, sent.stderr
        out, err = worker.communicate(timeout=TIMEOUT_S)
    finally:
        worker.kill()
    assert worker.returncode == 0, err
    done = next(json.loads(line) for line in out.splitlines() if json.loads(line)["type"] == "node:complete")
    assert done["output"] == ["hello from afar"]
    assert _audited(pg_url) == 1
