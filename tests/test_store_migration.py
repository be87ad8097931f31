"""A database written by an earlier schema version opens, migrates in place and loses nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.history.agent_runs import AgentRunBackfill
from flowkernel.plugins.registry import default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.store.sql.store import SCHEMA_VERSION
from flowkernel.testing.fake_api import Text, ToolUse, reply

from tests.test_postgres import pg_url  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parent.parent

# Schema version 2 as it was released: events keyed by (run_id, seq) with a secondary index.
V2 = [
    "CREATE TABLE flows (hash TEXT PRIMARY KEY, name TEXT NOT NULL, document TEXT NOT NULL, created_at BIGINT NOT NULL)",
    """CREATE TABLE runs (run_id TEXT PRIMARY KEY, flow_hash TEXT NOT NULL, flow_name TEXT NOT NULL, flow_source TEXT,
        status TEXT NOT NULL, seq BIGINT NOT NULL, input TEXT NOT NULL, error TEXT, parent_run_id TEXT,
        parent_node_run_id TEXT, forked_from TEXT, forked_at BIGINT, created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL, lease_owner TEXT, lease_expires_at BIGINT)""",
    """CREATE TABLE events (run_id TEXT NOT NULL, seq BIGINT NOT NULL, type TEXT NOT NULL, node_id TEXT,
        node_run_id TEXT, ts BIGINT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (run_id, seq))""",
    "CREATE TABLE checkpoints (run_id TEXT NOT NULL, seq BIGINT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (run_id, seq))",
    "CREATE TABLE blobs (key TEXT PRIMARY KEY, body TEXT NOT NULL)",
    "PRAGMA user_version = 2",
]


def test_a_version_2_database_is_migrated_and_its_runs_read_back_the_same(tmp_path: Path) -> None:
    source = Kernel(MemoryStore())
    hello = source.load_flow(ROOT / "flows" / "hello.json")
    snaps = [anyio.run(source.run, hello, {"name": name}) for name in ("Ada", "Grace")]
    db_path = tmp_path / "old.db"
    db = sqlite3.connect(db_path)
    for stmt in V2:
        db.execute(stmt)
    db.execute("INSERT INTO flows VALUES (?, ?, ?, 0)", (hello.hash, hello.name, source.store.get_flow(hello.hash)))
    for snap in snaps:
        record = source.store.get_run(snap.runId)
        db.execute("INSERT INTO runs (run_id, flow_hash, flow_name, status, seq, input, created_at, updated_at) "
                   "VALUES (?, ?, ?, ?, ?, '{}', ?, ?)", (snap.runId, hello.hash, hello.name, snap.status, snap.seq,
                                                          record.createdAt, record.updatedAt))
        for i, body in enumerate(source.store.read_events(snap.runId), start=1):
            db.execute("INSERT INTO events VALUES (?, ?, 'x', NULL, NULL, 0, ?)", (snap.runId, i, body.decode()))
        seq, skeleton = source.store.read_checkpoint(snap.runId) or (0, b"")
        db.execute("INSERT INTO checkpoints VALUES (?, 1, 'an older one')", (snap.runId,))
        db.execute("INSERT INTO checkpoints VALUES (?, ?, ?)", (snap.runId, seq, skeleton.decode()))
        for key, blob in source.store._blobs.items():
            db.execute("INSERT OR IGNORE INTO blobs VALUES (?, ?)", (key, blob.decode()))
    db.commit()
    db.close()

    kernel = Kernel(SqliteStore(db_path, backfill=AgentRunBackfill(default_registry())))
    for snap in snaps:
        assert [e.seq for e in kernel.events(snap.runId)] == list(range(1, snap.seq + 1))
        assert kernel.snapshot(snap.runId) == snap  # from the newest checkpoint, which was kept
        assert kernel.store.read_checkpoint(snap.runId) == source.store.read_checkpoint(snap.runId)
        assert kernel.store.get_run(snap.runId).seq == snap.seq
    later = anyio.run(kernel.run, hello, {"name": "Lin"})
    assert later.status == "completed" and len(kernel.runs()) == 3
    check = sqlite3.connect(db_path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert check.execute("SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_autoindex_events_1'").fetchone()[0] == 0
    check.close()


# Schema version 4 as it was released (before run usage and cost, idempotency keys and agent runs),
# with ``{id}``, ``{key}`` and ``{body}`` as in flowkernel.store.sql.store.
V4 = [
    "CREATE TABLE flows (hash TEXT PRIMARY KEY, name TEXT NOT NULL, document TEXT NOT NULL, created_at BIGINT NOT NULL)",
    """CREATE TABLE runs (run_id TEXT PRIMARY KEY, flow_hash TEXT NOT NULL, flow_name TEXT NOT NULL, flow_source TEXT,
        status TEXT NOT NULL, seq BIGINT NOT NULL, input TEXT NOT NULL, error TEXT, parent_run_id TEXT,
        parent_node_run_id TEXT, forked_from TEXT, forked_at BIGINT, created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL, lease_owner TEXT, lease_expires_at BIGINT, run_no BIGINT)""",
    "CREATE UNIQUE INDEX runs_run_no ON runs (run_no)",
    "CREATE TABLE events (id {key}, ts BIGINT NOT NULL, body {body} NOT NULL)",
    "CREATE TABLE checkpoints (run_id TEXT PRIMARY KEY, seq BIGINT NOT NULL, body {body} NOT NULL)",
    "CREATE TABLE blobs (key TEXT PRIMARY KEY, body {body} NOT NULL)",
    "CREATE TABLE commands (id {id}, run_id TEXT NOT NULL, body TEXT NOT NULL, created_at BIGINT NOT NULL, taken_seq BIGINT)",
    """CREATE TABLE agent_messages (id {id}, flow_run_id TEXT NOT NULL, run_id TEXT NOT NULL, node_id TEXT NOT NULL,
        session_id TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL, step INTEGER NOT NULL,
        created_at BIGINT NOT NULL)""",
    """CREATE TABLE agent_tool_calls (id {id}, flow_run_id TEXT NOT NULL, run_id TEXT NOT NULL, node_id TEXT NOT NULL,
        session_id TEXT NOT NULL, message_id BIGINT, tool_name TEXT NOT NULL, tool_use_id TEXT NOT NULL, input TEXT,
        output TEXT, status TEXT NOT NULL, duration_ms BIGINT, step INTEGER NOT NULL, created_at BIGINT NOT NULL)""",
]


def _write_v4(db: Any, source: Kernel, snaps: list[Any], *, param: str, blob: Any) -> None:
    """Copy ``source``'s runs into a version-4 database through the DB-API connection ``db``."""
    hello_hash = source.store.get_run(snaps[0].runId).flowHash
    q = lambda sql: sql.replace("?", param)  # noqa: E731
    db.execute(q("INSERT INTO flows VALUES (?, ?, ?, 0)"), (hello_hash, "hello", source.store.get_flow(hello_hash)))
    for no, snap in enumerate(snaps, start=1):
        record = source.store.get_run(snap.runId)
        db.execute(q("INSERT INTO runs (run_id, flow_hash, flow_name, status, seq, input, created_at, updated_at, "
                     "run_no) VALUES (?, ?, 'hello', ?, ?, '{}', ?, ?, ?)"),
                   (snap.runId, hello_hash, snap.status, snap.seq, record.createdAt, record.updatedAt, no))
        for i, body in enumerate(source.store.read_events(snap.runId), start=1):
            db.execute(q("INSERT INTO events VALUES (?, ?, ?)"), (no * 2**32 + i, record.createdAt, blob(body)))
        seq, skeleton = source.store.read_checkpoint(snap.runId) or (0, b"")
        db.execute(q("INSERT INTO checkpoints VALUES (?, ?, ?)"), (snap.runId, seq, blob(skeleton)))
    for key, body in source.store._blobs.items():  # type: ignore[attr-defined]
        db.execute(q("INSERT INTO blobs VALUES (?, ?) ON CONFLICT DO NOTHING"), (key, blob(body)))


def _check_v5(kernel: Kernel, snaps: list[Any]) -> None:
    for snap in snaps:
        assert kernel.snapshot(snap.runId) == snap
        record = kernel.store.get_run(snap.runId)  # version 8: not the pool's, never leased, no limit
        assert (record.leaseEpoch, record.pooled, record.maxRuns) == (0, False, None)
        summary = kernel.summary(snap.runId)
        assert summary.totalCostUsd == 0.0 and summary.usage.inputTokens == 0  # no agent:usage events: zero
    page, cursor = kernel.run_page(limit=1)
    assert [r.runId for r in page] == [snaps[1].runId] and cursor is not None
    later = anyio.run(kernel.run, kernel.flow_of(snaps[0].runId), {"name": "Lin"})
    assert later.status == "completed"
    assert [r.runId for r in kernel.run_page()[0]] == [later.runId, snaps[1].runId, snaps[0].runId]


def _hello_runs() -> tuple[Kernel, list[Any]]:
    source = Kernel(MemoryStore())
    hello = source.load_flow(ROOT / "flows" / "hello.json")
    return source, [anyio.run(source.run, hello, {"name": name}) for name in ("Ada", "Grace")]


def test_a_version_4_sqlite_database_is_migrated_to_version_5(tmp_path: Path) -> None:
    source, snaps = _hello_runs()
    db_path = tmp_path / "v4.db"
    db = sqlite3.connect(db_path)
    for stmt in V4:
        db.execute(stmt.replace("{id}", "INTEGER PRIMARY KEY AUTOINCREMENT").replace("{key}", "INTEGER PRIMARY KEY")
                   .replace("{body}", "TEXT"))
    _write_v4(db, source, snaps, param="?", blob=lambda b: b.decode())
    db.execute("PRAGMA user_version = 4")
    db.commit()
    db.close()
    kernel = Kernel(SqliteStore(db_path, backfill=AgentRunBackfill(default_registry())))
    _check_v5(kernel, snaps)
    kernel.close()
    check = sqlite3.connect(db_path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 12
    assert check.execute("SELECT count(*) FROM run_traces").fetchone()[0] == 0
    assert check.execute("SELECT count(*) FROM session_entries").fetchone()[0] == 0  # version 12
    assert check.execute("SELECT count(*) FROM agent_runs").fetchone()[0] == 0
    assert "model_call" in [r[1] for r in check.execute("PRAGMA table_info(agent_messages)")]
    assert "settings" in [r[1] for r in check.execute("PRAGMA table_info(runs)")]  # version 10
    check.close()


def test_a_version_4_postgres_database_is_migrated_to_version_5(pg_url: str) -> None:  # noqa: F811
    import psycopg
    from flowkernel.store.sql.postgres import PostgresStore

    source, snaps = _hello_runs()
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("CREATE TABLE flowkernel_meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)")
        db.execute("INSERT INTO flowkernel_meta VALUES ('changes', 0), ('schema_version', 4)")
        for stmt in V4:
            db.execute(stmt.replace("{id}", "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")
                       .replace("{key}", "BIGINT PRIMARY KEY").replace("{body}", "BYTEA"))
        _write_v4(db, source, snaps, param="%s", blob=bytes)
    kernel = Kernel(PostgresStore(pg_url, backfill=AgentRunBackfill(default_registry())))
    _check_v5(kernel, snaps)
    kernel.close()
    with psycopg.connect(pg_url) as db:
        row = db.execute("SELECT value FROM flowkernel_meta WHERE key = 'schema_version'").fetchone()
        assert row is not None and row[0] == SCHEMA_VERSION
        columns = [r[0] for r in db.execute("SELECT column_name FROM information_schema.columns "
                                            "WHERE table_name = 'runs' AND table_schema = current_schema()")]
        assert "settings" in columns  # version 10


def _agent_run_then_version_8(db: Any, fake: Any, kernel_for: Any) -> tuple[str, list[Any]]:
    """A run with an agent, stored at the current version, then taken back to version 8: its
    agent-run rows gone (nothing wrote them then) and the unique index of that version back."""
    from tests.claude_support import agent_flow

    fake.script(reply(ToolUse("ask_human", {"question": "Which?"})), reply(Text("That one.")))
    kernel = kernel_for()
    snap = anyio.run(kernel.run, kernel.compile(agent_flow(prompt="Pick", tools=["ask_human"])), {})
    snap = anyio.run(kernel.reply, snap.runId, snap.waiting["agent"].runId, "the first")
    assert snap.status == "completed"
    rows = [r for _, r in kernel.store.list_agent_runs(run_id=snap.runId)]
    assert [r.status for r in rows] == ["completed", "interrupted"]
    kernel.close()
    db.execute("DELETE FROM agent_runs")
    db.execute("DROP INDEX agent_runs_node_run")
    db.execute("CREATE UNIQUE INDEX agent_runs_key ON agent_runs (agent_run_id)")
    db.execute("ALTER TABLE runs DROP COLUMN settings")  # version 10
    return snap.runId, rows


def test_a_version_8_database_gets_the_agent_runs_of_its_logs(tmp_path: Path) -> None:
    from flowkernel.testing.fake_api import FakeAnthropic

    from tests.claude_support import make_kernel

    with FakeAnthropic() as fake:
        db = sqlite3.connect(tmp_path / "runs.db", isolation_level=None)
        run_id, rows = _agent_run_then_version_8(db, fake, lambda: make_kernel(tmp_path, fake))
        db.execute("PRAGMA user_version = 8")
        db.close()
    store = SqliteStore(tmp_path / "runs.db", backfill=AgentRunBackfill(default_registry()))
    assert [r for _, r in store.list_agent_runs(run_id=run_id)] == rows
    store.close()
    # The conftest audit folds the log again and compares, and the new key takes a fork's copies.
    check = sqlite3.connect(tmp_path / "runs.db")
    assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    indexes = {r[1]: r[2] for r in check.execute("PRAGMA index_list(agent_runs)")}
    assert "agent_runs_key" not in indexes and indexes["agent_runs_node_run"] == 1
    check.close()


def test_a_version_8_postgres_database_gets_the_agent_runs_of_its_logs(tmp_path: Path, pg_url: str) -> None:  # noqa: F811
    import psycopg
    from flowkernel.agents.anthropic import AnthropicQuery
    from flowkernel.store.sql.postgres import PostgresStore
    from flowkernel.testing.audit import audit_run
    from flowkernel.testing.fake_api import FakeAnthropic

    with FakeAnthropic() as fake, psycopg.connect(pg_url, autocommit=True) as db:
        query = AnthropicQuery(base_url=fake.base_url, api_key="test", backoff_s=0.01, max_retries=3)
        run_id, rows = _agent_run_then_version_8(
            db, fake, lambda: Kernel(PostgresStore(pg_url), services={"query_fn": query}))
        db.execute("UPDATE flowkernel_meta SET value = 8 WHERE key = 'schema_version'")
    store = PostgresStore(pg_url, backfill=AgentRunBackfill(default_registry()))
    assert [r for _, r in store.list_agent_runs(run_id=run_id)] == rows
    audit_run(store, run_id)
    store.close()


def test_a_version_8_database_opened_without_what_folds_agent_runs_is_refused_unchanged(tmp_path: Path) -> None:
    from flowkernel.errors import StoreError
    from flowkernel.testing.fake_api import FakeAnthropic

    from tests.claude_support import make_kernel

    with FakeAnthropic() as fake:
        db = sqlite3.connect(tmp_path / "runs.db", isolation_level=None)
        run_id, rows = _agent_run_then_version_8(db, fake, lambda: make_kernel(tmp_path, fake))
        db.execute("PRAGMA user_version = 8")
        db.close()
    with pytest.raises(StoreError) as refused:
        SqliteStore(tmp_path / "runs.db")
    assert "open it once with the flowkernel command or Kernel(url)" in str(refused.value)
    check = sqlite3.connect(tmp_path / "runs.db")
    assert check.execute("PRAGMA user_version").fetchone()[0] == 8  # nothing was migrated
    check.close()
    kernel = Kernel(str(tmp_path / "runs.db"))  # what the message says works: the agent runs are folded
    assert [r for _, r in kernel.store.list_agent_runs(run_id=run_id)] == rows
    kernel.close()
