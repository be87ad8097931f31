"""Run stores: ``MemoryStore``, ``SqliteStore`` and (with psycopg) ``PostgresStore``."""

from __future__ import annotations

from kernel.store.base import CommandRow, RunRecord, Store
from kernel.store.memory import MemoryStore
from kernel.store.open import open_store
from kernel.store.sqlite import SqliteStore

__all__ = ["CommandRow", "MemoryStore", "RunRecord", "SqliteStore", "Store", "open_store"]
