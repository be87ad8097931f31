"""A database written by an earlier schema version opens, migrates in place and loses nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
from flowkernel.api import Kernel
from flowkernel.store.memory import MemoryStore
from flowkernel.store.sql import SCHEMA_VERSION
from flowkernel.store.sqlite import SqliteStore

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

    kernel = Kernel(SqliteStore(db_path))
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
