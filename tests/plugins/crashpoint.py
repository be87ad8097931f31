"""Test plugin: SIGKILL the process at a chosen durable write, so a crash lands at a repeatable point.

Every durable write of the SQLite store is counted: a commit of events (``commit``; a group commit
of several runs is one), a new run (``create_run``), an agent message row (``message``), a tool-call
row (``tool-call``) and a taken command (``finish_command``). ``FLOWKERNEL_CRASH`` (read when this module is imported, or given to
``arm``) names where to die:

- ``before-write:N``: right before the N-th durable write of any kind (so the first N-1 are stored);
- ``before-message:N`` / ``before-tool-call:N`` / ``before-commit:N``: before the N-th write of that kind;
- ``after-event:TYPE:N``: right after the commit that stores the N-th event of TYPE (e.g.
  ``after-event:state:patch:1``); ``before-event:TYPE:N``: right before that commit.

Lease renewals and releases are not counted: they depend on the clock, not on what the run does.
With ``FLOWKERNEL_CRASH_COUNT=FILE`` the number of durable writes made is written to FILE at exit
(how a soak test learns the range to pick crash points from).
"""

from __future__ import annotations

import atexit
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flowkernel.store.sql.sqlite import SqliteStore


@dataclass
class _Plan:
    kind: str = ""  # write | message | tool-call | commit | event | event-before
    n: int = 0
    event: bytes = b""
    counts: dict[str, int] = field(default_factory=dict)


_plan = _Plan()


def arm(spec: str | None) -> None:
    """Set where this process dies (``None`` or empty: never); counts start again from zero."""
    global _plan
    _plan = _Plan()
    if not spec:
        return
    head, _, rest = spec.partition(":")
    if head in ("after-event", "before-event"):
        event_type, _, n = rest.rpartition(":")
        _plan = _Plan(kind="event" if head == "after-event" else "event-before", n=int(n),
                      event=f'"type":"{event_type}"'.encode())
    elif head.startswith("before-"):
        _plan = _Plan(kind=head.removeprefix("before-"), n=int(rest))
    else:
        raise ValueError(f"FLOWKERNEL_CRASH={spec!r}: expected before-KIND:N or after-event:TYPE:N")


def writes() -> int:
    """Durable writes made by this process so far."""
    return _plan.counts.get("write", 0)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _count(kind: str) -> None:
    for k in ("write", kind):
        _plan.counts[k] = _plan.counts.get(k, 0) + 1
        if _plan.kind == k and _plan.counts[k] == _plan.n:
            _die()


def _seen(rows: Sequence[tuple[int, int, bytes]]) -> int:
    """Events of the planned type stored so far, with ``rows`` (counted once, after the commit)."""
    return _plan.counts.get("event", 0) + sum(1 for _, _, body in rows if _plan.event in body)


def _before_commit(rows: Sequence[tuple[int, int, bytes]]) -> None:
    if _plan.kind == "event-before" and _seen(rows) >= _plan.n:
        _die()


def _after_commit(rows: Sequence[tuple[int, int, bytes]]) -> None:
    if _plan.kind not in ("event", "event-before"):
        return
    _plan.counts["event"] = seen = _seen(rows)
    if _plan.kind == "event" and seen >= _plan.n:
        _die()


_real_commit = SqliteStore.commit
_real_create_run = SqliteStore.create_run
_real_add_message = SqliteStore.add_agent_message
_real_add_tool_call = SqliteStore.add_tool_call
_real_finish_command = SqliteStore.finish_command
_real_commit_group = SqliteStore.commit_group


def _commit(self: SqliteStore, run_id: str, events: Sequence[tuple[int, int, bytes]], *args: Any,
            **kwargs: Any) -> None:
    _count("commit")
    _before_commit(events)
    _real_commit(self, run_id, events, *args, **kwargs)
    _after_commit(events)


def _create_run(self: SqliteStore, record: Any, events: Sequence[tuple[int, int, bytes]], *args: Any,
                **kwargs: Any) -> None:
    _count("create-run")
    _before_commit(events)
    _real_create_run(self, record, events, *args, **kwargs)
    _after_commit(events)


def _commit_group(self: SqliteStore, requests: Sequence[Any]) -> list[Exception | None]:
    """Several runs' commits in one transaction (a parent and its child runs): one durable write."""
    events = [row for r in requests for row in r.events]
    _count("commit")
    _before_commit(events)
    results = _real_commit_group(self, requests)
    _after_commit(events)
    return results


def _add_message(self: SqliteStore, row: dict[str, Any], **kwargs: Any) -> int:
    _count("message")
    return _real_add_message(self, row, **kwargs)


def _add_tool_call(self: SqliteStore, row: dict[str, Any], **kwargs: Any) -> int:
    _count("tool-call")
    return _real_add_tool_call(self, row, **kwargs)


def _finish_command(self: SqliteStore, command_id: int, seq: int) -> None:
    _count("finish-command")
    _real_finish_command(self, command_id, seq)


SqliteStore.commit = _commit  # type: ignore[method-assign]
SqliteStore.create_run = _create_run  # type: ignore[method-assign]
SqliteStore.add_agent_message = _add_message  # type: ignore[method-assign]
SqliteStore.add_tool_call = _add_tool_call  # type: ignore[method-assign]
SqliteStore.finish_command = _finish_command  # type: ignore[method-assign]
SqliteStore.commit_group = _commit_group  # type: ignore[method-assign]

arm(os.environ.get("FLOWKERNEL_CRASH"))

_count_file = os.environ.get("FLOWKERNEL_CRASH_COUNT")
if _count_file:
    def _write_count(path: str = _count_file) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(str(writes()))

    atexit.register(_write_count)
