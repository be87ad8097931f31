"""``prune``, ``export`` and ``import`` carry the Claude Code sessions of runs (DESIGN §7b, §13).

WHEN a run is pruned THEN its sessions go with it and other runs' stay. WHEN runs are exported and
imported (SQLite and PostgreSQL, either way) THEN their sessions arrive whole: entries in order,
summaries, subagent transcripts, and a retried batch is still stored once there. WHEN a session
of an imported run exists in the target already THEN that run is refused whole.

The runs are hand-made rows without events (nothing to replay): the replay audit is skipped.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flowkernel.agents.session_store import RunSessionStore
from flowkernel.errors import UnknownRunError
from flowkernel.store.base import RunRecord, Store
from flowkernel.store.open import open_store
from flowkernel.store.retention import export_runs, import_runs, prune

from tests.test_postgres import needs_pg, pg_url  # noqa: F401 (pg_url is a fixture)

pytestmark = pytest.mark.no_audit

DAY_MS = 86_400_000


def entry(uuid: str | None, n: int, **extra: Any) -> dict[str, Any]:
    return {"type": "user", **({"uuid": uuid} if uuid else {}), "n": n, **extra}


def add_run(store: Store, run_id: str, *, status: str = "completed") -> None:
    store.create_run(RunRecord(runId=run_id, flowName="f", flowHash="h", status=status, seq=0, input={},
                               createdAt=1000, updatedAt=1000), [], b"{}", document='{"name": "f"}')


async def add_session(store: Store, run_id: str, session_id: str) -> dict[str, Any]:
    """A session of ``run_id`` with a main and a subagent transcript; returns its key."""
    adapter = RunSessionStore(store, run_id)
    key: dict[str, Any] = {"project_key": "-work-repo", "session_id": session_id}
    await adapter.append(key, [entry("u1", 1, customTitle=f"title of {run_id}"), entry(None, 2)])
    await adapter.append(key, [entry("u2", 3, message={"content": "ünïcode ✓"})])
    await adapter.append({**key, "subpath": "subagents/agent-1"}, [entry("s1", 1)])
    return key


def sessions_of(store: Store, run_id: str) -> list[Any]:
    """Everything stored of a run's sessions, as a reader sees it (mtimes are the store's own)."""
    out: list[Any] = []
    for s in store.list_sessions(run_id=run_id):
        subpaths = store.list_session_subpaths(s.projectKey, s.sessionId)
        out.append((s.projectKey, s.sessionId, s.summary, subpaths,
                    [store.load_session_entries(s.projectKey, s.sessionId, sub) for sub in ["", *subpaths]]))
    return out


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=needs_pg)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path / "runs.db") if request.param == "sqlite" else request.getfixturevalue("pg_url")


async def test_prune_deletes_a_runs_sessions_with_it(db: str) -> None:
    store = open_store(db, create=True)
    try:
        add_run(store, "run_old")
        add_run(store, "run_live", status="waiting")
        await add_session(store, "run_old", "s-old")
        kept = await add_session(store, "run_live", "s-live")
        before = sessions_of(store, "run_live")
        report = prune(store, older_than_ms=DAY_MS)
        assert report.runs == 1
        assert store.list_sessions(run_id="run_old") == []
        assert store.load_session_entries("-work-repo", "s-old") is None
        assert store.load_session_entries("-work-repo", "s-old", "subagents/agent-1") is None
        assert sessions_of(store, "run_live") == before and before[0][1] == kept["session_id"]
    finally:
        store.close()


async def _exported(source: Store) -> tuple[bytes, list[Any]]:
    add_run(source, "run_1")
    add_run(source, "run_2")
    await add_session(source, "run_1", "s-1")
    await add_session(source, "run_2", "s-2")
    out = io.BytesIO()
    assert export_runs(source, ["run_1", "run_2"], out) == 2
    return out.getvalue(), [sessions_of(source, "run_1"), sessions_of(source, "run_2")]


async def _imports_whole(source: Store, target: Store) -> None:
    lines, expected = await _exported(source)
    report = import_runs(target, lines.splitlines())
    assert report.imported == ["run_1", "run_2"] and report.refused == []
    assert [sessions_of(target, "run_1"), sessions_of(target, "run_2")] == expected
    assert expected[0][0][2]["custom_title"] == "title of run_1"  # the summary came along
    # The copy goes on as the original would: a retried batch is stored once, new entries after.
    adapter = RunSessionStore(target, "run_1")
    key = {"project_key": "-work-repo", "session_id": "s-1"}
    await adapter.append(key, [entry("u2", 3), entry("u3", 4)])
    loaded = await adapter.load(key)
    assert loaded is not None and [e["n"] for e in loaded] == [1, 2, 3, 4]


async def test_export_then_import_carries_sessions_between_sqlite_stores(tmp_path: Path) -> None:
    source, target = open_store(str(tmp_path / "a.db"), create=True), open_store(str(tmp_path / "b.db"), create=True)
    try:
        await _imports_whole(source, target)
    finally:
        source.close()
        target.close()


@pytest.mark.parametrize("direction", ["sqlite-to-postgres", "postgres-to-sqlite"])
@needs_pg
async def test_export_then_import_carries_sessions_to_the_other_store_kind(
        direction: str, tmp_path: Path, pg_url: str) -> None:  # noqa: F811
    sqlite = str(tmp_path / "runs.db")
    src, dst = (sqlite, pg_url) if direction == "sqlite-to-postgres" else (pg_url, sqlite)
    source, target = open_store(src, create=True), open_store(dst, create=True)
    try:
        await _imports_whole(source, target)
    finally:
        source.close()
        target.close()


async def test_a_run_whose_session_exists_in_the_target_is_refused_whole(db: str, tmp_path: Path) -> None:
    source = open_store(str(tmp_path / "source.db"), create=True)
    target = open_store(db, create=True)
    try:
        lines, _ = await _exported(source)
        add_run(target, "run_other")
        taken = await add_session(target, "run_other", "s-2")  # the id run_2's session has in the source
        before = sessions_of(target, "run_other")
        report = import_runs(target, lines.splitlines())
        assert report.imported == ["run_1"]
        [(run_id, why)] = report.refused
        assert run_id == "run_2"
        assert f"run run_2: its session {taken['session_id']} exists in {target.location} already (run run_other); " \
               "not imported" == why
        with pytest.raises(UnknownRunError):
            target.get_run("run_2")
        assert sessions_of(target, "run_other") == before
        assert [s.sessionId for s in target.list_sessions()] == ["s-2", "s-1"]
    finally:
        source.close()
        target.close()
