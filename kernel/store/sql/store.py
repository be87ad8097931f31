"""What the SQL stores share: the statements and the method bodies (the schema: ``schema``; the row
mappers: ``rows``; commands, leases and the queue: ``queue``; agent rows: ``agent_rows``).

``SqlStore`` holds everything that is the same in ``SqliteStore`` and ``PostgresStore``. Statements
are written once with ``?`` placeholders in class attributes named ``_sql_*``; a subclass that sets
``param = "%s"`` gets them rewritten once, when its class is defined (never per call). Statements
built per call (filters, ``IN`` lists) use ``self.param``. A subclass supplies only the dialect:
the connection, ``_tx``/``_query`` (driver errors become ``StoreError``), how a body is stored
(``_enc``/``_dec``), ``_executemany``, ``change_token`` and whatever else differs.
"""

from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from flowkernel.core.events import USAGE_KEYS
from flowkernel.errors import LeaseLostError, StoreError, UnknownRunError
from flowkernel.ids import now_ms
from flowkernel.store.base import (
    AgentRun,
    Backfill,
    CommitRequest,
    CreateRequest,
    EventRow,
    Lease,
    RunRecord,
    RunTotals,
)
from flowkernel.store.packing import resolve_bodies
from flowkernel.store.sql.agent_rows import SqlAgentRows
from flowkernel.store.sql.archive import RUN_SPAN, SqlArchive
from flowkernel.store.sql.queue import SqlQueue
from flowkernel.store.sql.rows import (
    AGENT_RUN_COLUMNS,
    LAST_EVENT,
    RUN_COLUMNS,
    RUN_SELECT,
    USAGE_COLUMNS,
    agent_run_values,
    like_escape,
    record_of,
)
from flowkernel.store.sql.schema import SCHEMA_TEMPLATE as SCHEMA_TEMPLATE
from flowkernel.store.sql.schema import SCHEMA_VERSION as SCHEMA_VERSION
from flowkernel.store.sql.schema import migrations as migrations
from flowkernel.store.sql.schema import schema as schema
from flowkernel.store.sql.sessions import SqlSessions

_EVENTS_PER_INSERT = 100  # rows per INSERT statement (300 parameters, far below either driver's limit)


class SqlStore(SqlQueue, SqlAgentRows, SqlArchive, SqlSessions, ABC):
    """The ``Store`` protocol over SQL; subclasses supply the dialect (see the module docstring)."""

    location: str
    #: The driver's placeholder; statements in ``_sql_*`` attributes are rewritten to it at class definition.
    param: ClassVar[str] = "?"

    # What a unique-key violation in ``create_run``/``commit`` is reported as: ``{location}``, ``{run}``
    # and ``{detail}`` (the driver's words) are filled in. None: the store's generic error.
    _RUN_EXISTS: ClassVar[str | None]
    _OUT_OF_ORDER: ClassVar[str]

    _sql_flow_exists: ClassVar[str] = "SELECT 1 FROM flows WHERE hash = ?"
    _sql_insert_flow: ClassVar[str] = ("INSERT INTO flows (hash, name, document, created_at) VALUES (?, ?, ?, ?) "
                                       "ON CONFLICT (hash) DO NOTHING")
    _sql_get_flow: ClassVar[str] = "SELECT document FROM flows WHERE hash = ?"
    _sql_get_secret: ClassVar[str] = "SELECT value FROM secrets WHERE name = ?"
    _sql_insert_secret: ClassVar[str] = ("INSERT INTO secrets (name, value, created_at) VALUES (?, ?, ?) "
                                         "ON CONFLICT (name) DO NOTHING")
    _sql_insert_run: ClassVar[str] = f"INSERT INTO runs ({RUN_COLUMNS}) VALUES ({', '.join('?' * 26)})"
    _sql_set_settings: ClassVar[str] = "UPDATE runs SET settings = ? WHERE run_id = ?"
    _sql_set_flow: ClassVar[str] = "UPDATE runs SET flow_hash = ?, flow_source = ? WHERE run_id = ?"
    _sql_set_totals: ClassVar[str] = (f"UPDATE runs SET {' = ?, '.join(USAGE_COLUMNS)} = ? WHERE run_id = ?")
    _sql_find_idempotent: ClassVar[str] = f"SELECT {RUN_SELECT} FROM runs WHERE idempotency_key = ?"
    _sql_get_run: ClassVar[str] = f"SELECT {RUN_SELECT} FROM runs WHERE run_id = ?"
    # One checkpoint per run, replaced in place: compaction rewrites one row, not a row and its index.
    _sql_put_checkpoint: ClassVar[str] = ("INSERT INTO checkpoints (run_id, seq, body) VALUES (?, ?, ?) "
                                          "ON CONFLICT (run_id) DO UPDATE SET seq = excluded.seq, body = excluded.body")
    _sql_insert_blob: ClassVar[str] = "INSERT INTO blobs (key, body) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"
    _sql_next_run_no: ClassVar[str] = "SELECT COALESCE(MAX(run_no), 0) + 1 FROM runs"
    _sql_set_run_no: ClassVar[str] = "UPDATE runs SET run_no = ? WHERE run_id = ?"
    _sql_run_no: ClassVar[str] = "SELECT run_no FROM runs WHERE run_id = ?"
    _sql_update_status: ClassVar[str] = ("UPDATE runs SET status = ?, seq = ?, error = ?, updated_at = ? "
                                         "WHERE run_id = ?")
    # The same, ending the lease the commit was checked against.
    _sql_update_status_release: ClassVar[str] = (
        "UPDATE runs SET status = ?, seq = ?, error = ?, updated_at = ?, lease_owner = NULL, lease_expires_at = NULL "
        "WHERE run_id = ?")
    _sql_read_events: ClassVar[str] = "SELECT body FROM events WHERE id > ? AND id <= ? ORDER BY id"
    _sql_read_checkpoint: ClassVar[str] = ("SELECT seq, body FROM checkpoints WHERE run_id = ? AND seq <= ? "
                                           "ORDER BY seq DESC LIMIT 1")
    _sql_update_agent_run: ClassVar[str] = (
        f"UPDATE agent_runs SET {' = ?, '.join(AGENT_RUN_COLUMNS.split(', ')[2:])} = ? "
        "WHERE agent_run_id = ? AND flow_run_id = ?")
    _sql_insert_agent_run: ClassVar[str] = (
        f"INSERT INTO agent_runs ({AGENT_RUN_COLUMNS}) VALUES ({', '.join('?' * 22)})")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.param != "?":
            for name in dir(cls):
                if name.startswith("_sql_") and isinstance(value := getattr(cls, name), str):
                    setattr(cls, name, value.replace("?", cls.param))

    def __init__(self, location: str, *, backfill: Backfill | None = None) -> None:
        self.location = location
        self._backfill = backfill  # folds agent runs when a database from before schema 9 is migrated
        # (status, error) last written to each run's row by this store: ``commit`` skips the UPDATE when unchanged.
        self._known_status: dict[str, tuple[str, str | None]] = {}
        self._run_nos: dict[str, int] = {}  # run id -> run number (the high half of its events' keys)
        self._insert_events_cache: dict[int, str] = {}  # rows -> the INSERT for that many events

    # -- the dialect ------------------------------------------------------------------------

    @abstractmethod
    def _tx(self, conflict: str | None = None, run: str = "") -> AbstractContextManager[Any]:
        """One transaction yielding the connection; driver errors become StoreError, and a unique-key
        violation the ``conflict`` message (formatted with ``run``) when one is given."""

    @abstractmethod
    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one statement outside a transaction and fetch its rows; driver errors become StoreError."""

    @staticmethod
    @abstractmethod
    def _executemany(db: Any, sql: str, rows: list[tuple[Any, ...]]) -> None: ...

    @staticmethod
    @abstractmethod
    def _enc(body: bytes) -> Any:
        """An event, checkpoint or blob body as the ``body`` column stores it."""

    @staticmethod
    @abstractmethod
    def _dec(value: Any) -> bytes:
        """A ``body`` column's value as bytes."""

    @abstractmethod
    def _lock_run_numbers(self, db: Any) -> None:
        """Serialise run-number allocation inside ``create_run``'s transaction."""

    @abstractmethod
    def _lock_keys(self, db: Any, table: str) -> None:
        """Serialise handing out ``table``'s keys inside the inserting transaction, until it commits: a
        row with a higher key can then never be seen before one with a lower key (keyset pages)."""

    @abstractmethod
    def _bump_changes(self, db: Any) -> None:
        """Called in the transaction that enqueues a command, so that ``change_token`` moves."""

    # -- flows and runs ---------------------------------------------------------------------

    def put_flow(self, flow_hash: str, name: str, document: str) -> None:
        if self._query(self._sql_flow_exists, (flow_hash,)):
            return
        with self._tx() as db:
            db.execute(self._sql_insert_flow, (flow_hash, name, document, now_ms()))

    def secret(self, name: str) -> bytes:
        rows = self._query(self._sql_get_secret, (name,))
        if not rows:
            # Two processes at once: both insert, one row stays, and both read that one.
            with self._tx() as db:
                db.execute(self._sql_insert_secret, (name, secrets.token_hex(32), now_ms()))
            rows = self._query(self._sql_get_secret, (name,))
        return bytes.fromhex(rows[0][0])

    def get_flow(self, flow_hash: str) -> str:
        rows = self._query(self._sql_get_flow, (flow_hash,))
        if not rows:
            raise StoreError(f"{self.location}: flow {flow_hash} is missing")
        return str(rows[0][0])

    def create_run(self, record: RunRecord, events: Sequence[EventRow], checkpoint: bytes,
                   blobs: Mapping[str, bytes] | None = None, *, document: str | None = None,
                   agent_runs: Sequence[AgentRun] = ()) -> None:
        try:
            with self._tx(self._RUN_EXISTS, record.runId) as db:
                self._create_in(db, CreateRequest(record=record, events=events, checkpoint=checkpoint,
                                                  blobs=blobs, document=document, agent_runs=agent_runs))
        except StoreError:
            self._run_nos.pop(record.runId, None)
            raise

    def _create_in(self, db: Any, r: CreateRequest) -> None:
        """A new run's statements, inside the caller's transaction."""
        record, document, events, blobs, checkpoint = r.record, r.document, r.events, r.blobs, r.checkpoint
        if document is not None:
            db.execute(self._sql_insert_flow, (record.flowHash, record.flowName, document, now_ms()))
        db.execute(
            self._sql_insert_run,
            (record.runId, record.flowName, record.flowHash, record.status, record.seq,
             json.dumps(record.input), record.createdAt, record.updatedAt, record.error,
             record.parentRunId, record.parentNodeRunId, record.forkedFrom, record.forkedAt,
             record.flowSource, record.leaseOwner, record.leaseExpiresAt, record.idempotencyKey,
             *(record.usage.get(k, 0) for k in USAGE_KEYS), record.totalCostUsd, record.leaseEpoch,
             int(record.pooled), record.maxRuns,
             None if record.settings is None else json.dumps(record.settings)))
        self._lock_run_numbers(db)
        run_no = int(db.execute(self._sql_next_run_no).fetchone()[0])
        db.execute(self._sql_set_run_no, (run_no, record.runId))
        self._run_nos[record.runId] = run_no
        self._insert_events(db, record.runId, events)
        self._insert_blobs(db, blobs)
        if events:  # a queued run has neither events nor a checkpoint until a worker starts it
            db.execute(self._sql_put_checkpoint, (record.runId, record.seq, self._enc(checkpoint)))
        elif record.status == "queued":
            self._notify_queue(db)
        self._write_agent_runs(db, r.agent_runs)

    def _backfill_agent_runs(self, db: Any) -> None:
        """Called while migrating a database from before version 9, whose agent runs have no rows yet:
        fold them from the logs of the runs of flows with an agent node, once (with the ``backfill``
        this store was opened with; without one, a database that has runs is refused, unchanged)."""
        backfill = self._backfill
        if backfill is None:
            if db.execute("SELECT 1 FROM runs LIMIT 1").fetchone() is not None:
                raise StoreError(f"{self.location}: this database is from before agent runs were stored (schema "
                                 f"older than 9), and this store was opened without what folds them from its "
                                 f"runs' logs; open it once with the flowkernel command or Kernel(url), or pass "
                                 f"backfill=flowkernel.history.agent_runs.AgentRunBackfill(registry)")
            return
        p = self.param
        for flow_hash, document in db.execute("SELECT hash, document FROM flows").fetchall():
            if not backfill.wants(document):
                continue
            for (run_no,) in db.execute(f"SELECT run_no FROM runs WHERE flow_hash = {p}", (flow_hash,)).fetchall():
                if run_no is None:
                    continue
                base = int(run_no) * RUN_SPAN
                bodies = [self._dec(r[0]) for r in db.execute(self._sql_read_events, (base, base + RUN_SPAN - 1))]
                self._write_agent_runs(db, backfill(document, bodies))

    def _write_agent_runs(self, db: Any, rows: Sequence[AgentRun]) -> None:
        """Update the agent runs that are stored, insert the others (their keys in commit order)."""
        locked = False
        for r in rows:
            values = agent_run_values(r)
            if db.execute(self._sql_update_agent_run, (*values, r.agentRunId, r.runId)).rowcount:
                continue
            if not locked:
                self._lock_keys(db, "agent_runs")
                locked = True
            db.execute(self._sql_insert_agent_run, (r.agentRunId, r.runId, *values))

    def set_run_settings(self, run_id: str, settings: dict[str, Any] | None) -> None:
        with self._tx() as db:
            if db.execute(self._sql_set_settings, (None if settings is None else json.dumps(settings),
                                                   run_id)).rowcount == 0:
                raise UnknownRunError(run_id, self.location)

    def update_run_flow(self, run_id: str, flow_hash: str, name: str, document: str, source: str | None) -> None:
        with self._tx() as db:
            db.execute(self._sql_insert_flow, (flow_hash, name, document, now_ms()))
            if db.execute(self._sql_set_flow, (flow_hash, source, run_id)).rowcount == 0:
                raise UnknownRunError(run_id, self.location)


    def _insert_blobs(self, db: Any, blobs: Mapping[str, bytes] | None) -> None:
        # Content-addressed: a blob that exists already is the same bytes; writing it again changes nothing.
        if blobs:
            enc = self._enc
            self._executemany(db, self._sql_insert_blob, [(k, enc(v)) for k, v in blobs.items()])

    def read_blobs(self, keys: Iterable[str]) -> dict[str, bytes]:
        wanted = list(keys)
        found: dict[str, bytes] = {}
        dec = self._dec
        for i in range(0, len(wanted), 500):
            part = wanted[i:i + 500]
            marks = ", ".join([self.param] * len(part))
            for key, body in self._query(f"SELECT key, body FROM blobs WHERE key IN ({marks})", part):
                found[key] = dec(body)
        return found

    def _run_no(self, run_id: str) -> int:
        run_no = self._run_nos.get(run_id)
        if run_no is None:
            rows = self._query(self._sql_run_no, (run_id,))
            if not rows:
                raise UnknownRunError(run_id, self.location)
            run_no = self._run_nos[run_id] = int(rows[0][0])
        return run_no

    def _insert_events(self, db: Any, run_id: str, events: Sequence[EventRow]) -> None:
        # One statement for the events of a commit (a few, usually): cheaper than executemany's row loop.
        enc = self._enc
        base = self._run_no(run_id) * RUN_SPAN
        for start in range(0, len(events), _EVENTS_PER_INSERT):
            chunk = events[start:start + _EVENTS_PER_INSERT]
            params: list[Any] = []
            for seq, ts, body in chunk:
                params += (base + seq, ts, enc(body))
            db.execute(self._insert_events_sql(len(chunk)), params)

    def _insert_events_sql(self, rows: int) -> str:
        sql = self._insert_events_cache.get(rows)
        if sql is None:
            p = self.param
            sql = self._insert_events_cache[rows] = (
                "INSERT INTO events (id, ts, body) VALUES " + ", ".join([f"({p}, {p}, {p})"] * rows))
        return sql

    def get_run(self, run_id: str) -> RunRecord:
        rows = self._query(self._sql_get_run, (run_id,))
        if not rows:
            raise UnknownRunError(run_id, self.location)
        return record_of(rows[0])

    def list_runs(self, status: str | None = None, parent: str | None = None, limit: int = 1000) -> list[RunRecord]:
        p = self.param
        sql = f"SELECT {RUN_SELECT} FROM runs WHERE 1 = 1"
        params: list[Any] = []
        if status is not None:
            sql += f" AND status = {p}"
            params.append(status)
        if parent is not None:
            sql += f" AND parent_run_id = {p}"
            params.append(parent)
        sql += f" ORDER BY created_at DESC, run_id DESC LIMIT {p}"
        params.append(limit)
        return [record_of(r) for r in self._query(sql, params)]

    def _run_filters(self, status: str | None, flow: str | None, parent: str | None, id_prefix: str | None,
                     error: str | None) -> tuple[str, list[Any]]:
        p = self.param
        sql = ""
        params: list[Any] = []
        for cond, val in (("status =", status), ("flow_name =", flow), ("parent_run_id =", parent)):
            if val is not None:
                sql += f" AND {cond} {p}"
                params.append(val)
        if id_prefix is not None:
            sql += f" AND run_id LIKE {p} ESCAPE '\\'"
            params.append(like_escape(id_prefix) + "%")
        if error is not None:  # both sides lowered by the database: one notion of case per store
            sql += f" AND LOWER(error) LIKE LOWER({p}) ESCAPE '\\'"
            params.append("%" + like_escape(error) + "%")
        return sql, params

    def page_runs(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                  before: int | None = None, limit: int = 50, after: int | None = None, oldest: bool = False,
                  id_prefix: str | None = None, error: str | None = None) -> list[RunRecord]:
        p = self.param
        where, params = self._run_filters(status, flow, parent, id_prefix, error)
        sql = f"SELECT {RUN_SELECT} FROM runs WHERE run_no IS NOT NULL{where}"
        for cond, val in (("run_no <", before), ("run_no >", after)):
            if val is not None:
                sql += f" AND {cond} {p}"
                params.append(val)
        sql += f" ORDER BY run_no {'ASC' if oldest else 'DESC'} LIMIT {p}"
        params.append(limit)
        return [record_of(r) for r in self._query(sql, params)]

    def count_runs(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                   before: int | None = None) -> int:
        p = self.param
        where, params = self._run_filters(status, flow, parent, None, None)
        sql = f"SELECT COUNT(*) FROM runs WHERE run_no IS NOT NULL{where}"
        if before is not None:
            sql += f" AND run_no < {p}"
            params.append(before)
        return int(self._query(sql, params)[0][0])

    def find_idempotent(self, key: str) -> RunRecord | None:
        rows = self._query(self._sql_find_idempotent, (key,))
        return record_of(rows[0]) if rows else None

    def descendant_totals(self, run_ids: Sequence[str]) -> dict[str, RunTotals]:
        if not run_ids:
            return {}
        marks = ", ".join([self.param] * len(run_ids))
        sums = ", ".join(f"SUM(r.{c})" for c in USAGE_COLUMNS)
        # Every descendant of each root, walked down parent_run_id (indexed), then summed per root.
        sql = (f"WITH RECURSIVE tree (root, run_id) AS ("
               f"SELECT c.parent_run_id, c.run_id FROM runs c WHERE c.parent_run_id IN ({marks}) "
               f"UNION ALL SELECT t.root, c.run_id FROM runs c JOIN tree t ON c.parent_run_id = t.run_id) "
               f"SELECT t.root, {sums} FROM tree t JOIN runs r ON r.run_id = t.run_id GROUP BY t.root")
        out: dict[str, RunTotals] = {}
        for row in self._query(sql, list(run_ids)):
            out[row[0]] = RunTotals(usage={k: int(v or 0) for k, v in zip(USAGE_KEYS, row[1:5], strict=True)},
                                    totalCostUsd=float(row[5] or 0.0))
        return out

    # -- the log ----------------------------------------------------------------------------

    def commit(self, run_id: str, events: Sequence[EventRow], status: str, seq: int, error: str | None,
               checkpoint: bytes | None, blobs: Mapping[str, bytes] | None = None, *, lease: Lease | None = None,
               release: bool = False, taken: Sequence[tuple[int, int]] = (),
               totals: RunTotals | None = None, agent_runs: Sequence[AgentRun] = ()) -> None:
        request = CommitRequest(runId=run_id, events=events, status=status, seq=seq, error=error,
                                checkpoint=checkpoint, blobs=blobs, lease=lease, release=release, taken=taken,
                                totals=totals, agent_runs=agent_runs)
        try:
            with self._tx(self._OUT_OF_ORDER, run_id) as db:
                self._write(db, request)
            self._known_status[run_id] = (status, error)
        except (StoreError, LeaseLostError):
            self._known_status.pop(run_id, None)
            raise

    def commit_group(self, requests: Sequence[CommitRequest | CreateRequest]) -> list[Exception | None]:
        results: list[Exception | None] = [None] * len(requests)
        try:
            with self._tx() as db:
                for i, r in enumerate(requests):
                    try:
                        if isinstance(r, CreateRequest):
                            with self._savepoint(db, self._RUN_EXISTS, r.record.runId):
                                self._create_in(db, r)
                        else:
                            with self._savepoint(db, self._OUT_OF_ORDER, r.runId):
                                self._write(db, r)
                    except Exception as exc:  # this run's alone: the others' rows stay in the transaction
                        results[i] = exc
        except StoreError as exc:
            results = [exc] * len(requests)
        for r, failed in zip(requests, results, strict=True):
            if isinstance(r, CreateRequest):
                if failed is not None:
                    self._run_nos.pop(r.record.runId, None)
            elif failed is None:
                self._known_status[r.runId] = (r.status, r.error)
            else:
                self._known_status.pop(r.runId, None)
        return results

    def _write(self, db: Any, r: CommitRequest) -> None:
        """A commit's statements, inside the caller's transaction: its lease is checked in it, so a
        commit made in a group is fenced exactly as one made on its own."""
        run_id, lease = r.runId, r.lease
        if lease is not None:
            self._check_lease(db, run_id, lease)
        self._insert_events(db, run_id, r.events)
        if r.agent_runs:
            self._write_agent_runs(db, r.agent_runs)
        if r.totals is not None:
            db.execute(self._sql_set_totals, (*(r.totals.usage.get(k, 0) for k in USAGE_KEYS),
                                              r.totals.totalCostUsd, run_id))
        if r.release and lease is not None:
            db.execute(self._sql_update_status_release, (r.status, r.seq, r.error, now_ms(), run_id))
            if r.status == "running":
                self._notify_queue(db)  # left running for the pool: wake a worker
        elif self._known_status.get(run_id) != (r.status, r.error):
            db.execute(self._sql_update_status, (r.status, r.seq, r.error, now_ms(), run_id))
        self._insert_blobs(db, r.blobs)
        if r.checkpoint is not None:
            db.execute(self._sql_put_checkpoint, (run_id, r.seq, self._enc(r.checkpoint)))
        for command_id, received in r.taken:
            db.execute(self._sql_finish_command, (received, command_id))

    @abstractmethod
    def _savepoint(self, db: Any, conflict: str | None, run: str) -> AbstractContextManager[None]:
        """A savepoint inside ``db``'s transaction: rolled back to when the block raises, which then
        raises StoreError (``conflict``, formatted with ``run``, for a unique-key violation)."""

    def read_events(self, run_id: str, after: int = 0, until: int | None = None) -> list[bytes]:
        base = self._run_no(run_id) * RUN_SPAN
        last = RUN_SPAN - 1 if until is None else min(until, RUN_SPAN - 1)
        rows = self._query(self._sql_read_events, (base + after, base + last))
        dec = self._dec
        return resolve_bodies([dec(r[0]) for r in rows], self.read_blobs)

    def last_seqs(self, run_ids: Sequence[str]) -> dict[str, int]:
        if not run_ids:
            return {}
        marks = ", ".join([self.param] * len(run_ids))
        rows = self._query(f"SELECT run_id, (SELECT e.id - runs.run_no * {RUN_SPAN} {LAST_EVENT}) FROM runs "
                           f"WHERE run_id IN ({marks})", list(run_ids))
        return {r[0]: int(r[1] or 0) for r in rows}

    def read_checkpoint(self, run_id: str, at_most: int | None = None) -> tuple[int, bytes] | None:
        rows = self._query(self._sql_read_checkpoint, (run_id, at_most if at_most is not None else 2**62))
        return (int(rows[0][0]), self._dec(rows[0][1])) if rows else None

    @abstractmethod
    def change_token(self) -> int: ...
