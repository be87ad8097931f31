"""Shared fixtures. ``replay_audit`` runs after every test: every run the test created, in any
store it opened or any database file it left in ``tmp_path``, must replay to its stored snapshot."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Flows the tests' commands validate are remembered in a folder of this session's, not the user's cache.
if "FLOWKERNEL_CACHE_DIR" not in os.environ:
    os.environ["FLOWKERNEL_CACHE_DIR"] = _CACHE = tempfile.mkdtemp(prefix="flowkernel-cache-")
    atexit.register(shutil.rmtree, _CACHE, True)

from flowkernel.store.memory import MemoryStore  # noqa: E402
from flowkernel.store.sql.sqlite import SqliteStore  # noqa: E402
from flowkernel.testing.audit import audit_store  # noqa: E402


def current_models() -> set[str]:
    """The models a user gets without choosing one: the default and those the shipped examples name."""
    from flowkernel.nodes.claude.config import DEFAULT_MODEL

    models = {DEFAULT_MODEL}
    for path in [*(ROOT / "flows").glob("*.json"), *(ROOT / "fixtures").glob("*/*.json")]:
        text = path.read_text(encoding="utf-8")
        models |= set(re.findall(r'"model":\s*"([^"{}]+)"', text))
    return models


def pytest_configure(config: pytest.Config) -> None:
    # The SDK warns when a call names a model in its deprecation table. For the models users get by
    # default that is a failure of the suite; an older model a test names on purpose only warns.
    for model in sorted(current_models()):
        config.addinivalue_line("filterwarnings", f"error:The model '{re.escape(model)}' is deprecated:DeprecationWarning")


@pytest.fixture(autouse=True)
def replay_audit(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    opened: list[Any] = []
    real_sqlite_init = SqliteStore.__init__
    real_memory_init = MemoryStore.__init__

    def sqlite_init(self: SqliteStore, *a: Any, **kw: Any) -> None:
        real_sqlite_init(self, *a, **kw)
        opened.append(self)

    def memory_init(self: MemoryStore) -> None:
        real_memory_init(self)
        opened.append(self)

    monkeypatch.setattr(SqliteStore, "__init__", sqlite_init)
    monkeypatch.setattr(MemoryStore, "__init__", memory_init)
    yield
    if request.node.get_closest_marker("no_audit"):
        return
    monkeypatch.undo()
    paths: set[Path] = set()
    for store in opened:
        if isinstance(store, MemoryStore):
            audit_store(store)
        else:
            paths.add(store.path.resolve())
    tmp = request.node.funcargs.get("tmp_path")
    if isinstance(tmp, Path):
        paths |= {p.resolve() for p in tmp.rglob("*.db")}
    for path in paths:
        if path.exists() and path.stat().st_size > 0:
            store = SqliteStore(path, create=False)
            try:
                audit_store(store)
            finally:
                store.close()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Environment for CLI subprocesses: the project importable, no stray store or plugins."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("FLOWKERNEL_DB", None)
    env.pop("FLOWKERNEL_PLUGINS", None)
    env["NO_COLOR"] = "1"
    return env
