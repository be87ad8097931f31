"""The SQLite store: one file, WAL, ``synchronous=FULL``; every commit is durable when it returns.

SQL is kept portable (the PostgreSQL store runs the same statements with ``%s`` placeholders).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kernel.errors import StoreError, UnknownRunError
from kernel.ids import now_ms
from kernel.store.base import CommandRow, EventRow, RunRecord

SCHEMA_VERSION = 2  # 2: content-addressed checkpoint blobs

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS flows (
        hash TEXT PRIMARY KEY, name TEXT NOT NULL, document TEXT NOT NULL, created_at BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY, flow_hash TEXT NOT NULL, flow_name TEXT NOT NULL, flow_source TEXT,
        status TEXT NOT NULL, seq BIGINT NOT NULL, input TEXT NOT NULL, error TEXT,
        parent_run_id TEXT, parent_node_run_id TEXT, forked_from TEXT, forked_at BIGINT,
        created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, lease_owner TEXT, lease_expires_at BIGINT)""",
    "CREATE INDEX IF NOT EXISTS runs_status ON runs (status, created_at)",
    "CREATE INDEX IF NOT EXISTS runs_parent ON runs (parent_run_id)",
    """CREATE TABLE IF NOT EXISTS events (
        run_id TEXT NOT NULL, seq BIGINT NOT NULL, type TEXT NOT NULL, node_id TEXT, node_run_id TEXT,
        ts BIGINT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (run_id, seq))""",
    """CREATE TABLE IF NOT EXISTS checkpoints (
        run_id TEXT NOT NULL, seq BIGINT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (run_id, seq))""",
    """CREATE TABLE IF NOT EXISTS blobs (key TEXT PRIMARY KEY, body TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS commands (
        id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, body TEXT NOT NULL,
        created_at BIGINT NOT NULL, taken_seq BIGINT)""",
    "CREATE INDEX IF NOT EXISTS commands_pending ON commands (run_id, taken_seq)",
    """CREATE TABLE IF NOT EXISTS agent_messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT, flow_run_id TEXT NOT NULL, run_id TEXT NOT NULL,
        node_id TEXT NOT NULL, session_id TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
        step INTEGER NOT NULL, created_at BIGINT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS agent_messages_session ON agent_messages (session_id, id)",
    "CREATE INDEX IF NOT EXISTS agent_messages_run ON agent_messages (run_id, id)",
    """CREATE TABLE IF NOT EXISTS agent_tool_calls (
        id INTEGER PRIMARY KEY AUTOINCREMENT, flow_run_id TEXT NOT NULL, run_id TEXT NOT NULL,
        node_id TEXT NOT NULL, session_id TEXT NOT NULL, message_id BIGINT, tool_name TEXT NOT NULL,
        tool_use_id TEXT NOT NULL, input TEXT, output TEXT, status TEXT NOT NULL, duration_ms BIGINT,
        step INTEGER NOT NULL, created_at BIGINT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS agent_tool_calls_run ON agent_tool_calls (run_id, id)",
]

_RUN_COLUMNS = ("run_id, flow_name, flow_hash, status, seq, input, created_at, updated_at, error, parent_run_id, "
                "parent_node_run_id, forked_from, forked_at, flow_source, lease_owner, lease_expires_at")
# The run row is rewritten only when the status changes; the latest seq and time come from the log.
_RUN_SELECT = (
    "run_id, flow_name, flow_hash, status, "
    "(SELECT MAX(e.seq) FROM events e WHERE e.run_id = runs.run_id), input, created_at, "
    "(SELECT e.ts FROM events e WHERE e.run_id = runs.run_id ORDER BY e.seq DESC LIMIT 1), error, "
    "parent_run_id, parent_node_run_id, forked_from, forked_at, flow_source, lease_owner, lease_expires_at")


def _record(row: Sequence[Any]) -> RunRecord:
    return RunRecord(runId=row[0], flowName=row[1], flowHash=row[2], status=row[3], seq=row[4],
                     input=json.loads(row[5]), createdAt=row[6], updatedAt=row[7], error=row[8],
                     parentRunId=row[9], parentNodeRunId=row[10], forkedFrom=row[11], forkedAt=row[12],
                     flowSource=row[13], leaseOwner=row[14], leaseExpiresAt=row[15])


class SqliteStore:
    """Runs in one SQLite file. Safe to share between processes; one connection per store object."""

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        if not create and not self.path.exists():
            raise StoreError(f"{self.path}: no such database; a run creates it")
        if self.path.exists() and self.path.is_dir():
            raise StoreError(f"{self.path}: is a directory, not a database file")
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        timeout = float(os.environ.get("FLOWKERNEL_BUSY_TIMEOUT_MS", "5000")) / 1000
        self._lock = threading.RLock()
        self._known_status: dict[str, tuple[str, str | None]] = {}
        try:
            self._db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
            self._prepare()
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None

    def _error(self, exc: sqlite3.Error) -> StoreError:
        text = str(exc)
        if "locked" in text or "busy" in text:
            return StoreError(f"{self.path}: database is locked by another process ({text}); try again")
        if "not a database" in text or "malformed" in text or "corrupt" in text:
            return StoreError(f"{self.path}: not a flowkernel database or corrupt ({text})")
        return StoreError(f"{self.path}: {text}")

    def _prepare(self) -> None:
        db = self._db
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path}: schema version {version} is newer than this flowkernel's {SCHEMA_VERSION}")
        if version == 0 and tables:
            raise StoreError(f"{self.path}: not a flowkernel database (it has other tables)")
        if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA foreign_keys=OFF")
        if version < SCHEMA_VERSION:
            with self._tx():
                for stmt in SCHEMA:
                    db.execute(stmt)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._error(exc) from None
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._db.execute("ROLLBACK")
                raise self._error(exc) from None

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            try:
                return self._db.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise self._error(exc) from None

    # -- flows and runs ---------------------------------------------------------------------

    def put_flow(self, flow_hash: str, name: str, document: str) -> None:
        if self._query("SELECT 1 FROM flows WHERE hash = ?", (flow_hash,)):
            return
        try:
            with self._tx() as db:
                db.execute("INSERT INTO flows (hash, name, document, created_at) VALUES (?, ?, ?, ?) "
                           "ON CONFLICT (hash) DO NOTHING", (flow_hash, name, document, now_ms()))
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def get_flow(self, flow_hash: str) -> str:
        rows = self._query("SELECT document FROM flows WHERE hash = ?", (flow_hash,))
        if not rows:
            raise StoreError(f"{self.path}: flow {flow_hash} is missing")
        return str(rows[0][0])

    def create_run(self, record: RunRecord, events: Sequence[EventRow], checkpoint: bytes,
                   blobs: Mapping[str, bytes] | None = None) -> None:
        try:
            with self._tx() as db:
                db.execute(
                    f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({', '.join('?' * 16)})",
                    (record.runId, record.flowName, record.flowHash, record.status, record.seq,
                     json.dumps(record.input), record.createdAt, record.updatedAt, record.error,
                     record.parentRunId, record.parentNodeRunId, record.forkedFrom, record.forkedAt,
                     record.flowSource, record.leaseOwner, record.leaseExpiresAt))
                self._insert_events(db, record.runId, events)
                self._insert_blobs(db, blobs)
                db.execute("INSERT INTO checkpoints (run_id, seq, body) VALUES (?, ?, ?)",
                           (record.runId, record.seq, checkpoint.decode()))
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    @staticmethod
    def _insert_blobs(db: sqlite3.Connection, blobs: Mapping[str, bytes] | None) -> None:
        # Content-addressed: a blob that exists already is the same bytes; writing it again changes nothing.
        if blobs:
            db.executemany("INSERT INTO blobs (key, body) VALUES (?, ?) ON CONFLICT (key) DO NOTHING",
                           [(k, v.decode()) for k, v in blobs.items()])

    def read_blobs(self, keys: Iterable[str]) -> dict[str, bytes]:
        wanted = list(keys)
        found: dict[str, bytes] = {}
        for i in range(0, len(wanted), 500):
            part = wanted[i:i + 500]
            marks = ", ".join("?" * len(part))
            for key, body in self._query(f"SELECT key, body FROM blobs WHERE key IN ({marks})", part):
                found[key] = body.encode()
        return found

    @staticmethod
    def _insert_events(db: sqlite3.Connection, run_id: str, events: Sequence[EventRow]) -> None:
        db.executemany(
            "INSERT INTO events (run_id, seq, type, node_id, node_run_id, ts, body) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(run_id, seq, typ, node, nr, ts, body.decode()) for seq, typ, node, nr, ts, body in events])

    def get_run(self, run_id: str) -> RunRecord:
        rows = self._query(f"SELECT {_RUN_SELECT} FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            raise UnknownRunError(run_id, str(self.path))
        return _record(rows[0])

    def list_runs(self, status: str | None = None, parent: str | None = None, limit: int = 1000) -> list[RunRecord]:
        sql = f"SELECT {_RUN_SELECT} FROM runs WHERE 1 = 1"
        params: list[Any] = []
        if status is not None:
            sql += " AND status = ?"
            params.append(status)
        if parent is not None:
            sql += " AND parent_run_id = ?"
            params.append(parent)
        sql += " ORDER BY created_at DESC, run_id DESC LIMIT ?"
        params.append(limit)
        return [_record(r) for r in self._query(sql, params)]

    # -- the log ----------------------------------------------------------------------------

    def commit(self, run_id: str, events: Sequence[EventRow], status: str, seq: int, error: str | None,
               checkpoint: bytes | None, blobs: Mapping[str, bytes] | None = None) -> None:
        try:
            with self._tx() as db:
                self._insert_events(db, run_id, events)
                if self._known_status.get(run_id) != (status, error):
                    db.execute("UPDATE runs SET status = ?, seq = ?, error = ?, updated_at = ? WHERE run_id = ?",
                               (status, seq, error, now_ms(), run_id))
                self._insert_blobs(db, blobs)
                if checkpoint is not None:
                    # Compaction: the newest checkpoint replaces the older ones.
                    db.execute("DELETE FROM checkpoints WHERE run_id = ?", (run_id,))
                    db.execute("INSERT INTO checkpoints (run_id, seq, body) VALUES (?, ?, ?)",
                               (run_id, seq, checkpoint.decode()))
            self._known_status[run_id] = (status, error)
        except sqlite3.IntegrityError as exc:
            self._known_status.pop(run_id, None)
            raise StoreError(f"run {run_id}: events out of order ({exc}); is another process executing it?") from None
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def read_events(self, run_id: str, after: int = 0, until: int | None = None) -> list[bytes]:
        self.get_run(run_id)
        if until is None:
            rows = self._query("SELECT body FROM events WHERE run_id = ? AND seq > ? ORDER BY seq", (run_id, after))
        else:
            rows = self._query("SELECT body FROM events WHERE run_id = ? AND seq > ? AND seq <= ? ORDER BY seq",
                               (run_id, after, until))
        return [r[0].encode() for r in rows]

    def read_checkpoint(self, run_id: str, at_most: int | None = None) -> tuple[int, bytes] | None:
        rows = self._query(
            "SELECT seq, body FROM checkpoints WHERE run_id = ? AND seq <= ? ORDER BY seq DESC LIMIT 1",
            (run_id, at_most if at_most is not None else 2**62))
        return (int(rows[0][0]), rows[0][1].encode()) if rows else None

    # -- commands ---------------------------------------------------------------------------

    def enqueue_command(self, run_id: str, body: dict[str, Any]) -> int:
        with self._tx() as db:
            cur = db.execute("INSERT INTO commands (run_id, body, created_at) VALUES (?, ?, ?)",
                             (run_id, json.dumps(body), now_ms()))
            return int(cur.lastrowid or 0)

    def pending_commands(self, run_id: str) -> list[CommandRow]:
        rows = self._query("SELECT id, run_id, body, created_at FROM commands "
                           "WHERE run_id = ? AND taken_seq IS NULL ORDER BY id", (run_id,))
        return [CommandRow(id=r[0], runId=r[1], body=json.loads(r[2]), createdAt=r[3]) for r in rows]

    def finish_command(self, command_id: int, seq: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE commands SET taken_seq = ? WHERE id = ?", (seq, command_id))

    def change_token(self) -> int:
        # data_version changes when another connection commits: a cheap "anything new?" probe.
        return int(self._query("PRAGMA data_version")[0][0])

    # -- leases -----------------------------------------------------------------------------

    def acquire_lease(self, run_id: str, owner: str, now_ms: int, ttl_ms: int,
                      steal_from: str | None = None) -> str | None:
        with self._tx() as db:
            row = db.execute("SELECT lease_owner, lease_expires_at FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                raise UnknownRunError(run_id, str(self.path))
            holder, expires = row
            if holder is not None and holder not in (owner, steal_from) and (expires or 0) > now_ms:
                return str(holder)
            db.execute("UPDATE runs SET lease_owner = ?, lease_expires_at = ? WHERE run_id = ?",
                       (owner, now_ms + ttl_ms, run_id))
            return None

    def release_lease(self, run_id: str, owner: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL "
                       "WHERE run_id = ? AND lease_owner = ?", (run_id, owner))

    # -- agent conversations ----------------------------------------------------------------

    def add_agent_message(self, row: dict[str, Any]) -> int:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO agent_messages (flow_run_id, run_id, node_id, session_id, role, content, step, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (row["flowRunId"], row["runId"], row["nodeId"], row["sessionId"], row["role"],
                 json.dumps(row["content"]), row["step"], row.get("createdAt") or now_ms()))
            return int(cur.lastrowid or 0)

    def list_agent_messages(self, *, run_id: str | None = None, session_id: str | None = None,
                            flow_run_id: str | None = None, after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        sql = ("SELECT id, flow_run_id, run_id, node_id, session_id, role, content, step, created_at "
               "FROM agent_messages WHERE id > ?")
        params: list[Any] = [after]
        for col, val in (("run_id", run_id), ("session_id", session_id), ("flow_run_id", flow_run_id)):
            if val is not None:
                sql += f" AND {col} = ?"
                params.append(val)
        sql += " ORDER BY id LIMIT ?"
        params.append(limit)
        return [{"id": r[0], "flowRunId": r[1], "runId": r[2], "nodeId": r[3], "sessionId": r[4], "role": r[5],
                 "content": json.loads(r[6]), "step": r[7], "createdAt": r[8]} for r in self._query(sql, params)]

    def add_tool_call(self, row: dict[str, Any]) -> int:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO agent_tool_calls (flow_run_id, run_id, node_id, session_id, message_id, tool_name, "
                "tool_use_id, input, output, status, duration_ms, step, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (row["flowRunId"], row["runId"], row["nodeId"], row["sessionId"], row.get("messageId"),
                 row["toolName"], row["toolUseId"], json.dumps(row.get("input")), json.dumps(row.get("output")),
                 row["status"], row.get("durationMs"), row["step"], row.get("createdAt") or now_ms()))
            return int(cur.lastrowid or 0)

    def list_tool_calls(self, *, run_id: str | None = None, session_id: str | None = None,
                        flow_run_id: str | None = None, tool_name: str | None = None, status: str | None = None,
                        after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        sql = ("SELECT id, flow_run_id, run_id, node_id, session_id, message_id, tool_name, tool_use_id, input, "
               "output, status, duration_ms, step, created_at FROM agent_tool_calls WHERE id > ?")
        params: list[Any] = [after]
        for col, val in (("run_id", run_id), ("session_id", session_id), ("flow_run_id", flow_run_id),
                         ("tool_name", tool_name), ("status", status)):
            if val is not None:
                sql += f" AND {col} = ?"
                params.append(val)
        sql += " ORDER BY id LIMIT ?"
        params.append(limit)
        return [{"id": r[0], "flowRunId": r[1], "runId": r[2], "nodeId": r[3], "sessionId": r[4], "messageId": r[5],
                 "toolName": r[6], "toolUseId": r[7], "input": json.loads(r[8]) if r[8] else None,
                 "output": json.loads(r[9]) if r[9] else None, "status": r[10], "durationMs": r[11],
                 "step": r[12], "createdAt": r[13]} for r in self._query(sql, params)]

    def close(self) -> None:
        with self._lock:
            self._db.close()
