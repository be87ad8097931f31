"""Keyset pages on PostgreSQL never skip a row that commits while a client pages (DESIGN §10).

PostgreSQL hands out identity keys when a row is inserted, not when it commits, so without care a
reader can see key 11 while key 10 is still uncommitted: a page that ends at 11 then skips 10 for good.
Here a writer is held just before its commit while a second writer inserts and a client reads pages;
whatever the interleaving, the pages must hold every row between the first and the last key they show.
(SQLite has one writer at a time: keys are visible in the order they are handed out.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flowkernel.store.base import AgentRun, RunRecord
from flowkernel.store.sql.postgres import PostgresStore

from tests.server_support import wait_for
from tests.test_postgres import pg_url  # noqa: F401  (the fixture)

pytestmark = pytest.mark.no_audit  # hand-made rows: nothing to replay


class HeldStore(PostgresStore):
    """A store whose next transaction waits, just before it commits, until ``release`` is set."""

    def __init__(self, url: str) -> None:
        self.holding = False
        self.inside = threading.Event()
        self.release = threading.Event()
        super().__init__(url)

    @contextmanager
    def _tx(self, conflict: str | None = None, run: str = "") -> Iterator[Any]:
        with super()._tx(conflict, run) as db:
            yield db
            if self.holding:
                self.holding = False
                self.inside.set()
                self.release.wait(30)


def _blocked_on_a_lock(store: PostgresStore) -> bool:
    rows = store._query("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
    return bool(rows[0][0])


def _message(i: int) -> dict[str, Any]:
    return {"flowRunId": "run_a", "runId": "nr_a", "nodeId": "agent", "sessionId": "ses_a", "role": "user",
            "content": f"m{i}", "step": i}


def _tool_call(i: int) -> dict[str, Any]:
    return {"flowRunId": "run_a", "runId": "nr_a", "nodeId": "agent", "sessionId": "ses_a", "toolName": "t",
            "toolUseId": f"tu_{i}", "status": "completed", "step": i}


def _agent_run(store: PostgresStore, i: int) -> None:
    row = AgentRun(agentRunId=f"nr_{i}", runId="run_a", agentId="agent", status="running", createdAt=i)
    store.commit("run_a", [], "running", 1, None, None, agent_runs=[row])


# For each list: one write, and how a page after a cursor is read (its keys, the next cursor).
def _ascending(list_rows: Callable[..., list[dict[str, Any]]]) -> Callable[[PostgresStore, int | None],
                                                                           tuple[list[int], int | None]]:
    def page(store: PostgresStore, after: int | None) -> tuple[list[int], int | None]:
        keys = [int(r["id"]) for r in list_rows(store, after or 0)]
        return keys, (keys[-1] if keys else after)
    return page


def _newest_first(store: PostgresStore, before: int | None) -> tuple[list[int], int | None]:
    keys = [k for k, _ in store.list_agent_runs(run_id="run_a", before=before, limit=1)]
    return keys, (keys[-1] if keys else None)


CASES = {
    "messages": (lambda s, i: s.add_agent_message(_message(i)),
                 _ascending(lambda s, after: s.list_agent_messages(flow_run_id="run_a", after=after, limit=1))),
    "tool-calls": (lambda s, i: s.add_tool_call(_tool_call(i)),
                   _ascending(lambda s, after: s.list_tool_calls(flow_run_id="run_a", after=after, limit=1))),
    "agent-runs": (_agent_run, _newest_first),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_page_read_while_an_earlier_key_is_uncommitted_never_skips_it(pg_url: str, kind: str) -> None:  # noqa: F811
    write, page = CASES[kind]
    held, other, reader = HeldStore(pg_url), PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        other.create_run(RunRecord(runId="run_a", flowName="f", flowHash="h", status="running", seq=1, input={},
                                   createdAt=1, updatedAt=1), [], b"{}")
        write(other, 0)  # a row committed before anything else
        held.holding = True
        first = threading.Thread(target=write, args=(held, 1))
        first.start()
        assert held.inside.wait(20), "the held writer never reached its commit"
        second = threading.Thread(target=write, args=(other, 2))
        second.start()
        # The second writer either committed already (keys visible out of order) or waits its turn.
        wait_for(lambda: not second.is_alive() or _blocked_on_a_lock(reader), what="the second writer to settle")
        seen: list[int] = []
        cursor: int | None = None
        while True:  # every page there is to read now
            keys, cursor = page(reader, cursor)
            seen += keys
            if not keys or cursor is None:
                break
        held.release.set()
        first.join(20)
        second.join(20)
        if kind != "agent-runs":  # ascending: what committed since comes after the cursor
            while True:
                keys, cursor = page(reader, cursor)
                if not keys:
                    break
                seen += keys
        assert len(seen) == len(set(seen)), f"a page repeated a row: {seen}"
        stored = _all_keys(reader, kind)
        assert len(stored) == 3
        # No row between the lowest and the highest key the pages showed is missing from them.
        assert [k for k in stored if min(seen) <= k <= max(seen)] == sorted(seen), (seen, stored)
        if kind != "agent-runs":
            assert sorted(seen) == stored
    finally:
        held.release.set()
        for store in (held, other, reader):
            store.close()


def _all_keys(store: PostgresStore, kind: str) -> list[int]:
    if kind == "messages":
        return [int(r["id"]) for r in store.list_agent_messages(flow_run_id="run_a", limit=100)]
    if kind == "tool-calls":
        return [int(r["id"]) for r in store.list_tool_calls(flow_run_id="run_a", limit=100)]
    return sorted(k for k, _ in store.list_agent_runs(run_id="run_a", limit=100))
