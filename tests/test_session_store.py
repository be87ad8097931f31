"""Claude Code session transcripts in flowkernel's stores, through ``RunSessionStore`` (DESIGN §7b).

WHEN the Agent SDK mirrors a session into a run's store (memory, SQLite, PostgreSQL) THEN the store
passes the SDK's own conformance suite, keeps each transcript in append order, stores a retried
batch once (by entry uuid) and keeps entries without a uuid, folds the summary from what is new, and
appends that race (threads, processes' connections) lose nothing. WHEN the lease the run is executed
under is lost THEN appends and deletes are refused in their own transaction. A session belongs to
its run: another run neither sees nor writes it. A database of the previous schema gains the tables.

The runs here are hand-made rows without events (nothing to replay): the replay audit is skipped.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flowkernel.agents.session_store import RunSessionStore
from flowkernel.errors import LeaseLostError, StoreError, UnknownRunError
from flowkernel.store.base import RunRecord, Store
from flowkernel.store.fenced import fenced
from flowkernel.store.memory import MemoryStore
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.store.sql.store import SCHEMA_VERSION, SqlStore

from tests.test_postgres import needs_pg, pg_url  # noqa: F401 (pg_url is a fixture)

pytestmark = pytest.mark.no_audit

KEY: dict[str, Any] = {"project_key": "-tmp-work", "session_id": "5b0c3f0e-1111-4c2a-9d55-000000000001"}
SUB: dict[str, Any] = {**KEY, "subpath": "subagents/agent-a1"}


def entry(uuid: str | None, n: int, **extra: Any) -> dict[str, Any]:
    return {"type": "user", **({"uuid": uuid} if uuid else {}), "n": n, "message": {"content": f"ü {n}"}, **extra}


def add_run(store: Store, run_id: str) -> None:
    store.create_run(RunRecord(runId=run_id, flowName="f", flowHash="h", status="running", seq=0, input={},
                               createdAt=1000, updatedAt=1000), [], b"{}", document="{}")


def _postgres(url: str) -> Store:
    from flowkernel.store.sql.postgres import PostgresStore

    return PostgresStore(url)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=needs_pg)])
def connect(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Opens a connection to one fresh store (twice: two processes' connections; memory: the same store)."""
    opened: list[Store] = []
    if request.param == "memory":
        memory = MemoryStore()
        yield lambda: memory
        return
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else ""

    def make() -> Store:
        opened.append(_postgres(url) if url else SqliteStore(tmp_path / "runs.db"))
        return opened[-1]

    yield make
    for s in opened:
        s.close()


@pytest.fixture
def store(connect: Callable[[], Store]) -> Store:
    made = connect()
    add_run(made, "run_a")
    return made


def _clear_sessions(store: Store) -> None:
    """Empty the session tables: a fresh store for the adapter, as each conformance contract wants."""
    if isinstance(store, MemoryStore):
        store._transcripts.clear()
        return
    assert isinstance(store, SqlStore)
    with store._tx() as db:
        for table in ("session_entries", "session_transcripts"):
            db.execute(f"DELETE FROM {table}")


async def test_the_adapter_passes_the_sdks_session_store_conformance_suite(store: Store) -> None:
    from claude_agent_sdk.testing import run_session_store_conformance

    made: list[RunSessionStore] = []

    def fresh() -> RunSessionStore:
        _clear_sessions(store)
        made.append(RunSessionStore(store, "run_a"))
        return made[-1]

    await run_session_store_conformance(fresh)  # every optional method too: none is skipped
    assert len(made) == 15  # a probe and one store per contract: none was left out as unimplemented


async def test_a_retried_batch_is_stored_once_and_entries_without_a_uuid_are_kept(store: Store) -> None:
    adapter = RunSessionStore(store, "run_a")
    batch = [entry("u1", 1), entry(None, 2), entry("u2", 3)]
    await adapter.append(KEY, batch)
    await adapter.append(KEY, batch)  # the SDK retrying the same batch
    await adapter.append(KEY, [entry("u3", 4), entry("u3", 4), entry("u1", 1)])
    assert await adapter.load(KEY) == [entry("u1", 1), entry(None, 2), entry("u2", 3), entry(None, 2),
                                       entry("u3", 4)]
    # A uuid is unique within its transcript only: a subagent's may repeat the main one's.
    assert store.append_session_entries("run_a", KEY["project_key"], KEY["session_id"], SUB["subpath"],
                                        [entry("u1", 1)]) == 1
    assert store.append_session_entries("run_a", KEY["project_key"], KEY["session_id"], "", [entry("u1", 1)]) == 0


async def test_the_summary_is_folded_from_new_entries_only(store: Store) -> None:
    adapter = RunSessionStore(store, "run_a")
    first = [entry("u1", 1, customTitle="first", timestamp="2026-01-01T00:00:00.000Z")]
    await adapter.append(KEY, first)
    await adapter.append(KEY, [entry("u2", 2, customTitle="second")])
    await adapter.append(KEY, [*first, entry("u3", 3)])  # a late retry of the first batch, with a new entry
    await adapter.append(SUB, [entry("s1", 1, customTitle="subagent")])
    [summary] = await adapter.list_session_summaries(KEY["project_key"])
    assert summary["data"]["custom_title"] == "second"
    assert summary["data"]["created_at"] > 1e12
    [listed] = await adapter.list_sessions(KEY["project_key"])
    assert summary["mtime"] == listed["mtime"] and listed["session_id"] == KEY["session_id"]


async def test_concurrent_appends_to_one_transcript_lose_nothing(connect: Callable[[], Store]) -> None:
    """Eight writers on two connections, each appending its own batches and retrying another's:
    every entry is stored once, each batch whole and in order, and the summary counts them all."""
    first = connect()
    add_run(first, "run_a")
    stores = [first, connect()]

    def count(prev: dict[str, Any] | None, new: list[dict[str, Any]]) -> dict[str, Any]:
        return {"n": (prev or {}).get("n", 0) + len(new)}

    batches = [[entry(f"w{w}-b{b}-e{e}", e) for e in range(3)] for w in range(8) for b in range(6)]
    start = threading.Barrier(8)
    failures: list[BaseException] = []

    def writer(w: int) -> None:
        rows = stores[w % 2]
        try:
            start.wait()
            for b in range(6):
                for batch in (batches[w * 6 + b], batches[((w + 1) % 8) * 6 + b]):  # its own, then a retry
                    rows.append_session_entries("run_a", KEY["project_key"], KEY["session_id"], "", batch, fold=count)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    loaded = first.load_session_entries(KEY["project_key"], KEY["session_id"]) or []
    uuids = [e["uuid"] for e in loaded]
    assert sorted(uuids) == sorted(e["uuid"] for batch in batches for e in batch)
    for batch in batches:
        at = uuids.index(batch[0]["uuid"])
        assert loaded[at:at + 3] == batch
    [session] = first.list_sessions(run_id="run_a")
    assert session.summary == {"n": len(loaded)}


async def test_the_adapter_calls_the_store_off_the_event_loop_and_racing_appends_keep_every_entry(
        store: Store) -> None:
    called_from: list[int] = []

    class Watched:
        def __getattr__(self, name: str) -> Any:
            method = getattr(store, name)

            def call(*args: Any, **kwargs: Any) -> Any:
                called_from.append(threading.get_ident())
                return method(*args, **kwargs)
            return call

    adapter = RunSessionStore(Watched(), "run_a")
    batches = [[entry(f"t{t}-{i}", i) for i in range(4)] for t in range(20)]
    await asyncio.gather(*(adapter.append(KEY, b) for b in batches), *(adapter.append(KEY, b) for b in batches))
    loaded = await adapter.load(KEY)
    assert loaded is not None and sorted(e["uuid"] for e in loaded) == sorted(e["uuid"] for b in batches for e in b)
    await adapter.list_sessions(KEY["project_key"])
    await adapter.list_session_summaries(KEY["project_key"])
    await adapter.list_subkeys(KEY)
    await adapter.delete(SUB)
    assert len(called_from) == 45 and threading.get_ident() not in called_from


async def test_appends_and_deletes_are_refused_once_the_lease_is_lost(store: Store) -> None:
    lease = store.acquire_lease("run_a", "worker-1", 1_000, 10_000)
    adapter = RunSessionStore(store, "run_a", lease)
    via_node_store = RunSessionStore(fenced(store, lease), "run_a")
    await adapter.append(KEY, [entry("u1", 1)])
    await via_node_store.append(KEY, [entry("u2", 2)])
    store.acquire_lease("run_a", "worker-2", 20_000, 10_000)  # expired, taken over by another worker
    for writer in (adapter, via_node_store):
        with pytest.raises(LeaseLostError):
            await writer.append(KEY, [entry("u3", 3)])
        with pytest.raises(LeaseLostError):
            await writer.delete(KEY)
    assert await adapter.load(KEY) == [entry("u1", 1), entry("u2", 2)]


async def test_a_session_belongs_to_its_run(store: Store) -> None:
    add_run(store, "run_b")
    mine, theirs = RunSessionStore(store, "run_a"), RunSessionStore(store, "run_b")
    await mine.append(KEY, [entry("u1", 1)])
    await mine.append(SUB, [entry("s1", 1)])
    for key in (KEY, SUB, {**KEY, "subpath": "subagents/agent-new"}):
        with pytest.raises(StoreError, match=f"session {KEY['session_id']} .* belongs to run run_a, not to run run_b"):
            await theirs.append(key, [entry("x", 1)])
    assert await theirs.load(KEY) is None
    assert await theirs.list_sessions(KEY["project_key"]) == []
    assert await theirs.list_session_summaries(KEY["project_key"]) == []
    assert await theirs.list_subkeys(KEY) == []
    await theirs.delete(KEY)
    assert await mine.load(KEY) == [entry("u1", 1)]
    assert await mine.list_subkeys(KEY) == ["subagents/agent-a1"]
    assert [s.runId for s in store.list_sessions()] == ["run_a"]
    with pytest.raises(UnknownRunError):
        await RunSessionStore(store, "run_nope").append({**KEY, "session_id": "other"}, [entry("u", 1)])


def test_the_package_and_the_session_rows_work_without_the_sdk(tmp_path: Path) -> None:
    """``claude_agent_sdk`` made unimportable: flowkernel, its stores' session rows, the adapter's
    module and the CLI still import and work (the SDK is needed only to run a session)."""
    probe = f"""
import sys
sys.modules["claude_agent_sdk"] = None  # import claude_agent_sdk now raises ImportError
import flowkernel, flowkernel.cli, flowkernel.agents.session_store
from flowkernel.store.base import RunRecord
from flowkernel.store.sql.sqlite import SqliteStore
store = SqliteStore({str(tmp_path / "runs.db")!r})
store.create_run(RunRecord(runId="r", flowName="f", flowHash="h", status="running", seq=0, input={{}},
                           createdAt=1, updatedAt=1), [], b"{{}}", document="{{}}")
store.append_session_entries("r", "p", "s", "", [{{"type": "x", "uuid": "u"}}])
print(store.load_session_entries("p", "s"))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[{'type': 'x', 'uuid': 'u'}]"


def test_importing_the_adapter_does_not_import_the_sdk() -> None:
    probe = "import sys, flowkernel.agents.session_store; print('claude_agent_sdk' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_version_11_sqlite_database_gains_the_session_tables(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    old = SqliteStore(path)
    add_run(old, "run_a")
    old.close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE session_entries")
    db.execute("DROP TABLE session_transcripts")
    db.execute("PRAGMA user_version = 11")
    db.commit()
    db.close()
    store = SqliteStore(path)
    assert store.append_session_entries("run_a", "p", "s", "", [entry("u1", 1)]) == 1
    assert store.load_session_entries("p", "s") == [entry("u1", 1)]
    store.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 12
    check.close()


def test_a_version_11_postgres_database_gains_the_session_tables(pg_url: str) -> None:  # noqa: F811
    import psycopg

    old = _postgres(pg_url)
    add_run(old, "run_a")
    old.close()
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("DROP TABLE session_entries")
        db.execute("DROP TABLE session_transcripts")
        db.execute("UPDATE flowkernel_meta SET value = 11 WHERE key = 'schema_version'")
    store = _postgres(pg_url)
    assert store.append_session_entries("run_a", "p", "s", "", [entry("u1", 1)]) == 1
    assert store.load_session_entries("p", "s") == [entry("u1", 1)]
    store.close()
    with psycopg.connect(pg_url) as db:
        row = db.execute("SELECT value FROM flowkernel_meta WHERE key = 'schema_version'").fetchone()
        assert row is not None and row[0] == SCHEMA_VERSION
