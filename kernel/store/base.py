"""The store protocol: runs, their event log, snapshot checkpoints, commands, leases, agent rows.

A run's snapshot is stored as a checkpoint plus the events after it; ``commit`` appends events and
updates the run row in one transaction, and writes a new checkpoint only when asked (compaction),
so a transition costs what changed, not the size of the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import msgspec


class RunRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    runId: str
    flowName: str
    flowHash: str
    status: str
    seq: int
    input: Any
    createdAt: int
    updatedAt: int
    error: str | None = None
    parentRunId: str | None = None
    parentNodeRunId: str | None = None
    forkedFrom: str | None = None
    forkedAt: int | None = None
    flowSource: str | None = None
    leaseOwner: str | None = None
    leaseExpiresAt: int | None = None
    # The run's own model calls (its snapshot's ``usage`` and ``totalCostUsd``, kept on the row by
    # each commit that changes them, so listing runs reads no events); child runs have their own.
    usage: dict[str, int] = msgspec.field(default_factory=dict)
    totalCostUsd: float = 0.0
    idempotencyKey: str | None = None
    # Handed out in commit order: the key of keyset pages of runs (newest first).
    runNo: int | None = None


class RunTotals(msgspec.Struct, frozen=True):
    """What a commit writes to the run row when the run's usage or cost changed."""

    usage: dict[str, int]
    totalCostUsd: float


class CommandRow(msgspec.Struct, kw_only=True):
    id: int
    runId: str
    body: dict[str, Any]
    createdAt: int


class Store(Protocol):
    """Where runs live. Implementations: MemoryStore, SqliteStore, PostgresStore."""

    location: str

    # flows and runs
    def put_flow(self, flow_hash: str, name: str, document: str) -> None: ...
    def get_flow(self, flow_hash: str) -> str: ...
    def create_run(self, record: RunRecord, events: Sequence[EventRow],
                   checkpoint: bytes, blobs: Mapping[str, bytes] | None = None, *,
                   document: str | None = None) -> None:
        """Store a new run, its first events and checkpoint in one transaction; with ``document``,
        also the flow (under ``record.flowHash``) unless it is stored already. A ``record`` with a
        ``leaseOwner`` is created leased to it."""
        ...
    def get_run(self, run_id: str) -> RunRecord: ...
    def list_runs(self, status: str | None = None, parent: str | None = None, limit: int = 1000) -> list[RunRecord]: ...
    def page_runs(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                  before: int | None = None, limit: int = 50) -> list[RunRecord]:
        """Runs newest first (by ``runNo``), those with ``runNo < before`` when given: keyset pages."""
        ...
    def find_idempotent(self, key: str) -> RunRecord | None:
        """The run created with this idempotency key, if any."""
        ...
    def descendant_totals(self, run_ids: Sequence[str]) -> dict[str, RunTotals]:
        """For each run that has child runs: the summed usage and cost of all its descendants."""
        ...

    # the log
    def commit(self, run_id: str, events: Sequence[EventRow],
               status: str, seq: int, error: str | None, checkpoint: bytes | None,
               blobs: Mapping[str, bytes] | None = None, release: str | None = None, *,
               totals: RunTotals | None = None) -> None:
        """Append events and set the run's status, in one transaction; ``release`` names a lease
        holder whose lease ends with this commit (if it still holds it); ``totals``: the run's usage
        and cost changed."""
        ...
    def read_blobs(self, keys: Iterable[str]) -> dict[str, bytes]: ...
    def read_events(self, run_id: str, after: int = 0, until: int | None = None) -> list[bytes]: ...
    def read_checkpoint(self, run_id: str, at_most: int | None = None) -> tuple[int, bytes] | None: ...
    def last_seqs(self, run_ids: Sequence[str]) -> dict[str, int]:
        """The seq of each run's last committed event (runs that do not exist are left out)."""
        ...

    # commands from other processes
    def enqueue_command(self, run_id: str, body: dict[str, Any]) -> int: ...
    def pending_commands(self, run_id: str) -> list[CommandRow]: ...
    def finish_command(self, command_id: int, seq: int) -> None: ...
    def change_token(self) -> int: ...

    # one executor per run
    def acquire_lease(self, run_id: str, owner: str, now_ms: int, ttl_ms: int,
                      steal_from: str | None = None) -> str | None:
        """Take or renew the lease; returns the other holder if it is held. ``steal_from`` names a
        holder known to be dead, whose lease is taken over before it expires."""
        ...
    def release_lease(self, run_id: str, owner: str) -> None: ...

    # telemetry (DESIGN §12): the W3C traceparent every execution of a run continues
    def get_trace_context(self, run_id: str) -> str | None: ...
    def set_trace_context(self, run_id: str, trace_context: str) -> None:
        """Keep the first context given for ``run_id``; later ones are ignored."""
        ...

    # agent conversations (DESIGN §7)
    def add_agent_message(self, row: dict[str, Any]) -> int: ...
    def list_agent_messages(self, *, run_id: str | None = None, session_id: str | None = None,
                            flow_run_id: str | None = None, after: int = 0, limit: int = 100,
                            node_id: str | None = None) -> list[dict[str, Any]]: ...
    def add_tool_call(self, row: dict[str, Any]) -> int: ...
    def list_tool_calls(self, *, run_id: str | None = None, session_id: str | None = None,
                        flow_run_id: str | None = None, tool_name: str | None = None, status: str | None = None,
                        after: int = 0, limit: int = 100, node_id: str | None = None) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


# An event row as the shell hands it to ``commit``: (seq, timestamp, body). The body is the whole
# event; the rest is what the stores key and date it by.
EventRow = tuple[int, int, bytes]
