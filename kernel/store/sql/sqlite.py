"""The SQLite store: one file, WAL, ``synchronous=FULL``; every commit is durable when it returns.

The statements and method bodies are shared with the PostgreSQL store (``flowkernel.store.sql.store``); this
module holds what is SQLite's own: the file, the pragmas, ``BEGIN IMMEDIATE`` transactions (which
also serialise lease taking), bodies stored as TEXT and ``PRAGMA data_version`` as the change token.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from flowkernel.errors import StoreError
from flowkernel.store.base import Backfill
from flowkernel.store.sql.store import SCHEMA_VERSION, SqlStore, migrations, schema

__all__ = ["SCHEMA", "SCHEMA_VERSION", "SqliteStore"]

SCHEMA = schema(id="INTEGER PRIMARY KEY AUTOINCREMENT", key="INTEGER PRIMARY KEY", body="TEXT")
MIGRATIONS = migrations(id="INTEGER PRIMARY KEY AUTOINCREMENT", key="INTEGER PRIMARY KEY", body="TEXT")


class SqliteStore(SqlStore):
    """Runs in one SQLite file. Safe to share between processes; one connection per store object."""

    # SQLite names the violated constraint when a run exists already: the generic error says it.
    _RUN_EXISTS: ClassVar[str | None] = None
    _OUT_OF_ORDER: ClassVar[str] = "run {run}: events out of order ({detail}); is another process executing it?"

    def __init__(self, path: str | Path, *, create: bool = True, readonly: bool = False,
                 backfill: Backfill | None = None) -> None:
        """``readonly``: only read (``runs``, ``show``, ``events``), which works on a read-only mount too.
        ``backfill``: what folds agent runs if the file is from before they were stored (``Backfill``)."""
        self.path = Path(path)
        super().__init__(str(self.path), backfill=backfill)
        if (readonly or not create) and not self.path.exists():
            raise StoreError(f"{self.path}: no such database; a run creates it")
        if self.path.exists() and self.path.is_dir():
            raise StoreError(f"{self.path}: is a directory, not a database file")
        if create and not readonly:
            _make_folder(self.path)
        self._timeout = float(os.environ.get("FLOWKERNEL_BUSY_TIMEOUT_MS", "5000")) / 1000
        self._lock = threading.RLock()
        self.readonly = readonly
        try:
            self._db = self._connect_readonly() if readonly else self._connect(str(self.path), uri=False)
            if readonly and self._db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
                # An older schema is upgraded first, which takes a writer.
                self._db.close()
                self.readonly = False
                self._db = self._connect(str(self.path), uri=False)
            self._prepare()
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None

    def _connect(self, target: str, *, uri: bool) -> sqlite3.Connection:
        return sqlite3.connect(target, timeout=self._timeout, isolation_level=None, check_same_thread=False, uri=uri)

    def _connect_readonly(self) -> sqlite3.Connection:
        """A connection that never writes. Reading a WAL database needs its ``-shm`` file; on a read-only
        folder that cannot be created, and a database without a ``-wal`` file is then read as immutable
        (everything committed is in the main file)."""
        base = "file:" + urllib.parse.quote(str(self.path.resolve())) + "?mode=ro"
        db = self._connect(base, uri=True)
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.OperationalError as exc:
            db.close()
            if getattr(exc, "sqlite_errorname", "") != "SQLITE_CANTOPEN" or Path(f"{self.path}-wal").exists():
                raise
        return self._connect(base + "&immutable=1", uri=True)

    def _error(self, exc: sqlite3.Error) -> StoreError:
        text = str(exc)
        code = getattr(exc, "sqlite_errorname", "")
        if "locked" in text or "busy" in text:
            return StoreError(f"{self.path}: database is locked by another process ({text}); try again")
        if "not a database" in text or "malformed" in text or "corrupt" in text:
            return StoreError(f"{self.path}: not a flowkernel database or corrupt ({text})")
        if code.startswith("SQLITE_FULL") or "disk is full" in text:
            return StoreError(f"{self.path}: database or disk is full; free space and try again")
        if code.startswith("SQLITE_READONLY") or "readonly database" in text:
            return StoreError(f"{self.path}: the database is read-only here ({text}); commands that only read "
                              f"(runs, show, events) still work")
        if code.startswith("SQLITE_CANTOPEN"):
            return StoreError(f"{self.path}: cannot open the database ({text}); the file and its folder must be "
                              f"readable, and writable for commands that change runs")
        if code.startswith("SQLITE_IOERR") or "disk I/O error" in text:
            return StoreError(f"{self.path}: disk I/O error ({code or text})")
        return StoreError(f"{self.path}: {text}")

    def _prepare(self) -> None:
        db = self._db
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path}: schema version {version} is newer than this flowkernel's {SCHEMA_VERSION}")
        if version == 0 and tables:
            raise StoreError(f"{self.path}: not a flowkernel database (it has other tables)")
        if self.readonly:
            return
        if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA foreign_keys=OFF")
        if version < SCHEMA_VERSION:
            with self._tx():
                for older in range(max(version, 1), SCHEMA_VERSION) if version else ():
                    for stmt in MIGRATIONS[older]:
                        db.execute(stmt)
                for stmt in SCHEMA:
                    db.execute(stmt)
                if 0 < version < 9:
                    self._backfill_agent_runs(db)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _lock_run_numbers(self, db: sqlite3.Connection) -> None:
        pass  # BEGIN IMMEDIATE already makes this the only writer

    def _lock_keys(self, db: sqlite3.Connection, table: str) -> None:
        pass  # likewise: one writer at a time, so keys become visible in the order they are handed out

    def _tx(self, conflict: str | None = None, run: str = "") -> _Transaction:
        return _Transaction(self, conflict, run)

    @contextmanager
    def _savepoint(self, db: sqlite3.Connection, conflict: str | None, run: str) -> Iterator[None]:
        db.execute("SAVEPOINT flowkernel_commit")
        try:
            yield
        except BaseException as exc:
            db.execute("ROLLBACK TO flowkernel_commit")
            db.execute("RELEASE flowkernel_commit")
            if isinstance(exc, sqlite3.IntegrityError) and conflict is not None:
                raise StoreError(conflict.format(location=self.location, run=run, detail=exc)) from None
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc) from None
            raise
        db.execute("RELEASE flowkernel_commit")

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            try:
                return self._db.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise self._error(exc) from None

    @staticmethod
    def _executemany(db: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
        db.executemany(sql, rows)

    @staticmethod
    def _enc(body: bytes) -> str:
        return body.decode()

    @staticmethod
    def _dec(value: str) -> bytes:
        return value.encode()

    def _bump_changes(self, db: sqlite3.Connection) -> None:
        pass  # data_version moves with any commit by another connection

    def change_token(self) -> int:
        # data_version changes when another connection commits: a cheap "anything new?" probe.
        return int(self._query("PRAGMA data_version")[0][0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` under the store's lock; driver errors become ``StoreError``.

    A class rather than a generator context manager: it runs on every transition.
    """

    __slots__ = ("_conflict", "_run", "_store")

    def __init__(self, store: SqliteStore, conflict: str | None, run: str) -> None:
        self._store, self._conflict, self._run = store, conflict, run

    def __enter__(self) -> sqlite3.Connection:
        store = self._store
        store._lock.acquire()
        try:
            store._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            store._lock.release()
            raise store._error(exc) from None
        return store._db

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        store = self._store
        try:
            if exc is None:
                try:
                    store._db.execute("COMMIT")
                    return
                except sqlite3.Error as error:
                    exc = error
            _rollback(store._db)
            if isinstance(exc, sqlite3.IntegrityError) and self._conflict is not None:
                raise StoreError(self._conflict.format(location=store.location, run=self._run, detail=exc)) from None
            if isinstance(exc, sqlite3.Error):
                raise store._error(exc) from None
        finally:
            store._lock.release()


def _make_folder(path: Path) -> None:
    """Create the database's folder, or say in one line why it cannot be (``--db /etc/passwd/x.db``)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocker = next((p for p in path.parents if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise StoreError(f"{path}: {blocker} is a file, not a folder; choose another --db path") from None
        raise StoreError(f"{path}: cannot create the folder {path.parent}: {exc.strerror or exc}") from None


def _rollback(db: sqlite3.Connection) -> None:
    """Undo the open transaction, if there still is one: after "disk full" or an I/O error SQLite may
    have rolled it back itself, and a ROLLBACK that fails must not hide the error that caused it."""
    if db.in_transaction:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # the connection is unusable now; the caller reports the first error
