"""The store protocol: runs, their event log, snapshot checkpoints, commands, leases, agent rows,
the queue of runs and the workers that execute them, and the Claude Code sessions of runs.

A run's snapshot is stored as a checkpoint plus the events after it; ``commit`` appends events and
updates the run row in one transaction, and writes a new checkpoint only when asked (compaction),
so a transition costs what changed, not the size of the run. Blobs are content-addressed and shared:
checkpoints refer to them, and so do the stored bodies of events with large payloads.

One execution at a time: a run is executed under a **lease** (owner, epoch, expiry). Every grant
of a lease gives it a new epoch, and every commit of an execution names the lease it holds: the
store refuses the commit (``LeaseLostError``) unless owner and epoch still match, checked in the
commit's own transaction. An executor that was paused past its lease (SIGSTOP, a long GC, a
partition) therefore can never write again once another has taken the run over.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
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
    leaseEpoch: int = 0  # grows with every grant of the lease (fencing: see the module docstring)
    pooled: bool = False  # executed by the worker pool: queued at creation, recovered when orphaned
    maxRuns: int | None = None  # the flow's maxConcurrentRuns when the run was created
    # How the run executes, wherever it is continued (``flowkernel.run.settings.RunSettings`` as JSON).
    settings: dict[str, Any] | None = None


class RunTotals(msgspec.Struct, frozen=True):
    """What a commit writes to the run row when the run's usage or cost changed."""

    usage: dict[str, int]
    totalCostUsd: float


class Lease(msgspec.Struct, frozen=True):
    """One execution's hold on a run: ``owner`` (the process) and ``epoch`` (which grant)."""

    owner: str
    epoch: int


class Claim(msgspec.Struct, frozen=True):
    """A run a worker claimed: ``status`` ``queued`` (start it) or ``running`` (an orphan: recover it)."""

    runId: str
    status: str
    lease: Lease


class WorkerRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A worker process, as it registered itself; ``runs`` are the runs whose lease it holds."""

    workerId: str
    host: str
    pid: int
    startedAt: int
    heartbeatAt: int
    concurrency: int
    leaseMs: int
    runs: list[str] = msgspec.field(default_factory=list)


class AgentRun(msgspec.Struct, kw_only=True):
    """One agent run: a node run of a ``claude.agent`` node, as the ``agent_runs`` table holds it
    (DESIGN §10). A fold of its run's events (``flowkernel.history.agent_runs``), kept by the run's commits."""

    agentRunId: str  # the node run id
    runId: str  # the run it belongs to
    agentId: str  # the node id
    status: str  # running | waiting | completed | failed | interrupted
    createdAt: int  # its node:start
    attempt: int = 1
    item: int | None = None  # the forEach item it ran
    stepCount: int = 0  # model calls made by this agent run (each resume gets a fresh ``maxSteps``)
    maxSteps: int | None = None  # its ``maxTurns``
    sessionId: str | None = None
    model: str | None = None
    resumedFrom: str | None = None  # the agent run whose conversation it continues
    parentRunId: str | None = None  # the parent of its run (the agents of a flow.call child)
    completedAt: int | None = None
    durationMs: int | None = None
    errorMessage: str | None = None
    summary: str | None = None  # its final text
    usage: dict[str, int] = msgspec.field(default_factory=dict)
    totalCostUsd: float = 0.0


class CommitRequest(msgspec.Struct, kw_only=True):
    """One run's ``commit``, as its arguments: what ``commit_group`` commits with others'."""

    runId: str
    events: Sequence[EventRow]
    status: str
    seq: int
    error: str | None
    checkpoint: bytes | None
    blobs: Mapping[str, bytes] | None = None
    lease: Lease | None = None
    release: bool = False
    taken: Sequence[tuple[int, int]] = ()
    totals: RunTotals | None = None
    agent_runs: Sequence[AgentRun] = ()


class CreateRequest(msgspec.Struct, kw_only=True):
    """One ``create_run``, as its arguments: a new run can share a transaction with others' commits."""

    record: RunRecord
    events: Sequence[EventRow]
    checkpoint: bytes
    blobs: Mapping[str, bytes] | None = None
    document: str | None = None
    agent_runs: Sequence[AgentRun] = ()


class CommandRow(msgspec.Struct, kw_only=True):
    id: int
    runId: str
    body: dict[str, Any]
    createdAt: int


# Folds the entries an append newly stored into the summary of the session's main transcript:
# (the summary as stored before, or None for the first; those entries) -> the summary to store.
SummaryFold = Callable[[dict[str, Any] | None, list[dict[str, Any]]], dict[str, Any]]


class StoredSession(msgspec.Struct, kw_only=True, frozen=True):
    """A Claude Code session mirrored into the store (DESIGN §7b), as ``list_sessions`` gives it."""

    runId: str  # the run that owns it: prune, export and import carry it with that run
    projectKey: str
    sessionId: str
    mtime: int  # when its main transcript last changed (epoch ms; the store's clock)
    summary: dict[str, Any] | None = None  # the folded summary of the main transcript (opaque here)
    summaryMtime: int | None = None  # when that summary was stored, on the clock of ``mtime``


class SessionRows(Protocol):
    """The transcripts of Claude Code sessions, as the Agent SDK mirrors them (DESIGN §7b).

    A transcript is keyed by (project key, session id, subpath): the subpath is ``""`` for the main
    transcript and e.g. ``"subagents/agent-1"`` for a subagent's. It holds its entries (JSON objects)
    in append order. A session (project key, session id) belongs to one run, the run whose node
    started it; its rows go with that run (prune, export, import). Writes name the run and, when
    executed under a lease, the lease: refused in their own transaction once it no longer holds the
    run (``LeaseLostError``), as agent messages are.
    """

    def append_session_entries(self, run_id: str, project_key: str, session_id: str, subpath: str,
                               entries: Sequence[Mapping[str, Any]], *, fold: SummaryFold | None = None,
                               lease: Lease | None = None) -> int:
        """Store ``entries`` after the transcript's, in one transaction; returns how many were new.

        An entry whose ``uuid`` (a string) the transcript holds already is left out (the SDK retries
        batches); entries without one are always stored. With ``fold``, a main transcript's summary
        is folded from the new entries in the same transaction. No new entry: nothing changes. A
        session of another run is refused (``StoreError``), and so is an unknown run."""
        ...

    def load_session_entries(self, project_key: str, session_id: str, subpath: str = "", *,
                             run_id: str | None = None) -> list[dict[str, Any]] | None:
        """The transcript's entries in append order; None if it was never written (or, with
        ``run_id``, belongs to another run)."""
        ...

    def list_sessions(self, *, project_key: str | None = None, run_id: str | None = None) -> list[StoredSession]:
        """Sessions with a main transcript, filtered by project key and owning run when given, in
        the order they were first stored."""
        ...

    def list_session_subpaths(self, project_key: str, session_id: str, *,
                              run_id: str | None = None) -> list[str]:
        """The subpaths of the session's other transcripts (its subagents'), in the order they were
        first stored; the main transcript is not among them."""
        ...

    def delete_session(self, run_id: str, project_key: str, session_id: str, subpath: str | None = None, *,
                       lease: Lease | None = None) -> None:
        """Delete the run's session: all its transcripts and its summary, or with ``subpath`` that
        one transcript only. A session of another run, or none, is left alone."""
        ...


def session_of_another_run(session_id: str, project_key: str, owner: str, run_id: str) -> str:
    """Why a write of run ``run_id`` to a session of run ``owner`` is refused."""
    return f"session {session_id} (project {project_key}) belongs to run {owner}, not to run {run_id}"


class Listener(Protocol):
    """Wake-ups from the store: a run was queued or handed over, or a command was stored."""

    def wait(self, timeout_s: float) -> bool:
        """Block until a wake-up arrives (True) or ``timeout_s`` passes (False)."""
        ...

    def close(self) -> None: ...


class Backfill(Protocol):
    """What folds a stored run's agent runs from its log: needed once, when a database from before schema 9
    (which had no agent-run rows) is migrated. The store knows no node type and no read model, so who
    opens the store hands it in (``flowkernel.history.agent_runs.AgentRunBackfill``: the flowkernel
    command and ``Kernel(url)`` do)."""

    def wants(self, document: str) -> bool:
        """Whether runs of this stored flow document (its canonical JSON) may have agent runs."""
        ...

    def __call__(self, document: str, bodies: Sequence[bytes]) -> list[AgentRun]:
        """The agent runs of one run of that flow, from its stored event bodies in seq order."""
        ...


class Store(SessionRows, Protocol):
    """Where runs live. Implementations: MemoryStore, SqliteStore, PostgresStore."""

    location: str

    # the store's own secrets
    def secret(self, name: str) -> bytes:
        """The store's secret called ``name`` (32 random bytes), made and kept on first use: the same for
        every process on the store, unknown to anyone without access to it."""
        ...

    # flows and runs
    def put_flow(self, flow_hash: str, name: str, document: str) -> None: ...
    def get_flow(self, flow_hash: str) -> str: ...
    def create_run(self, record: RunRecord, events: Sequence[EventRow],
                   checkpoint: bytes, blobs: Mapping[str, bytes] | None = None, *,
                   document: str | None = None, agent_runs: Sequence[AgentRun] = ()) -> None:
        """Store a new run, its first events and checkpoint in one transaction; with ``document``,
        also the flow (under ``record.flowHash``) unless it is stored already. A ``record`` with a
        ``leaseOwner`` is created leased to it. ``agent_runs``: those of its events (a fork's)."""
        ...
    def get_run(self, run_id: str) -> RunRecord: ...
    def list_runs(self, status: str | None = None, parent: str | None = None, limit: int = 1000) -> list[RunRecord]: ...
    def page_runs(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                  before: int | None = None, limit: int = 50, after: int | None = None, oldest: bool = False,
                  id_prefix: str | None = None, error: str | None = None) -> list[RunRecord]:
        """Runs newest first (by ``runNo``), those with ``runNo < before`` when given: keyset pages; with
        ``oldest``, oldest first, those with ``runNo > after``. ``id_prefix``: run ids that start with it;
        ``error``: runs whose error contains it, whatever the case."""
        ...
    def count_runs(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                   before: int | None = None) -> int:
        """How many runs ``page_runs`` lists with these filters and no limit."""
        ...
    def find_idempotent(self, key: str) -> RunRecord | None:
        """The run created with this idempotency key, if any."""
        ...
    def descendant_totals(self, run_ids: Sequence[str]) -> dict[str, RunTotals]:
        """For each run that has child runs: the summed usage and cost of all its descendants."""
        ...
    def set_run_settings(self, run_id: str, settings: dict[str, Any] | None) -> None:
        """Replace the settings the run executes with."""
        ...
    def update_run_flow(self, run_id: str, flow_hash: str, name: str, document: str, source: str | None) -> None:
        """Store the flow ``document`` (unless stored already) and make it the run's flow, from ``source``."""
        ...

    # the log
    def commit(self, run_id: str, events: Sequence[EventRow],
               status: str, seq: int, error: str | None, checkpoint: bytes | None,
               blobs: Mapping[str, bytes] | None = None, *, lease: Lease | None = None,
               release: bool = False, taken: Sequence[tuple[int, int]] = (),
               totals: RunTotals | None = None, agent_runs: Sequence[AgentRun] = ()) -> None:
        """Append events and set the run's status, in one transaction.

        ``lease``: the commit happens only if that lease still holds the run (else ``LeaseLostError``,
        and nothing is written); ``release`` ends it with this commit. ``taken``: (command id, seq of
        its ``command:received``) pairs marked taken in the same transaction, so a command is never
        taken twice, whatever the crash point. ``totals``: the run's usage and cost changed.
        ``agent_runs``: the run's agent runs these events started or changed."""
        ...
    def commit_group(self, requests: Sequence[CommitRequest | CreateRequest]) -> list[Exception | None]:
        """Several runs' commits (and new runs) in one transaction (one fsync), each in a savepoint of its
        own: one that fails (its events out of order, its lease lost) is rolled back alone, and its error
        is returned in its place; the others are committed. A transaction that fails as a whole fails
        every one."""
        ...
    def read_blobs(self, keys: Iterable[str]) -> dict[str, bytes]: ...
    def read_events(self, run_id: str, after: int = 0, until: int | None = None) -> list[bytes]:
        """Event bodies in seq order, whole: a body stored packed (``flowkernel.store.packing.PACKED_PREFIX``:
        large payloads refer to blobs committed with it) is resolved before it is returned."""
        ...
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
                      steal_from: str | None = None) -> Lease:
        """Take the lease for a new execution by ``owner`` (a new epoch); returns the lease as it
        stands: ``owner``'s, or the other holder's if it is held and unexpired. ``steal_from`` names
        a holder known to be dead, whose lease is taken over before it expires."""
        ...
    def renew_lease(self, run_id: str, lease: Lease, now_ms: int, ttl_ms: int) -> bool:
        """Extend ``lease``; False if it no longer holds the run (another execution took it over)."""
        ...
    def release_lease(self, run_id: str, lease: Lease) -> None:
        """End ``lease`` if it still holds the run; a queue wake-up goes out if the run is left running."""
        ...

    # the queue and the workers (DESIGN §11)
    def claim_runs(self, owner: str, now_ms: int, ttl_ms: int, limit: int,
                   dead: Sequence[str] = ()) -> list[Claim]:
        """Lease up to ``limit`` runs to ``owner`` in one transaction, oldest first: ``queued`` runs,
        and pooled top-level ``running`` runs whose lease is free, expired or held by one of the
        ``dead``. A queued run of a flow with ``maxRuns`` is claimed only while fewer pooled runs of
        that flow are running or starting."""
        ...
    def register_worker(self, worker: WorkerRecord) -> None: ...
    def heartbeat(self, worker_id: str, now_ms: int) -> None: ...
    def remove_worker(self, worker_id: str) -> None: ...
    def list_workers(self) -> list[WorkerRecord]:
        """Registered workers (live or not: see ``flowkernel.run.pool.live_workers``), each with its runs."""
        ...
    def listen(self) -> Listener | None:
        """A listener for the store's wake-ups (PostgreSQL LISTEN/NOTIFY), or None where workers poll."""
        ...

    # telemetry (DESIGN §12): the W3C traceparent every execution of a run continues
    def get_trace_context(self, run_id: str) -> str | None: ...
    def set_trace_context(self, run_id: str, trace_context: str) -> None:
        """Keep the first context given for ``run_id``; later ones are ignored."""
        ...

    # agent runs (DESIGN §10)
    def list_agent_runs(self, *, run_id: str | None = None, agent_run_id: str | None = None,
                        status: str | None = None, agent_id: str | None = None, parent_run_id: str | None = None,
                        open_only: bool = False, before: int | None = None,
                        limit: int = 50) -> list[tuple[int, AgentRun]]:
        """Agent runs matching every filter given, newest first, each with its key (the order they
        were stored in); those with a key below ``before`` when given: keyset pages. ``open_only``:
        those still running or waiting."""
        ...

    # agent conversations (DESIGN §7)
    def add_agent_message(self, row: dict[str, Any], *, lease: Lease | None = None) -> int:
        """Store one message; with ``lease``, only while it holds ``row["flowRunId"]`` (else LeaseLostError)."""
        ...
    def list_agent_messages(self, *, run_id: str | None = None, session_id: str | None = None,
                            flow_run_id: str | None = None, after: int = 0, limit: int = 100,
                            node_id: str | None = None) -> list[dict[str, Any]]: ...
    def add_tool_call(self, row: dict[str, Any], *, lease: Lease | None = None) -> int:
        """Store one tool call; ``lease`` as for ``add_agent_message``."""
        ...
    def list_tool_calls(self, *, run_id: str | None = None, session_id: str | None = None,
                        flow_run_id: str | None = None, tool_name: str | None = None, status: str | None = None,
                        after: int = 0, limit: int = 100, node_id: str | None = None) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


# An event row as the shell hands it to ``commit``: (seq, timestamp, body). The body is the whole
# event; the rest is what the stores key and date it by.
EventRow = tuple[int, int, bytes]
