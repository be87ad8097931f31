"""``FencedStore``: the store as the node runs of one execution see it.

The conversation rows an agent node adds for its run (messages, tool calls, the transcripts of its
Claude Code sessions) are written only while the execution that runs it still holds the run's lease,
checked in the write's own transaction: an executor frozen past its lease (DESIGN §11) can add no
stray turn to a conversation that another executor has taken over and will rebuild on resume.
Everything else passes straight through.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from flowkernel.store.base import Lease, Store, SummaryFold


class FencedStore:
    """``store``, with the agent rows it adds fenced by ``lease``."""

    def __init__(self, store: Store, lease: Lease) -> None:
        self._store = store
        self._lease = lease

    def add_agent_message(self, row: dict[str, Any]) -> int:
        return self._store.add_agent_message(row, lease=self._lease)

    def add_tool_call(self, row: dict[str, Any]) -> int:
        return self._store.add_tool_call(row, lease=self._lease)

    def append_session_entries(self, run_id: str, project_key: str, session_id: str, subpath: str,
                               entries: Sequence[Mapping[str, Any]], *, fold: SummaryFold | None = None,
                               lease: Lease | None = None) -> int:
        return self._store.append_session_entries(run_id, project_key, session_id, subpath, entries, fold=fold,
                                                  lease=lease or self._lease)

    def delete_session(self, run_id: str, project_key: str, session_id: str, subpath: str | None = None, *,
                       lease: Lease | None = None) -> None:
        self._store.delete_session(run_id, project_key, session_id, subpath, lease=lease or self._lease)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def fenced(store: Store, lease: Lease | None) -> Store:
    """The store for node runs executed under ``lease`` (``store`` itself when there is none)."""
    # A Store by delegation (``__getattr__``), which the Protocol check cannot see.
    return store if lease is None else cast(Store, FencedStore(store, lease))
