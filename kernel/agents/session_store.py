"""``RunSessionStore``: the Claude Agent SDK's ``SessionStore`` over the store of a run (DESIGN §7b).

Given as ``ClaudeAgentOptions(session_store=RunSessionStore(store, run_id, lease))``, it mirrors
the transcripts the Claude Code CLI writes into the run's own store (memory, SQLite or PostgreSQL),
so a session resumes from the store on any worker, with any ``HOME``. The sessions it lists, loads
and deletes are its run's only; what it appends is owned by the run and fenced by ``lease`` (or by
the store itself, when given the store node runs see, ``ctx.store``, which carries the lease).

It implements every method of the SDK's protocol (``append``, ``load``, ``list_sessions``,
``list_session_summaries``, ``delete``, ``list_subkeys``) by duck typing, as the SDK allows, so
importing this module does not import ``claude_agent_sdk`` (about two seconds): only the summary
fold does, on the first append, from a process that runs the SDK already. Store calls run in a
worker thread, off the event loop the SDK's transport reads the CLI on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import anyio.to_thread

if TYPE_CHECKING:
    from claude_agent_sdk import (
        SessionKey,
        SessionListSubkeysKey,
        SessionStoreEntry,
        SessionStoreListEntry,
        SessionSummaryEntry,
    )

T = TypeVar("T")

# (the summary as stored before, or None; the entries an append newly stored) -> the summary to store
Fold = Callable[[dict[str, Any] | None, list[dict[str, Any]]], dict[str, Any]]


class StoredSessionView(Protocol):
    """A session as ``SessionRowsView.list_sessions`` lists it (``flowkernel.store.base.StoredSession``)."""

    @property
    def sessionId(self) -> str: ...
    @property
    def mtime(self) -> int: ...
    @property
    def summary(self) -> dict[str, Any] | None: ...
    @property
    def summaryMtime(self) -> int | None: ...


class SessionRowsView(Protocol):
    """What the adapter needs of a store: its ``SessionRows`` role (``flowkernel.store.base``), which
    every store and the fenced store node runs see implement. Restated here, as agents/ does not import
    the store; ``lease`` is the store's ``Lease``, passed through."""

    def append_session_entries(self, run_id: str, project_key: str, session_id: str, subpath: str,
                               entries: Sequence[Mapping[str, Any]], *, fold: Fold | None = None,
                               lease: Any = None) -> int: ...

    def load_session_entries(self, project_key: str, session_id: str, subpath: str = "", *,
                             run_id: str | None = None) -> list[dict[str, Any]] | None: ...

    def list_sessions(self, *, project_key: str | None = None,
                      run_id: str | None = None) -> Sequence[StoredSessionView]: ...

    def list_session_subpaths(self, project_key: str, session_id: str, *,
                              run_id: str | None = None) -> list[str]: ...

    def delete_session(self, run_id: str, project_key: str, session_id: str, subpath: str | None = None, *,
                       lease: Any = None) -> None: ...


class RunSessionStore:
    """The SDK's ``SessionStore`` for the Claude Code sessions of run ``run_id`` in ``store``.

    ``lease``: the lease the run is executed under (``flowkernel.store.base.Lease``); every append and
    delete is refused (``LeaseLostError``, which the SDK reports as a ``MirrorErrorMessage``) once it no
    longer holds the run. None when ``store`` fences by itself (``ctx.store``) or nothing executes the run.
    """

    def __init__(self, store: SessionRowsView, run_id: str, lease: Any = None) -> None:
        self.store = store
        self.run_id = run_id
        self.lease = lease

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs))

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        if not entries:
            return
        subpath = key.get("subpath") or ""
        fold = None if subpath else _summary_fold(key["project_key"], key["session_id"])
        await self._call(self.store.append_session_entries, self.run_id, key["project_key"], key["session_id"],
                         subpath, cast("list[Mapping[str, Any]]", entries), fold=fold, lease=self.lease)

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        found = await self._call(self.store.load_session_entries, key["project_key"], key["session_id"],
                                 key.get("subpath") or "", run_id=self.run_id)
        return cast("list[SessionStoreEntry] | None", found)

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        rows = await self._call(self.store.list_sessions, project_key=project_key, run_id=self.run_id)
        return [{"session_id": r.sessionId, "mtime": r.mtime} for r in rows]

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        rows = await self._call(self.store.list_sessions, project_key=project_key, run_id=self.run_id)
        return [{"session_id": r.sessionId, "mtime": r.summaryMtime, "data": r.summary}
                for r in rows if r.summary is not None and r.summaryMtime is not None]

    async def delete(self, key: SessionKey) -> None:
        # A key without a subpath is the whole session: its subagents' transcripts go with it.
        await self._call(self.store.delete_session, self.run_id, key["project_key"], key["session_id"],
                         key.get("subpath") or None, lease=self.lease)

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        return await self._call(self.store.list_session_subpaths, key["project_key"], key["session_id"],
                                run_id=self.run_id)


def _summary_fold(project_key: str, session_id: str) -> Fold:
    """The SDK's own summary fold (``claude_agent_sdk.fold_session_summary``) over the stored summary."""

    def fold(before: dict[str, Any] | None, entries: list[dict[str, Any]]) -> dict[str, Any]:
        from claude_agent_sdk import fold_session_summary

        prev: SessionSummaryEntry | None = None
        if before is not None:
            prev = {"session_id": session_id, "mtime": 0, "data": before}
        key: SessionKey = {"project_key": project_key, "session_id": session_id}
        return fold_session_summary(prev, key, cast("list[SessionStoreEntry]", entries))["data"]

    return fold
