"""Run stores: ``MemoryStore``, ``SqliteStore`` and (with psycopg) ``PostgresStore``."""

from __future__ import annotations

from flowkernel.store.base import CommandRow, RunRecord, Store
from flowkernel.store.memory import MemoryStore
from flowkernel.store.open import open_store
from flowkernel.store.sqlite import SqliteStore

__all__ = ["CommandRow", "MemoryStore", "RunRecord", "SqliteStore", "Store", "open_store"]
