"""Run stores: the Store protocols, packing and checkpoints, the memory store, sql/ (``SqliteStore`` and, with psycopg, ``PostgresStore``) and retention; imports nothing from run/, history/ or nodes/."""

from __future__ import annotations

from flowkernel.store.base import CommandRow, RunRecord, Store
from flowkernel.store.memory import MemoryStore
from flowkernel.store.open import open_store
from flowkernel.store.sql.sqlite import SqliteStore

__all__ = ["CommandRow", "MemoryStore", "RunRecord", "SqliteStore", "Store", "open_store"]
