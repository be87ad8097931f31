"""Open a store from a URL: a SQLite path (default ``.flowkernel/runs.db``), ``memory``, ``postgresql://``."""

from __future__ import annotations

import os
from pathlib import Path

from flowkernel.errors import InvalidInputError
from flowkernel.store.base import Backfill, Store

DEFAULT_DB = ".flowkernel/runs.db"


def default_url() -> str:
    return os.environ.get("FLOWKERNEL_DB") or DEFAULT_DB


def open_store(url: str | None = None, *, create: bool = True, readonly: bool = False,
               backfill: Backfill | None = None) -> Store:
    """Open the store named by ``url`` (or ``FLOWKERNEL_DB``, or the default SQLite file). ``readonly``:
    the caller only reads, so a SQLite file is opened read-only (it may be on a read-only mount).
    ``backfill``: what folds agent runs when a database from before they were stored is migrated."""
    url = url or default_url()
    if url == "memory":
        from flowkernel.store.memory import MemoryStore

        return MemoryStore()
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from flowkernel.store.sql.postgres import PostgresStore  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise InvalidInputError("--db postgresql://… needs the PostgreSQL store (pip install flowkernel[postgres])") from None
        store: Store = PostgresStore(url, backfill=backfill)
        return store
    if url.startswith("sqlite:///"):
        url = url[len("sqlite:///"):]
    elif "://" in url:
        raise InvalidInputError(f"--db {url}: unknown store; use a SQLite file path or postgresql://…")
    from flowkernel.store.sql.sqlite import SqliteStore

    return SqliteStore(Path(url), create=create, readonly=readonly, backfill=backfill)
