"""Whole runs in and out of a SQL store (DESIGN §13): what ``prune``, ``export`` and ``import`` need.

A run is more than its row: its events, its checkpoint and the blobs that reaches, its pending
commands, its trace context, the agent tables (messages, tool calls, agent runs) and the transcripts
of its Claude Code sessions. Those tables are read and written column for column (``SELECT *``), so
a column added to any of them travels with the run without this module knowing of it. What a copy
must not carry: the run number (the target hands out its own: event keys derive from it), the lease
(nobody executes the copy yet) and the row ids of the per-run tables (new ones, in the same order;
the tool calls that point at agent messages are mapped along). A session is its run's: a run whose
session the target holds already is refused, as a run that exists is.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import msgspec
from flowkernel.core.events import event_type
from flowkernel.core.nesting import loads
from flowkernel.errors import InvalidInputError, RunBusyError, StoreError, UnknownRunError
from flowkernel.store.base import EventRow
from flowkernel.store.packing import PACKED_PREFIX
from flowkernel.store.sql.sessions import SESSION_TABLES

# An event's key is ``run_no * RUN_SPAN + seq``: one integer key, so the log is a single b-tree that
# grows at its right edge (no secondary index to keep balanced on every commit).
RUN_SPAN = 2**32

# Per-run tables keyed by the run (``flow_run_id`` in the agent tables), in the order they are copied.
AGENT_TABLES = ("agent_messages", "agent_tool_calls", "agent_runs")
# Every table keyed by the run (``flow_run_id``) with an ``id`` key: the agent tables and the sessions'.
RUN_TABLES = (*AGENT_TABLES, *SESSION_TABLES)
# Columns of the runs row a copy leaves behind (see the module docstring).
_LOCAL_RUN_COLUMNS = frozenset({"run_no", "lease_owner", "lease_expires_at"})


class RunArchive(msgspec.Struct, kw_only=True):
    """One run, everything of it: the unit ``export`` writes (one JSON line) and ``import`` loads."""

    run: dict[str, Any]  # the runs row, column -> value (without run number and lease)
    flow: dict[str, str]  # {hash, name, document}: the flow the run follows now
    events: list[tuple[int, int, msgspec.Raw]]  # (seq, timestamp, the event as stored)
    checkpoint: tuple[int, msgspec.Raw] | None  # (seq, skeleton)
    blobs: dict[str, msgspec.Raw]  # every blob the checkpoint and the packed events reach
    commands: list[dict[str, Any]]  # pending ones: {body, createdAt}
    traceContext: str | None = None
    tables: dict[str, list[dict[str, Any]]] = msgspec.field(default_factory=dict)  # RUN_TABLES rows
    # The flows it followed before (its flow:start's, and those a flow:updated left), each as ``flow``:
    # folding its events up to a seq before an update needs them.
    earlierFlows: list[dict[str, str]] = msgspec.field(default_factory=list)

    @property
    def run_id(self) -> str:
        return str(self.run["run_id"])


_NAMES_FLOWS = frozenset({"flow:start", "flow:updated"})


def _flows_named(events: Sequence[tuple[int, int, msgspec.Raw]]) -> set[str]:
    """The hashes of the flows a run's events name: its ``flow:start``'s and every ``flow:updated``'s."""
    found: set[str] = set()
    for _, _, raw in events:
        body = bytes(raw)
        if event_type(body) in _NAMES_FLOWS:  # small events, never stored packed: plain JSON
            ev = loads(body)
            found.update(str(ev[k]) for k in ("flowHash", "fromHash", "toHash") if k in ev)
    return found


class SqlArchive:
    """Mixed into ``SqlStore``: reading, writing and deleting whole runs."""

    location: str
    param: ClassVar[str]
    #: Appended to a SELECT of run rows that are about to be deleted (PostgreSQL: `` FOR UPDATE``).
    _row_lock: ClassVar[str] = ""
    #: The first statement of an export's transaction, so that its reads see one snapshot of a run
    #: that is still executing (PostgreSQL: REPEATABLE READ; SQLite's transaction is one already).
    _sql_one_snapshot: ClassVar[str] = ""
    _run_nos: dict[str, int]

    @abstractmethod
    def _tx(self, conflict: str | None = None, run: str = "") -> AbstractContextManager[Any]: ...
    @abstractmethod
    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...
    @staticmethod
    @abstractmethod
    def _enc(body: bytes) -> Any: ...
    @staticmethod
    @abstractmethod
    def _dec(value: Any) -> bytes: ...
    @abstractmethod
    def _lock_run_numbers(self, db: Any) -> None: ...
    @abstractmethod
    def _run_no(self, run_id: str) -> int: ...
    @abstractmethod
    def _insert_events(self, db: Any, run_id: str, events: Sequence[EventRow]) -> None: ...
    @abstractmethod
    def _insert_blobs(self, db: Any, blobs: Mapping[str, bytes] | None) -> None: ...
    @abstractmethod
    def read_blobs(self, keys: Iterable[str]) -> dict[str, bytes]: ...

    def _marks(self, n: int) -> str:
        return ", ".join([self.param] * n)

    # -- which runs -------------------------------------------------------------------------

    def prunable_runs(self, *, statuses: Sequence[str], updated_before: int, now: int, limit: int,
                      after: tuple[int, str] | None = None) -> list[tuple[str, int]]:
        """Top-level runs in one of ``statuses`` whose row last changed before ``updated_before``,
        oldest first, as (run id, updated_at); never one whose lease is live (being executed)."""
        p = self.param
        sql = (f"SELECT run_id, updated_at FROM runs WHERE status IN ({self._marks(len(statuses))}) "
               f"AND updated_at < {p} AND parent_run_id IS NULL "
               f"AND (lease_owner IS NULL OR lease_expires_at < {p})")
        params: list[Any] = [*statuses, updated_before, now]
        if after is not None:
            sql += f" AND (updated_at > {p} OR (updated_at = {p} AND run_id > {p}))"
            params += [after[0], after[0], after[1]]
        sql += f" ORDER BY updated_at, run_id LIMIT {p}"
        params.append(limit)
        return [(str(r[0]), int(r[1])) for r in self._query(sql, params)]

    def descendants(self, run_ids: Sequence[str]) -> list[str]:
        """Every child run of ``run_ids``, their children, and so on (parents before children)."""
        out: list[str] = []
        level = list(run_ids)
        while level:
            found: list[str] = []
            for i in range(0, len(level), 500):
                part = level[i:i + 500]
                found += [str(r[0]) for r in self._query(
                    f"SELECT run_id FROM runs WHERE parent_run_id IN ({self._marks(len(part))}) "
                    f"ORDER BY created_at, run_id", part)]
            out += found
            level = found
        return out

    def count_events(self, run_ids: Sequence[str]) -> int:
        total = 0
        for run_id in run_ids:
            base = self._run_no(run_id) * RUN_SPAN
            p = self.param
            total += int(self._query(f"SELECT COUNT(*) FROM events WHERE id BETWEEN {p} AND {p}",
                                     (base, base + RUN_SPAN - 1))[0][0])
        return total

    # -- delete -----------------------------------------------------------------------------

    def delete_runs(self, run_ids: Sequence[str], now: int) -> tuple[list[bytes], int]:
        """Delete these runs and every row of theirs in one transaction; returns their checkpoint
        skeletons and the bodies of their events stored packed (the roots of the blobs that may have no
        user left: ``flowkernel.store.checkpoint.packed_blobs``) and the number of events deleted.
        Blobs stay: they are shared by content (``flowkernel.store.retention`` collects them). If one of the
        runs has a live lease (a worker claimed it meanwhile) nothing is deleted: ``RunBusyError``."""
        if not run_ids:
            return [], 0
        p, marks = self.param, self._marks(len(run_ids))
        ids = list(run_ids)
        skeletons: list[bytes] = []
        events = 0
        with self._tx() as db:
            # Locked (PostgreSQL) so that no worker claims one of them between this check and the delete.
            for run_id, owner, expires in db.execute(
                    f"SELECT run_id, lease_owner, lease_expires_at FROM runs WHERE run_id IN ({marks})"
                    f"{self._row_lock}", ids).fetchall():
                if owner is not None and int(expires or 0) >= now:
                    raise RunBusyError(f"run {run_id} is being executed by {owner}; not deleted")
            numbers = {str(r[0]): r[1] for r in db.execute(
                f"SELECT run_id, run_no FROM runs WHERE run_id IN ({marks})", ids).fetchall()}
            skeletons = [self._dec(r[0]) for r in db.execute(
                f"SELECT body FROM checkpoints WHERE run_id IN ({marks})", ids).fetchall()]
            for run_no in numbers.values():
                if run_no is not None:
                    base = int(run_no) * RUN_SPAN
                    skeletons += [self._dec(r[0]) for r in db.execute(
                        f"SELECT body FROM events WHERE id BETWEEN {p} AND {p} AND body >= {p} AND body < {p}",
                        (base, base + RUN_SPAN - 1, *self._packed_range())).fetchall()]
                    events += db.execute(f"DELETE FROM events WHERE id BETWEEN {p} AND {p}",
                                         (base, base + RUN_SPAN - 1)).rowcount
            for table, column in (("checkpoints", "run_id"), ("commands", "run_id"), ("run_traces", "run_id"),
                                  *((t, "flow_run_id") for t in RUN_TABLES), ("runs", "run_id")):
                db.execute(f"DELETE FROM {table} WHERE {column} IN ({marks})", ids)
        for run_id in run_ids:
            self._run_nos.pop(run_id, None)
        return skeletons, events

    def checkpoint_page(self, after: str, limit: int) -> list[tuple[str, bytes]]:
        """Stored checkpoints by run id, those after ``after``: the roots of the blobs in use."""
        p = self.param
        return [(str(r[0]), self._dec(r[1])) for r in self._query(
            f"SELECT run_id, body FROM checkpoints WHERE run_id > {p} ORDER BY run_id LIMIT {p}", (after, limit))]

    def _packed_range(self) -> tuple[Any, Any]:
        """Bounds of the stored bodies that start with ``PACKED_PREFIX`` (its last byte, ``,``, plus one)."""
        return self._enc(PACKED_PREFIX), self._enc(PACKED_PREFIX[:-1] + bytes([PACKED_PREFIX[-1] + 1]))

    def packed_event_page(self, after: int, limit: int) -> list[tuple[int, bytes]]:
        """Events stored packed, by key, those after key ``after``: roots of blobs in use, like checkpoints."""
        p = self.param
        return [(int(r[0]), self._dec(r[1])) for r in self._query(
            f"SELECT id, body FROM events WHERE id > {p} AND body >= {p} AND body < {p} ORDER BY id LIMIT {p}",
            (after, *self._packed_range(), limit))]

    def delete_blobs(self, keys: Sequence[str]) -> int:
        deleted = 0
        for i in range(0, len(keys), 500):
            part = list(keys[i:i + 500])
            with self._tx() as db:
                deleted += db.execute(f"DELETE FROM blobs WHERE key IN ({self._marks(len(part))})", part).rowcount
        return deleted

    # -- export -----------------------------------------------------------------------------

    def _rows(self, db: Any, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        cur = db.execute(sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def export_run(self, run_id: str, blobs_of: Any) -> RunArchive:
        """Everything of one run, read in one transaction. ``blobs_of(body, fetch)`` gives the blobs a
        checkpoint or an event stored packed reaches (``flowkernel.store.checkpoint.packed_blobs``)."""
        p = self.param
        with self._tx() as db:
            if self._sql_one_snapshot:
                db.execute(self._sql_one_snapshot)
            runs = self._rows(db, f"SELECT * FROM runs WHERE run_id = {p}", (run_id,))
            if not runs:
                raise UnknownRunError(run_id, self.location)
            run = runs[0]
            base = int(run["run_no"]) * RUN_SPAN
            flow = db.execute(f"SELECT hash, name, document FROM flows WHERE hash = {p}", (run["flow_hash"],)).fetchone()
            if flow is None:
                raise StoreError(f"{self.location}: the flow of run {run_id} ({run['flow_hash']}) is missing")
            events = [(int(r[0]) - base, int(r[1]), msgspec.Raw(self._dec(r[2]))) for r in db.execute(
                f"SELECT id, ts, body FROM events WHERE id BETWEEN {p} AND {p} ORDER BY id",
                (base, base + RUN_SPAN - 1)).fetchall()]
            cp = db.execute(f"SELECT seq, body FROM checkpoints WHERE run_id = {p}", (run_id,)).fetchone()
            commands = [{"body": loads(r[0]), "createdAt": int(r[1])} for r in db.execute(
                f"SELECT body, created_at FROM commands WHERE run_id = {p} AND taken_seq IS NULL ORDER BY id",
                (run_id,)).fetchall()]
            trace = db.execute(f"SELECT trace_context FROM run_traces WHERE run_id = {p}", (run_id,)).fetchone()
            tables = {t: self._rows(db, f"SELECT * FROM {t} WHERE flow_run_id = {p} ORDER BY id", (run_id,))
                      for t in RUN_TABLES}
            earlier = []
            for flow_hash in sorted(_flows_named(events) - {str(run["flow_hash"])}):
                row = db.execute(f"SELECT hash, name, document FROM flows WHERE hash = {p}", (flow_hash,)).fetchone()
                if row is None:
                    raise StoreError(f"{self.location}: flow {flow_hash}, which run {run_id} followed, is missing")
                earlier.append({"hash": str(row[0]), "name": str(row[1]), "document": str(row[2])})
        checkpoint = None
        blobs: dict[str, msgspec.Raw] = {}
        if cp is not None:
            skeleton = self._dec(cp[1])
            checkpoint = (int(cp[0]), msgspec.Raw(skeleton))
            blobs = {k: msgspec.Raw(v) for k, v in blobs_of(skeleton, self.read_blobs).items()}
        for _, _, body in events:
            if bytes(body).startswith(PACKED_PREFIX):
                blobs.update((k, msgspec.Raw(v)) for k, v in blobs_of(bytes(body), self.read_blobs).items())
        return RunArchive(run={k: v for k, v in run.items() if k not in _LOCAL_RUN_COLUMNS},
                          flow={"hash": str(flow[0]), "name": str(flow[1]), "document": str(flow[2])},
                          events=events, checkpoint=checkpoint, blobs=blobs, commands=commands,
                          traceContext=None if trace is None else str(trace[0]), tables=tables,
                          earlierFlows=earlier)

    # -- import -----------------------------------------------------------------------------

    def _columns(self, db: Any, table: str) -> list[str]:
        cur = db.execute(f"SELECT * FROM {table} WHERE 1 = 0")
        return [d[0] for d in cur.description]

    def _insert(self, db: Any, table: str, row: Mapping[str, Any], known: list[str], *, returning: bool = False) -> Any:
        unknown = sorted(set(row) - set(known))
        if unknown:
            raise InvalidInputError(f"{table} column(s) {', '.join(unknown)} are unknown to {self.location}: "
                                    f"the run was exported by a newer flowkernel; upgrade this one")
        cols = list(row)
        return db.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({self._marks(len(cols))})"
                          + (" RETURNING id" if returning else ""), [row[c] for c in cols])

    def import_run(self, archive: RunArchive) -> None:
        """Store a run exported from any flowkernel store, all of it or nothing; a run id (or
        idempotency key) that exists already is refused."""
        run_id = archive.run_id
        p = self.param
        with self._tx() as db:
            if db.execute(f"SELECT 1 FROM runs WHERE run_id = {p}", (run_id,)).fetchone() is not None:
                raise InvalidInputError(f"run {run_id} exists in {self.location} already; not imported")
            key = archive.run.get("idempotency_key")
            if key is not None and db.execute(f"SELECT run_id FROM runs WHERE idempotency_key = {p}",
                                              (key,)).fetchone() is not None:
                raise InvalidInputError(f"run {run_id}: its idempotency key {key!r} is taken by another run "
                                        f"in {self.location}; not imported")
            for flow in (archive.flow, *archive.earlierFlows):
                db.execute(f"INSERT INTO flows (hash, name, document, created_at) VALUES ({p}, {p}, {p}, {p}) "
                           f"ON CONFLICT (hash) DO NOTHING",
                           (flow["hash"], flow["name"], flow["document"], int(archive.run.get("created_at") or 0)))
            self._insert(db, "runs", archive.run, self._columns(db, "runs"))
            self._lock_run_numbers(db)
            run_no = int(db.execute("SELECT COALESCE(MAX(run_no), 0) + 1 FROM runs").fetchone()[0])
            db.execute(f"UPDATE runs SET run_no = {p} WHERE run_id = {p}", (run_no, run_id))
            self._run_nos[run_id] = run_no
            self._insert_events(db, run_id, [(seq, ts, bytes(body)) for seq, ts, body in archive.events])
            self._insert_blobs(db, {k: bytes(v) for k, v in archive.blobs.items()})
            if archive.checkpoint is not None:
                db.execute(f"INSERT INTO checkpoints (run_id, seq, body) VALUES ({p}, {p}, {p})",
                           (run_id, archive.checkpoint[0], self._enc(bytes(archive.checkpoint[1]))))
            for c in archive.commands:
                db.execute(f"INSERT INTO commands (run_id, body, created_at) VALUES ({p}, {p}, {p})",
                           (run_id, json.dumps(c["body"]), int(c["createdAt"])))
            if archive.traceContext is not None:
                db.execute(f"INSERT INTO run_traces (run_id, trace_context) VALUES ({p}, {p}) "
                           f"ON CONFLICT (run_id) DO NOTHING", (run_id, archive.traceContext))
            for row in archive.tables.get("session_transcripts", []):
                owner = db.execute(f"SELECT flow_run_id FROM session_transcripts WHERE project_key = {p} "
                                   f"AND session_id = {p} LIMIT 1", (row.get("project_key"), row.get("session_id"))).fetchone()
                if owner is not None:
                    raise InvalidInputError(f"run {run_id}: its session {row.get('session_id')} exists in {self.location} "
                                            f"already (run {owner[0]}); not imported")
            message_ids: dict[Any, Any] = {}
            for table in RUN_TABLES:
                rows = archive.tables.get(table, [])
                if not rows:
                    continue
                known = self._columns(db, table)
                for row in rows:
                    fields = {k: v for k, v in row.items() if k != "id"}
                    if table == "agent_tool_calls" and fields.get("message_id") is not None:
                        fields["message_id"] = message_ids.get(fields["message_id"])
                    cur = self._insert(db, table, fields, known, returning=table == "agent_messages")
                    if table == "agent_messages":
                        message_ids[row.get("id")] = cur.fetchone()[0]
