"""Claude Code session transcripts in a SQL store (DESIGN §7b): the ``SessionRows`` role.

Two tables, both keyed to the run that owns the session by ``flow_run_id`` (as the agent tables are,
so prune, export and import carry them with the run):

- ``session_transcripts``: one row per transcript (project key, session id, subpath ``''`` for the
  main one), with when it last changed and, for a main transcript, the SDK's folded summary;
- ``session_entries``: the entries, one row each, in append order (their key); an entry's ``uuid``
  is unique within its transcript, which is how a retried batch is stored once.

An append takes the transcript's row first (an upsert, which locks it in PostgreSQL), so appends to
one transcript take turns: their entries keep the order of their commits and the summary is folded
from one stored version to the next, never from two at once.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from flowkernel.errors import StoreError, UnknownRunError
from flowkernel.ids import now_ms
from flowkernel.store.base import Lease, StoredSession, SummaryFold, session_of_another_run

# The tables per run, in the order a copy of a run writes them.
SESSION_TABLES = ("session_transcripts", "session_entries")

# ``{id}`` as in ``flowkernel.store.sql.schema.SCHEMA_TEMPLATE``.
SESSION_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS session_transcripts (
        id {id}, flow_run_id TEXT NOT NULL, project_key TEXT NOT NULL, session_id TEXT NOT NULL,
        subpath TEXT NOT NULL, mtime BIGINT NOT NULL, summary TEXT, summary_mtime BIGINT)""",
    "CREATE UNIQUE INDEX IF NOT EXISTS session_transcripts_key ON session_transcripts (project_key, session_id, subpath)",
    "CREATE INDEX IF NOT EXISTS session_transcripts_run ON session_transcripts (flow_run_id, id)",
    """CREATE TABLE IF NOT EXISTS session_entries (
        id {id}, flow_run_id TEXT NOT NULL, project_key TEXT NOT NULL, session_id TEXT NOT NULL,
        subpath TEXT NOT NULL, uuid TEXT, entry TEXT NOT NULL)""",
    # Also how a transcript's entries are found (NULL uuids are distinct: entries without one all stay).
    "CREATE UNIQUE INDEX IF NOT EXISTS session_entries_uuid ON session_entries (project_key, session_id, subpath, uuid)",
    "CREATE INDEX IF NOT EXISTS session_entries_run ON session_entries (flow_run_id, id)",
]

_LISTED = "flow_run_id, project_key, session_id, mtime, summary, summary_mtime"


class SqlSessions:
    """Mixed into ``SqlStore``: the ``SessionRows`` methods."""

    location: str
    param: ClassVar[str]

    _sql_run_exists: ClassVar[str] = "SELECT 1 FROM runs WHERE run_id = ?"
    _sql_session_owner: ClassVar[str] = (
        "SELECT flow_run_id FROM session_transcripts WHERE project_key = ? AND session_id = ? LIMIT 1")
    # Creates the transcript's row, or takes the one there (a no-op update: PostgreSQL locks the row).
    _sql_take_transcript: ClassVar[str] = (
        "INSERT INTO session_transcripts (flow_run_id, project_key, session_id, subpath, mtime) "
        "VALUES (?, ?, ?, ?, 0) ON CONFLICT (project_key, session_id, subpath) "
        "DO UPDATE SET mtime = session_transcripts.mtime RETURNING flow_run_id, mtime, summary")
    _sql_insert_entry: ClassVar[str] = (
        "INSERT INTO session_entries (flow_run_id, project_key, session_id, subpath, uuid, entry) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING id")
    _sql_touch_transcript: ClassVar[str] = (
        "UPDATE session_transcripts SET mtime = ? WHERE project_key = ? AND session_id = ? AND subpath = ?")
    _sql_set_summary: ClassVar[str] = (
        "UPDATE session_transcripts SET mtime = ?, summary = ?, summary_mtime = ? "
        "WHERE project_key = ? AND session_id = ? AND subpath = ?")
    _sql_transcript_run: ClassVar[str] = (
        "SELECT flow_run_id FROM session_transcripts WHERE project_key = ? AND session_id = ? AND subpath = ?")
    _sql_load_entries: ClassVar[str] = (
        "SELECT entry FROM session_entries WHERE project_key = ? AND session_id = ? AND subpath = ? ORDER BY id")

    @abstractmethod
    def _tx(self, conflict: str | None = None, run: str = "") -> AbstractContextManager[Any]: ...
    @abstractmethod
    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...
    @abstractmethod
    def _check_lease(self, db: Any, run_id: str, lease: Lease) -> None: ...

    def append_session_entries(self, run_id: str, project_key: str, session_id: str, subpath: str,
                               entries: Sequence[Mapping[str, Any]], *, fold: SummaryFold | None = None,
                               lease: Lease | None = None) -> int:
        rows = [(e.get("uuid") if isinstance(e.get("uuid"), str) else None, json.dumps(e, separators=(",", ":")))
                for e in entries]
        if not rows:
            return 0
        key = (project_key, session_id, subpath)
        with self._tx() as db:
            if lease is not None:
                self._check_lease(db, run_id, lease)
            elif db.execute(self._sql_run_exists, (run_id,)).fetchone() is None:
                raise UnknownRunError(run_id, self.location)
            owner = db.execute(self._sql_session_owner, key[:2]).fetchone()
            if owner is None or owner[0] == run_id:
                owner = db.execute(self._sql_take_transcript, (run_id, *key)).fetchone()
            if owner[0] != run_id:  # taken by another run (just now, in PostgreSQL: a race of two runs)
                raise StoreError(session_of_another_run(session_id, project_key, str(owner[0]), run_id))
            new = [entry for uuid, entry in rows
                   if db.execute(self._sql_insert_entry, (run_id, *key, uuid, entry)).fetchone() is not None]
            if not new:
                return 0
            mtime = max(now_ms(), int(owner[1]) + 1)
            if fold is not None and subpath == "":
                summary = fold(None if owner[2] is None else json.loads(owner[2]), [json.loads(e) for e in new])
                db.execute(self._sql_set_summary, (mtime, json.dumps(summary), mtime, *key))
            else:
                db.execute(self._sql_touch_transcript, (mtime, *key))
            return len(new)

    def load_session_entries(self, project_key: str, session_id: str, subpath: str = "", *,
                             run_id: str | None = None) -> list[dict[str, Any]] | None:
        key = (project_key, session_id, subpath)
        owner = self._query(self._sql_transcript_run, key)
        if not owner or run_id not in (None, owner[0][0]):
            return None
        return [json.loads(r[0]) for r in self._query(self._sql_load_entries, key)]

    def list_sessions(self, *, project_key: str | None = None, run_id: str | None = None) -> list[StoredSession]:
        sql, params = self._session_filter(f"SELECT {_LISTED} FROM session_transcripts WHERE subpath = ''",
                                           project_key=project_key, run_id=run_id)
        return [StoredSession(runId=r[0], projectKey=r[1], sessionId=r[2], mtime=int(r[3]),
                              summary=None if r[4] is None else json.loads(r[4]),
                              summaryMtime=None if r[5] is None else int(r[5]))
                for r in self._query(sql + " ORDER BY id", params)]

    def list_session_subpaths(self, project_key: str, session_id: str, *,
                              run_id: str | None = None) -> list[str]:
        p = self.param
        sql, params = self._session_filter(
            f"SELECT subpath FROM session_transcripts WHERE session_id = {p} AND subpath <> ''",
            project_key=project_key, run_id=run_id)
        return [str(r[0]) for r in self._query(sql + " ORDER BY id", [session_id, *params])]

    def delete_session(self, run_id: str, project_key: str, session_id: str, subpath: str | None = None, *,
                       lease: Lease | None = None) -> None:
        p = self.param
        where = f"flow_run_id = {p} AND project_key = {p} AND session_id = {p}"
        params: list[Any] = [run_id, project_key, session_id]
        if subpath is not None:
            where += f" AND subpath = {p}"
            params.append(subpath)
        with self._tx() as db:
            if lease is not None:
                self._check_lease(db, run_id, lease)
            for table in SESSION_TABLES:
                db.execute(f"DELETE FROM {table} WHERE {where}", params)

    def _session_filter(self, select: str, *, project_key: str | None,
                        run_id: str | None) -> tuple[str, list[Any]]:
        params: list[Any] = []
        for column, value in (("project_key", project_key), ("flow_run_id", run_id)):
            if value is not None:
                select += f" AND {column} = {self.param}"
                params.append(value)
        return select, params
