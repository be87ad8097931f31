"""What the SQL stores share: the schema, the statements, the row mappers and the method bodies.

``SqlStore`` holds everything that is the same in ``SqliteStore`` and ``PostgresStore``. Statements
are written once with ``?`` placeholders in class attributes named ``_sql_*``; a subclass that sets
``param = "%s"`` gets them rewritten once, when its class is defined (never per call). Statements
built per call (filters, ``IN`` lists) use ``self.param``. A subclass supplies only the dialect:
the connection, ``_tx``/``_query`` (driver errors become ``StoreError``), how a body is stored
(``_enc``/``_dec``), ``_executemany``, ``change_token`` and whatever else differs.
"""

from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from flowkernel.core.events import USAGE_KEYS
from flowkernel.core.nesting import loads
from flowkernel.errors import LeaseLostError, StoreError, UnknownRunError
from flowkernel.ids import now_ms
from flowkernel.store.base import (
    AgentRun,
    Backfill,
    Claim,
    CommandRow,
    CommitRequest,
    CreateRequest,
    EventRow,
    Lease,
    Listener,
    RunRecord,
    RunTotals,
    WorkerRecord,
)
from flowkernel.store.packing import resolve_bodies
from flowkernel.store.sql.archive import RUN_SPAN, SqlArchive
from flowkernel.store.sql.sessions import SESSION_SCHEMA, SqlSessions

SCHEMA_VERSION = 12  # 2: content-addressed checkpoint blobs; 3: events keyed by run number and seq;
# 4: an event row is its key, its time and its body (the rest was in the body already);
# 5: a run's usage and cost, idempotency keys, agent runs, indexes for keyset pages;
# 6: an assistant message keeps the model call that produced it (model, id, stop reason, usage);
# 7: a run's trace context (run_traces), so every execution of a run is in one trace;
# 8: the queue and the workers: lease epochs (fencing), pooled runs, maxConcurrentRuns, a workers table;
# 9: an agent run is keyed by its node run and its run (a fork copies the node runs it replays);
# 10: a run keeps the settings it executes with (fixtures directory, plugin modules);
# 11: a store keeps secrets of its own (the key that signs the API's page cursors)
# 12: the transcripts of Claude Code sessions (``flowkernel.store.sql.sessions``)

_EVENTS_PER_INSERT = 100  # rows per INSERT statement (300 parameters, far below either driver's limit)

# Version 5: pages of runs are keyed by run number (handed out in commit order, so a run that
# appears later is always newer than every run a client has seen), filtered by status, flow or parent;
# agent runs (one row per node run of a ``claude.agent`` node, kept by the commits of its run).
_AGENT_RUNS = """CREATE TABLE IF NOT EXISTS agent_runs (
        id {id}, agent_run_id TEXT NOT NULL, flow_run_id TEXT NOT NULL, node_id TEXT NOT NULL,
        parent_run_id TEXT, status TEXT NOT NULL, session_id TEXT, model TEXT, resumed_from TEXT,
        item BIGINT, attempt INTEGER NOT NULL, step_count INTEGER NOT NULL DEFAULT 0, max_steps INTEGER,
        input_tokens BIGINT NOT NULL DEFAULT 0, output_tokens BIGINT NOT NULL DEFAULT 0,
        cache_creation_input_tokens BIGINT NOT NULL DEFAULT 0, cache_read_input_tokens BIGINT NOT NULL DEFAULT 0,
        cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0, created_at BIGINT NOT NULL, completed_at BIGINT,
        duration_ms BIGINT, error_message TEXT, summary TEXT)"""
_V5_INDEXES = [
    "CREATE INDEX IF NOT EXISTS runs_status_no ON runs (status, run_no)",
    "CREATE INDEX IF NOT EXISTS runs_flow_no ON runs (flow_name, run_no)",
    "CREATE INDEX IF NOT EXISTS runs_parent_no ON runs (parent_run_id, run_no)",
    "CREATE UNIQUE INDEX IF NOT EXISTS runs_idempotency ON runs (idempotency_key)",
    _AGENT_RUNS,
    "CREATE UNIQUE INDEX IF NOT EXISTS agent_runs_node_run ON agent_runs (agent_run_id, flow_run_id)",
    "CREATE INDEX IF NOT EXISTS agent_runs_run ON agent_runs (flow_run_id, id)",
    "CREATE INDEX IF NOT EXISTS agent_runs_status ON agent_runs (status, id)",
    "CREATE INDEX IF NOT EXISTS agent_runs_node ON agent_runs (node_id, id)",
    "CREATE INDEX IF NOT EXISTS agent_runs_parent ON agent_runs (parent_run_id, id)",
    "CREATE INDEX IF NOT EXISTS agent_messages_flow_run ON agent_messages (flow_run_id, id)",
    "CREATE INDEX IF NOT EXISTS agent_tool_calls_flow_run ON agent_tool_calls (flow_run_id, id)",
]

# The tables, column for column, in both dialects: ``{id}`` is an auto-increment primary key,
# ``{key}`` an integer primary key (the rowid itself in SQLite) and ``{body}`` the type of a stored
# event, checkpoint or blob (see each store's SCHEMA).
SCHEMA_TEMPLATE = [
    """CREATE TABLE IF NOT EXISTS flows (
        hash TEXT PRIMARY KEY, name TEXT NOT NULL, document TEXT NOT NULL, created_at BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY, flow_hash TEXT NOT NULL, flow_name TEXT NOT NULL, flow_source TEXT,
        status TEXT NOT NULL, seq BIGINT NOT NULL, input TEXT NOT NULL, error TEXT,
        parent_run_id TEXT, parent_node_run_id TEXT, forked_from TEXT, forked_at BIGINT,
        created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, lease_owner TEXT, lease_expires_at BIGINT,
        run_no BIGINT, input_tokens BIGINT NOT NULL DEFAULT 0, output_tokens BIGINT NOT NULL DEFAULT 0,
        cache_creation_input_tokens BIGINT NOT NULL DEFAULT 0, cache_read_input_tokens BIGINT NOT NULL DEFAULT 0,
        cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0, idempotency_key TEXT,
        lease_epoch BIGINT NOT NULL DEFAULT 0, pool INTEGER NOT NULL DEFAULT 0, max_runs INTEGER,
        settings TEXT)""",
    "CREATE UNIQUE INDEX IF NOT EXISTS runs_run_no ON runs (run_no)",
    "CREATE INDEX IF NOT EXISTS runs_status ON runs (status, created_at)",
    "CREATE INDEX IF NOT EXISTS runs_parent ON runs (parent_run_id)",
    # maxConcurrentRuns counts a flow's running runs; prune walks stopped runs by age; workers list their runs.
    "CREATE INDEX IF NOT EXISTS runs_flow_status ON runs (flow_name, status)",
    "CREATE INDEX IF NOT EXISTS runs_status_updated ON runs (status, updated_at)",
    "CREATE INDEX IF NOT EXISTS runs_lease_owner ON runs (lease_owner)",
    """CREATE TABLE IF NOT EXISTS workers (
        worker_id TEXT PRIMARY KEY, host TEXT NOT NULL, pid BIGINT NOT NULL, started_at BIGINT NOT NULL,
        heartbeat_at BIGINT NOT NULL, concurrency INTEGER NOT NULL, lease_ms BIGINT NOT NULL)""",
    "CREATE TABLE IF NOT EXISTS events (id {key}, ts BIGINT NOT NULL, body {body} NOT NULL)",
    """CREATE TABLE IF NOT EXISTS checkpoints (
        run_id TEXT PRIMARY KEY, seq BIGINT NOT NULL, body {body} NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS blobs (key TEXT PRIMARY KEY, body {body} NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS commands (
        id {id}, run_id TEXT NOT NULL, body TEXT NOT NULL,
        created_at BIGINT NOT NULL, taken_seq BIGINT)""",
    "CREATE INDEX IF NOT EXISTS commands_pending ON commands (run_id, taken_seq)",
    "CREATE TABLE IF NOT EXISTS run_traces (run_id TEXT PRIMARY KEY, trace_context TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS agent_messages (
        id {id}, flow_run_id TEXT NOT NULL, run_id TEXT NOT NULL,
        node_id TEXT NOT NULL, session_id TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
        step INTEGER NOT NULL, created_at BIGINT NOT NULL, model_call TEXT)""",
    "CREATE INDEX IF NOT EXISTS agent_messages_session ON agent_messages (session_id, id)",
    "CREATE INDEX IF NOT EXISTS agent_messages_run ON agent_messages (run_id, id)",
    """CREATE TABLE IF NOT EXISTS agent_tool_calls (
        id {id}, flow_run_id TEXT NOT NULL, run_id TEXT NOT NULL,
        node_id TEXT NOT NULL, session_id TEXT NOT NULL, message_id BIGINT, tool_name TEXT NOT NULL,
        tool_use_id TEXT NOT NULL, input TEXT, output TEXT, status TEXT NOT NULL, duration_ms BIGINT,
        step INTEGER NOT NULL, created_at BIGINT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS agent_tool_calls_run ON agent_tool_calls (run_id, id)",
    *_V5_INDEXES,
    "CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL, created_at BIGINT NOT NULL)",
    *SESSION_SCHEMA,
]


def schema(*, id: str, key: str, body: str) -> list[str]:
    """The tables in one dialect: ``id`` its auto-increment primary key, ``key`` its integer primary
    key, ``body`` its body type."""
    return [stmt.replace("{id}", id).replace("{key}", key).replace("{body}", body) for stmt in SCHEMA_TEMPLATE]


def migrations(*, id: str, key: str, body: str) -> dict[int, list[str]]:
    """Statements that bring a database of schema version N (the dict key) to N + 1."""
    return {
        1: [],  # version 2 only added the blobs table, which SCHEMA creates if missing
        2: [
            "ALTER TABLE runs ADD COLUMN run_no BIGINT",
            "UPDATE runs SET run_no = (SELECT COUNT(*) FROM runs r2 WHERE r2.created_at < runs.created_at "
            "OR (r2.created_at = runs.created_at AND r2.run_id <= runs.run_id))",
            f"""CREATE TABLE events_v3 (
                id {key}, run_id TEXT NOT NULL, seq BIGINT NOT NULL, type TEXT NOT NULL, node_id TEXT,
                node_run_id TEXT, ts BIGINT NOT NULL, body {body} NOT NULL)""",
            f"INSERT INTO events_v3 (id, run_id, seq, type, node_id, node_run_id, ts, body) "
            f"SELECT r.run_no * {RUN_SPAN} + e.seq, e.run_id, e.seq, e.type, e.node_id, e.node_run_id, e.ts, e.body "
            f"FROM events e JOIN runs r ON r.run_id = e.run_id",
            "DROP TABLE events",
            "ALTER TABLE events_v3 RENAME TO events",
            f"CREATE TABLE checkpoints_v3 (run_id TEXT PRIMARY KEY, seq BIGINT NOT NULL, body {body} NOT NULL)",
            "INSERT INTO checkpoints_v3 (run_id, seq, body) SELECT c.run_id, c.seq, c.body FROM checkpoints c "
            "WHERE c.seq = (SELECT MAX(c2.seq) FROM checkpoints c2 WHERE c2.run_id = c.run_id)",
            "DROP TABLE checkpoints",
            "ALTER TABLE checkpoints_v3 RENAME TO checkpoints",
        ],
        3: [
            f"CREATE TABLE events_v4 (id {key}, ts BIGINT NOT NULL, body {body} NOT NULL)",
            "INSERT INTO events_v4 (id, ts, body) SELECT id, ts, body FROM events",
            "DROP TABLE events",
            "ALTER TABLE events_v4 RENAME TO events",
        ],
        # Runs stored before version 5 have no agent:usage events: their totals are zero, as a replay
        # of their events gives; SCHEMA then creates agent_runs and the new indexes.
        4: [
            *(f"ALTER TABLE runs ADD COLUMN {col} BIGINT NOT NULL DEFAULT 0" for col in _USAGE_COLUMNS[:4]),
            "ALTER TABLE runs ADD COLUMN cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0",
            "ALTER TABLE runs ADD COLUMN idempotency_key TEXT",
        ],
        5: [
            # A database from before agent conversations were stored has no table to alter yet.
            f"""CREATE TABLE IF NOT EXISTS agent_messages (
                id {id}, flow_run_id TEXT NOT NULL, run_id TEXT NOT NULL,
                node_id TEXT NOT NULL, session_id TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
                step INTEGER NOT NULL, created_at BIGINT NOT NULL)""",
            "ALTER TABLE agent_messages ADD COLUMN model_call TEXT",
        ],
        6: [],  # version 7 only added the run_traces table, which SCHEMA creates if missing
        7: [  # the workers table and the new indexes come from the schema, created if missing
            "ALTER TABLE runs ADD COLUMN lease_epoch BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE runs ADD COLUMN pool INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE runs ADD COLUMN max_runs INTEGER",
        ],
        # Nothing wrote agent_runs before version 9: the old unique index goes, SCHEMA makes the new one.
        8: ["DROP INDEX IF EXISTS agent_runs_key"],
        9: ["ALTER TABLE runs ADD COLUMN settings TEXT"],
        10: [],  # version 11 only added the secrets table, which SCHEMA creates if missing
        11: [],  # version 12 only added the session tables, which SCHEMA creates if missing
    }


_USAGE_COLUMNS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
                  "cost_usd")
_RUN_COLUMNS = ("run_id, flow_name, flow_hash, status, seq, input, created_at, updated_at, error, parent_run_id, "
                "parent_node_run_id, forked_from, forked_at, flow_source, lease_owner, lease_expires_at, idempotency_key, "
                f"{', '.join(_USAGE_COLUMNS)}, lease_epoch, pool, max_runs, settings")
# The run row is rewritten only when the status changes; the latest seq and time come from the log.
_LAST_EVENT = (f"FROM events e WHERE e.id BETWEEN runs.run_no * {RUN_SPAN} AND runs.run_no * {RUN_SPAN} + "
               f"{RUN_SPAN - 1} ORDER BY e.id DESC LIMIT 1")
# A queued run has no events yet: its row's own seq (0) and time stand.
_RUN_SELECT = (
    f"run_id, flow_name, flow_hash, status, COALESCE((SELECT e.id - runs.run_no * {RUN_SPAN} {_LAST_EVENT}), seq), "
    f"input, created_at, COALESCE((SELECT e.ts {_LAST_EVENT}), updated_at), error, "
    "parent_run_id, parent_node_run_id, forked_from, forked_at, flow_source, lease_owner, lease_expires_at, "
    f"idempotency_key, run_no, {', '.join(_USAGE_COLUMNS)}, lease_epoch, pool, max_runs, settings")
# A pooled run holding one of its flow's maxConcurrentRuns slots; ``?`` is the time now.
_SLOT_TAKEN = ("x.pool = 1 AND (x.status = 'running' OR "
               "(x.status = 'queued' AND x.lease_owner IS NOT NULL AND x.lease_expires_at >= ?))")
_MESSAGE_COLUMNS = "id, flow_run_id, run_id, node_id, session_id, role, content, step, created_at, model_call"
_AGENT_RUN_COLUMNS = ("agent_run_id, flow_run_id, node_id, status, created_at, attempt, item, step_count, max_steps, "
                      "session_id, model, resumed_from, parent_run_id, completed_at, duration_ms, error_message, "
                      f"summary, {', '.join(_USAGE_COLUMNS)}")
_TOOL_CALL_COLUMNS = ("id, flow_run_id, run_id, node_id, session_id, message_id, tool_name, tool_use_id, input, "
                      "output, status, duration_ms, step, created_at")


def like_escape(text: str) -> str:
    """``text`` matched literally by ``LIKE … ESCAPE '\\'``: its ``%``, ``_`` and backslashes escaped."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _record(row: Sequence[Any]) -> RunRecord:
    return RunRecord(runId=row[0], flowName=row[1], flowHash=row[2], status=row[3], seq=row[4],
                     input=loads(row[5]), createdAt=row[6], updatedAt=row[7], error=row[8],
                     parentRunId=row[9], parentNodeRunId=row[10], forkedFrom=row[11], forkedAt=row[12],
                     flowSource=row[13], leaseOwner=row[14], leaseExpiresAt=row[15], idempotencyKey=row[16],
                     runNo=row[17], usage=_usage(row[18:22]), totalCostUsd=float(row[22]), leaseEpoch=int(row[23]),
                     pooled=bool(row[24]), maxRuns=row[25],
                     settings=json.loads(row[26]) if row[26] else None)


def _agent_run_values(r: AgentRun) -> tuple[Any, ...]:
    """The columns of ``_AGENT_RUN_COLUMNS`` from its third (``node_id``) on."""
    return (r.agentId, r.status, r.createdAt, r.attempt, r.item, r.stepCount, r.maxSteps, r.sessionId, r.model,
            r.resumedFrom, r.parentRunId, r.completedAt, r.durationMs, r.errorMessage, r.summary,
            *(r.usage.get(k, 0) for k in USAGE_KEYS), r.totalCostUsd)


def _agent_run(r: Sequence[Any]) -> tuple[int, AgentRun]:
    return int(r[0]), AgentRun(
        agentRunId=r[1], runId=r[2], agentId=r[3], status=r[4], createdAt=r[5], attempt=r[6], item=r[7],
        stepCount=r[8], maxSteps=r[9], sessionId=r[10], model=r[11], resumedFrom=r[12], parentRunId=r[13],
        completedAt=r[14], durationMs=r[15], errorMessage=r[16], summary=r[17],
        usage={k: int(v) for k, v in zip(USAGE_KEYS, r[18:22], strict=True)}, totalCostUsd=float(r[22]))


def _usage(values: Sequence[Any]) -> dict[str, int]:
    return {k: int(v) for k, v in zip(USAGE_KEYS, values, strict=True)} if any(values) else {}


def _message(r: Sequence[Any]) -> dict[str, Any]:
    return {"id": r[0], "flowRunId": r[1], "runId": r[2], "nodeId": r[3], "sessionId": r[4], "role": r[5],
            "content": loads(r[6]), "step": r[7], "createdAt": r[8],
            "modelCall": json.loads(r[9]) if r[9] else None}


def _tool_call(r: Sequence[Any]) -> dict[str, Any]:
    return {"id": r[0], "flowRunId": r[1], "runId": r[2], "nodeId": r[3], "sessionId": r[4], "messageId": r[5],
            "toolName": r[6], "toolUseId": r[7], "input": loads(r[8]) if r[8] else None,
            "output": loads(r[9]) if r[9] else None, "status": r[10], "durationMs": r[11],
            "step": r[12], "createdAt": r[13]}


class SqlStore(SqlArchive, SqlSessions, ABC):
    """The ``Store`` protocol over SQL; subclasses supply the dialect (see the module docstring)."""

    location: str
    #: The driver's placeholder; statements in ``_sql_*`` attributes are rewritten to it at class definition.
    param: ClassVar[str] = "?"

    # What a unique-key violation in ``create_run``/``commit`` is reported as: ``{location}``, ``{run}``
    # and ``{detail}`` (the driver's words) are filled in. None: the store's generic error.
    _RUN_EXISTS: ClassVar[str | None]
    _OUT_OF_ORDER: ClassVar[str]

    _sql_flow_exists: ClassVar[str] = "SELECT 1 FROM flows WHERE hash = ?"
    _sql_insert_flow: ClassVar[str] = ("INSERT INTO flows (hash, name, document, created_at) VALUES (?, ?, ?, ?) "
                                       "ON CONFLICT (hash) DO NOTHING")
    _sql_get_flow: ClassVar[str] = "SELECT document FROM flows WHERE hash = ?"
    _sql_get_secret: ClassVar[str] = "SELECT value FROM secrets WHERE name = ?"
    _sql_insert_secret: ClassVar[str] = ("INSERT INTO secrets (name, value, created_at) VALUES (?, ?, ?) "
                                         "ON CONFLICT (name) DO NOTHING")
    _sql_insert_run: ClassVar[str] = f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({', '.join('?' * 26)})"
    _sql_set_settings: ClassVar[str] = "UPDATE runs SET settings = ? WHERE run_id = ?"
    _sql_set_flow: ClassVar[str] = "UPDATE runs SET flow_hash = ?, flow_source = ? WHERE run_id = ?"
    _sql_set_totals: ClassVar[str] = (f"UPDATE runs SET {' = ?, '.join(_USAGE_COLUMNS)} = ? WHERE run_id = ?")
    _sql_find_idempotent: ClassVar[str] = f"SELECT {_RUN_SELECT} FROM runs WHERE idempotency_key = ?"
    _sql_get_run: ClassVar[str] = f"SELECT {_RUN_SELECT} FROM runs WHERE run_id = ?"
    # One checkpoint per run, replaced in place: compaction rewrites one row, not a row and its index.
    _sql_put_checkpoint: ClassVar[str] = ("INSERT INTO checkpoints (run_id, seq, body) VALUES (?, ?, ?) "
                                          "ON CONFLICT (run_id) DO UPDATE SET seq = excluded.seq, body = excluded.body")
    _sql_insert_blob: ClassVar[str] = "INSERT INTO blobs (key, body) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"
    _sql_next_run_no: ClassVar[str] = "SELECT COALESCE(MAX(run_no), 0) + 1 FROM runs"
    _sql_set_run_no: ClassVar[str] = "UPDATE runs SET run_no = ? WHERE run_id = ?"
    _sql_run_no: ClassVar[str] = "SELECT run_no FROM runs WHERE run_id = ?"
    _sql_update_status: ClassVar[str] = ("UPDATE runs SET status = ?, seq = ?, error = ?, updated_at = ? "
                                         "WHERE run_id = ?")
    # The same, ending the lease the commit was checked against.
    _sql_update_status_release: ClassVar[str] = (
        "UPDATE runs SET status = ?, seq = ?, error = ?, updated_at = ?, lease_owner = NULL, lease_expires_at = NULL "
        "WHERE run_id = ?")
    # Fencing: read in the commit's own transaction (PostgreSQL adds a row lock that holds until it ends).
    _sql_lease_check: ClassVar[str] = "SELECT lease_owner, lease_epoch FROM runs WHERE run_id = ?"
    _sql_read_events: ClassVar[str] = "SELECT body FROM events WHERE id > ? AND id <= ? ORDER BY id"
    _sql_read_checkpoint: ClassVar[str] = ("SELECT seq, body FROM checkpoints WHERE run_id = ? AND seq <= ? "
                                           "ORDER BY seq DESC LIMIT 1")
    _sql_insert_command: ClassVar[str] = ("INSERT INTO commands (run_id, body, created_at) VALUES (?, ?, ?) "
                                          "RETURNING id")
    _sql_pending_commands: ClassVar[str] = ("SELECT id, run_id, body, created_at FROM commands "
                                            "WHERE run_id = ? AND taken_seq IS NULL ORDER BY id")
    # Taken: its record is in the log now (a refused one with a preview only), so the body can go.
    _sql_finish_command: ClassVar[str] = "UPDATE commands SET taken_seq = ?, body = '{}' WHERE id = ?"
    _sql_lease_select: ClassVar[str] = "SELECT lease_owner, lease_expires_at, lease_epoch FROM runs WHERE run_id = ?"
    _sql_lease_take: ClassVar[str] = ("UPDATE runs SET lease_owner = ?, lease_expires_at = ?, lease_epoch = ? "
                                      "WHERE run_id = ?")
    _sql_lease_renew: ClassVar[str] = ("UPDATE runs SET lease_expires_at = ? "
                                       "WHERE run_id = ? AND lease_owner = ? AND lease_epoch = ?")
    _sql_lease_release: ClassVar[str] = ("UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL "
                                         "WHERE run_id = ? AND lease_owner = ? AND lease_epoch = ? RETURNING status, pool")
    _sql_get_trace: ClassVar[str] = "SELECT trace_context FROM run_traces WHERE run_id = ?"
    _sql_set_trace: ClassVar[str] = ("INSERT INTO run_traces (run_id, trace_context) VALUES (?, ?) "
                                     "ON CONFLICT (run_id) DO NOTHING")
    # The queue. Runs a worker may claim: queued ones, and pooled top-level running ones whose executor
    # is gone (child runs are driven by their parent's flow.call node, so they follow their parent).
    # {dead} is replaced per call by ``OR lease_owner IN (…)``, or nothing.
    _sql_claimable: ClassVar[str] = (
        "(status = 'queued' OR (status = 'running' AND pool = 1 AND parent_run_id IS NULL)) "
        "AND (lease_owner IS NULL OR lease_expires_at < ?{dead})")
    # A queued run of a flow with maxConcurrentRuns waits while that many pooled runs of the flow are
    # running (orphans included: they keep their slot until recovered) or claimed and starting.
    _sql_slots_taken: ClassVar[str] = f"SELECT COUNT(*) FROM runs x WHERE x.flow_name = ? AND {_SLOT_TAKEN}"
    # The same test inside the claim's SELECT, so that a flow at its limit cannot hold up the runs
    # queued behind it (the count is taken again under the flow's lock before a run is leased).
    _sql_has_slot: ClassVar[str] = ("(max_runs IS NULL OR status = 'running' OR "
                                    f"(SELECT COUNT(*) FROM runs x WHERE x.flow_name = runs.flow_name AND {_SLOT_TAKEN}) "
                                    "< max_runs)")
    _sql_claim_take: ClassVar[str] = ("UPDATE runs SET lease_owner = ?, lease_expires_at = ?, lease_epoch = ? "
                                      "WHERE run_id = ?")
    _sql_register_worker: ClassVar[str] = (
        "INSERT INTO workers (worker_id, host, pid, started_at, heartbeat_at, concurrency, lease_ms) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, "
        "concurrency = excluded.concurrency, lease_ms = excluded.lease_ms")
    _sql_heartbeat: ClassVar[str] = "UPDATE workers SET heartbeat_at = ? WHERE worker_id = ?"
    _sql_remove_worker: ClassVar[str] = "DELETE FROM workers WHERE worker_id = ?"
    _sql_list_workers: ClassVar[str] = ("SELECT worker_id, host, pid, started_at, heartbeat_at, concurrency, lease_ms "
                                        "FROM workers ORDER BY started_at, worker_id")
    _sql_held_runs: ClassVar[str] = ("SELECT lease_owner, run_id FROM runs WHERE lease_owner IS NOT NULL "
                                     "ORDER BY created_at")
    _sql_insert_message: ClassVar[str] = (
        "INSERT INTO agent_messages (flow_run_id, run_id, node_id, session_id, role, content, step, created_at, "
        "model_call) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id")
    _sql_insert_tool_call: ClassVar[str] = (
        "INSERT INTO agent_tool_calls (flow_run_id, run_id, node_id, session_id, message_id, tool_name, "
        "tool_use_id, input, output, status, duration_ms, step, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id")

    _sql_update_agent_run: ClassVar[str] = (
        f"UPDATE agent_runs SET {' = ?, '.join(_AGENT_RUN_COLUMNS.split(', ')[2:])} = ? "
        "WHERE agent_run_id = ? AND flow_run_id = ?")
    _sql_insert_agent_run: ClassVar[str] = (
        f"INSERT INTO agent_runs ({_AGENT_RUN_COLUMNS}) VALUES ({', '.join('?' * 22)})")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.param != "?":
            for name in dir(cls):
                if name.startswith("_sql_") and isinstance(value := getattr(cls, name), str):
                    setattr(cls, name, value.replace("?", cls.param))

    def __init__(self, location: str, *, backfill: Backfill | None = None) -> None:
        self.location = location
        self._backfill = backfill  # folds agent runs when a database from before schema 9 is migrated
        # (status, error) last written to each run's row by this store: ``commit`` skips the UPDATE when unchanged.
        self._known_status: dict[str, tuple[str, str | None]] = {}
        self._run_nos: dict[str, int] = {}  # run id -> run number (the high half of its events' keys)
        self._insert_events_cache: dict[int, str] = {}  # rows -> the INSERT for that many events

    # -- the dialect ------------------------------------------------------------------------

    @abstractmethod
    def _tx(self, conflict: str | None = None, run: str = "") -> AbstractContextManager[Any]:
        """One transaction yielding the connection; driver errors become StoreError, and a unique-key
        violation the ``conflict`` message (formatted with ``run``) when one is given."""

    @abstractmethod
    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one statement outside a transaction and fetch its rows; driver errors become StoreError."""

    @staticmethod
    @abstractmethod
    def _executemany(db: Any, sql: str, rows: list[tuple[Any, ...]]) -> None: ...

    @staticmethod
    @abstractmethod
    def _enc(body: bytes) -> Any:
        """An event, checkpoint or blob body as the ``body`` column stores it."""

    @staticmethod
    @abstractmethod
    def _dec(value: Any) -> bytes:
        """A ``body`` column's value as bytes."""

    @abstractmethod
    def _lock_run_numbers(self, db: Any) -> None:
        """Serialise run-number allocation inside ``create_run``'s transaction."""

    @abstractmethod
    def _lock_keys(self, db: Any, table: str) -> None:
        """Serialise handing out ``table``'s keys inside the inserting transaction, until it commits: a
        row with a higher key can then never be seen before one with a lower key (keyset pages)."""

    @abstractmethod
    def _bump_changes(self, db: Any) -> None:
        """Called in the transaction that enqueues a command, so that ``change_token`` moves."""

    # -- flows and runs ---------------------------------------------------------------------

    def put_flow(self, flow_hash: str, name: str, document: str) -> None:
        if self._query(self._sql_flow_exists, (flow_hash,)):
            return
        with self._tx() as db:
            db.execute(self._sql_insert_flow, (flow_hash, name, document, now_ms()))

    def secret(self, name: str) -> bytes:
        rows = self._query(self._sql_get_secret, (name,))
        if not rows:
            # Two processes at once: both insert, one row stays, and both read that one.
            with self._tx() as db:
                db.execute(self._sql_insert_secret, (name, secrets.token_hex(32), now_ms()))
            rows = self._query(self._sql_get_secret, (name,))
        return bytes.fromhex(rows[0][0])

    def get_flow(self, flow_hash: str) -> str:
        rows = self._query(self._sql_get_flow, (flow_hash,))
        if not rows:
            raise StoreError(f"{self.location}: flow {flow_hash} is missing")
        return str(rows[0][0])

    def create_run(self, record: RunRecord, events: Sequence[EventRow], checkpoint: bytes,
                   blobs: Mapping[str, bytes] | None = None, *, document: str | None = None,
                   agent_runs: Sequence[AgentRun] = ()) -> None:
        try:
            with self._tx(self._RUN_EXISTS, record.runId) as db:
                self._create_in(db, CreateRequest(record=record, events=events, checkpoint=checkpoint,
                                                  blobs=blobs, document=document, agent_runs=agent_runs))
        except StoreError:
            self._run_nos.pop(record.runId, None)
            raise

    def _create_in(self, db: Any, r: CreateRequest) -> None:
        """A new run's statements, inside the caller's transaction."""
        record, document, events, blobs, checkpoint = r.record, r.document, r.events, r.blobs, r.checkpoint
        if document is not None:
            db.execute(self._sql_insert_flow, (record.flowHash, record.flowName, document, now_ms()))
        db.execute(
            self._sql_insert_run,
            (record.runId, record.flowName, record.flowHash, record.status, record.seq,
             json.dumps(record.input), record.createdAt, record.updatedAt, record.error,
             record.parentRunId, record.parentNodeRunId, record.forkedFrom, record.forkedAt,
             record.flowSource, record.leaseOwner, record.leaseExpiresAt, record.idempotencyKey,
             *(record.usage.get(k, 0) for k in USAGE_KEYS), record.totalCostUsd, record.leaseEpoch,
             int(record.pooled), record.maxRuns,
             None if record.settings is None else json.dumps(record.settings)))
        self._lock_run_numbers(db)
        run_no = int(db.execute(self._sql_next_run_no).fetchone()[0])
        db.execute(self._sql_set_run_no, (run_no, record.runId))
        self._run_nos[record.runId] = run_no
        self._insert_events(db, record.runId, events)
        self._insert_blobs(db, blobs)
        if events:  # a queued run has neither events nor a checkpoint until a worker starts it
            db.execute(self._sql_put_checkpoint, (record.runId, record.seq, self._enc(checkpoint)))
        elif record.status == "queued":
            self._notify_queue(db)
        self._write_agent_runs(db, r.agent_runs)

    def _backfill_agent_runs(self, db: Any) -> None:
        """Called while migrating a database from before version 9, whose agent runs have no rows yet:
        fold them from the logs of the runs of flows with an agent node, once (with the ``backfill``
        this store was opened with; without one, a database that has runs is refused, unchanged)."""
        backfill = self._backfill
        if backfill is None:
            if db.execute("SELECT 1 FROM runs LIMIT 1").fetchone() is not None:
                raise StoreError(f"{self.location}: this database is from before agent runs were stored (schema "
                                 f"older than 9), and this store was opened without what folds them from its "
                                 f"runs' logs; open it once with the flowkernel command or Kernel(url), or pass "
                                 f"backfill=flowkernel.history.agent_runs.AgentRunBackfill(registry)")
            return
        p = self.param
        for flow_hash, document in db.execute("SELECT hash, document FROM flows").fetchall():
            if not backfill.wants(document):
                continue
            for (run_no,) in db.execute(f"SELECT run_no FROM runs WHERE flow_hash = {p}", (flow_hash,)).fetchall():
                if run_no is None:
                    continue
                base = int(run_no) * RUN_SPAN
                bodies = [self._dec(r[0]) for r in db.execute(self._sql_read_events, (base, base + RUN_SPAN - 1))]
                self._write_agent_runs(db, backfill(document, bodies))

    def _write_agent_runs(self, db: Any, rows: Sequence[AgentRun]) -> None:
        """Update the agent runs that are stored, insert the others (their keys in commit order)."""
        locked = False
        for r in rows:
            values = _agent_run_values(r)
            if db.execute(self._sql_update_agent_run, (*values, r.agentRunId, r.runId)).rowcount:
                continue
            if not locked:
                self._lock_keys(db, "agent_runs")
                locked = True
            db.execute(self._sql_insert_agent_run, (r.agentRunId, r.runId, *values))

    def set_run_settings(self, run_id: str, settings: dict[str, Any] | None) -> None:
        with self._tx() as db:
            if db.execute(self._sql_set_settings, (None if settings is None else json.dumps(settings),
                                                   run_id)).rowcount == 0:
                raise UnknownRunError(run_id, self.location)

    def update_run_flow(self, run_id: str, flow_hash: str, name: str, document: str, source: str | None) -> None:
        with self._tx() as db:
            db.execute(self._sql_insert_flow, (flow_hash, name, document, now_ms()))
            if db.execute(self._sql_set_flow, (flow_hash, source, run_id)).rowcount == 0:
                raise UnknownRunError(run_id, self.location)


    def _insert_blobs(self, db: Any, blobs: Mapping[str, bytes] | None) -> None:
        # Content-addressed: a blob that exists already is the same bytes; writing it again changes nothing.
        if blobs:
            enc = self._enc
            self._executemany(db, self._sql_insert_blob, [(k, enc(v)) for k, v in blobs.items()])

    def read_blobs(self, keys: Iterable[str]) -> dict[str, bytes]:
        wanted = list(keys)
        found: dict[str, bytes] = {}
        dec = self._dec
        for i in range(0, len(wanted), 500):
            part = wanted[i:i + 500]
            marks = ", ".join([self.param] * len(part))
            for key, body in self._query(f"SELECT key, body FROM blobs WHERE key IN ({marks})", part):
                found[key] = dec(body)
        return found

    def _run_no(self, run_id: str) -> int:
        run_no = self._run_nos.get(run_id)
        if run_no is None:
            rows = self._query(self._sql_run_no, (run_id,))
            if not rows:
                raise UnknownRunError(run_id, self.location)
            run_no = self._run_nos[run_id] = int(rows[0][0])
        return run_no

    def _insert_events(self, db: Any, run_id: str, events: Sequence[EventRow]) -> None:
        # One statement for the events of a commit (a few, usually): cheaper than executemany's row loop.
        enc = self._enc
        base = self._run_no(run_id) * RUN_SPAN
        for start in range(0, len(events), _EVENTS_PER_INSERT):
            chunk = events[start:start + _EVENTS_PER_INSERT]
            params: list[Any] = []
            for seq, ts, body in chunk:
                params += (base + seq, ts, enc(body))
            db.execute(self._insert_events_sql(len(chunk)), params)

    def _insert_events_sql(self, rows: int) -> str:
        sql = self._insert_events_cache.get(rows)
        if sql is None:
            p = self.param
            sql = self._insert_events_cache[rows] = (
                "INSERT INTO events (id, ts, body) VALUES " + ", ".join([f"({p}, {p}, {p})"] * rows))
        return sql

    def get_run(self, run_id: str) -> RunRecord:
        rows = self._query(self._sql_get_run, (run_id,))
        if not rows:
            raise UnknownRunError(run_id, self.location)
        return _record(rows[0])

    def list_runs(self, status: str | None = None, parent: str | None = None, limit: int = 1000) -> list[RunRecord]:
        p = self.param
        sql = f"SELECT {_RUN_SELECT} FROM runs WHERE 1 = 1"
        params: list[Any] = []
        if status is not None:
            sql += f" AND status = {p}"
            params.append(status)
        if parent is not None:
            sql += f" AND parent_run_id = {p}"
            params.append(parent)
        sql += f" ORDER BY created_at DESC, run_id DESC LIMIT {p}"
        params.append(limit)
        return [_record(r) for r in self._query(sql, params)]

    def _run_filters(self, status: str | None, flow: str | None, parent: str | None, id_prefix: str | None,
                     error: str | None) -> tuple[str, list[Any]]:
        p = self.param
        sql = ""
        params: list[Any] = []
        for cond, val in (("status =", status), ("flow_name =", flow), ("parent_run_id =", parent)):
            if val is not None:
                sql += f" AND {cond} {p}"
                params.append(val)
        if id_prefix is not None:
            sql += f" AND run_id LIKE {p} ESCAPE '\\'"
            params.append(like_escape(id_prefix) + "%")
        if error is not None:  # both sides lowered by the database: one notion of case per store
            sql += f" AND LOWER(error) LIKE LOWER({p}) ESCAPE '\\'"
            params.append("%" + like_escape(error) + "%")
        return sql, params

    def page_runs(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                  before: int | None = None, limit: int = 50, after: int | None = None, oldest: bool = False,
                  id_prefix: str | None = None, error: str | None = None) -> list[RunRecord]:
        p = self.param
        where, params = self._run_filters(status, flow, parent, id_prefix, error)
        sql = f"SELECT {_RUN_SELECT} FROM runs WHERE run_no IS NOT NULL{where}"
        for cond, val in (("run_no <", before), ("run_no >", after)):
            if val is not None:
                sql += f" AND {cond} {p}"
                params.append(val)
        sql += f" ORDER BY run_no {'ASC' if oldest else 'DESC'} LIMIT {p}"
        params.append(limit)
        return [_record(r) for r in self._query(sql, params)]

    def count_runs(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                   before: int | None = None) -> int:
        p = self.param
        where, params = self._run_filters(status, flow, parent, None, None)
        sql = f"SELECT COUNT(*) FROM runs WHERE run_no IS NOT NULL{where}"
        if before is not None:
            sql += f" AND run_no < {p}"
            params.append(before)
        return int(self._query(sql, params)[0][0])

    def find_idempotent(self, key: str) -> RunRecord | None:
        rows = self._query(self._sql_find_idempotent, (key,))
        return _record(rows[0]) if rows else None

    def descendant_totals(self, run_ids: Sequence[str]) -> dict[str, RunTotals]:
        if not run_ids:
            return {}
        marks = ", ".join([self.param] * len(run_ids))
        sums = ", ".join(f"SUM(r.{c})" for c in _USAGE_COLUMNS)
        # Every descendant of each root, walked down parent_run_id (indexed), then summed per root.
        sql = (f"WITH RECURSIVE tree (root, run_id) AS ("
               f"SELECT c.parent_run_id, c.run_id FROM runs c WHERE c.parent_run_id IN ({marks}) "
               f"UNION ALL SELECT t.root, c.run_id FROM runs c JOIN tree t ON c.parent_run_id = t.run_id) "
               f"SELECT t.root, {sums} FROM tree t JOIN runs r ON r.run_id = t.run_id GROUP BY t.root")
        out: dict[str, RunTotals] = {}
        for row in self._query(sql, list(run_ids)):
            out[row[0]] = RunTotals(usage={k: int(v or 0) for k, v in zip(USAGE_KEYS, row[1:5], strict=True)},
                                    totalCostUsd=float(row[5] or 0.0))
        return out

    # -- the log ----------------------------------------------------------------------------

    def commit(self, run_id: str, events: Sequence[EventRow], status: str, seq: int, error: str | None,
               checkpoint: bytes | None, blobs: Mapping[str, bytes] | None = None, *, lease: Lease | None = None,
               release: bool = False, taken: Sequence[tuple[int, int]] = (),
               totals: RunTotals | None = None, agent_runs: Sequence[AgentRun] = ()) -> None:
        request = CommitRequest(runId=run_id, events=events, status=status, seq=seq, error=error,
                                checkpoint=checkpoint, blobs=blobs, lease=lease, release=release, taken=taken,
                                totals=totals, agent_runs=agent_runs)
        try:
            with self._tx(self._OUT_OF_ORDER, run_id) as db:
                self._write(db, request)
            self._known_status[run_id] = (status, error)
        except (StoreError, LeaseLostError):
            self._known_status.pop(run_id, None)
            raise

    def commit_group(self, requests: Sequence[CommitRequest | CreateRequest]) -> list[Exception | None]:
        results: list[Exception | None] = [None] * len(requests)
        try:
            with self._tx() as db:
                for i, r in enumerate(requests):
                    try:
                        if isinstance(r, CreateRequest):
                            with self._savepoint(db, self._RUN_EXISTS, r.record.runId):
                                self._create_in(db, r)
                        else:
                            with self._savepoint(db, self._OUT_OF_ORDER, r.runId):
                                self._write(db, r)
                    except Exception as exc:  # this run's alone: the others' rows stay in the transaction
                        results[i] = exc
        except StoreError as exc:
            results = [exc] * len(requests)
        for r, failed in zip(requests, results, strict=True):
            if isinstance(r, CreateRequest):
                if failed is not None:
                    self._run_nos.pop(r.record.runId, None)
            elif failed is None:
                self._known_status[r.runId] = (r.status, r.error)
            else:
                self._known_status.pop(r.runId, None)
        return results

    def _write(self, db: Any, r: CommitRequest) -> None:
        """A commit's statements, inside the caller's transaction: its lease is checked in it, so a
        commit made in a group is fenced exactly as one made on its own."""
        run_id, lease = r.runId, r.lease
        if lease is not None:
            self._check_lease(db, run_id, lease)
        self._insert_events(db, run_id, r.events)
        if r.agent_runs:
            self._write_agent_runs(db, r.agent_runs)
        if r.totals is not None:
            db.execute(self._sql_set_totals, (*(r.totals.usage.get(k, 0) for k in USAGE_KEYS),
                                              r.totals.totalCostUsd, run_id))
        if r.release and lease is not None:
            db.execute(self._sql_update_status_release, (r.status, r.seq, r.error, now_ms(), run_id))
            if r.status == "running":
                self._notify_queue(db)  # left running for the pool: wake a worker
        elif self._known_status.get(run_id) != (r.status, r.error):
            db.execute(self._sql_update_status, (r.status, r.seq, r.error, now_ms(), run_id))
        self._insert_blobs(db, r.blobs)
        if r.checkpoint is not None:
            db.execute(self._sql_put_checkpoint, (run_id, r.seq, self._enc(r.checkpoint)))
        for command_id, received in r.taken:
            db.execute(self._sql_finish_command, (received, command_id))

    @abstractmethod
    def _savepoint(self, db: Any, conflict: str | None, run: str) -> AbstractContextManager[None]:
        """A savepoint inside ``db``'s transaction: rolled back to when the block raises, which then
        raises StoreError (``conflict``, formatted with ``run``, for a unique-key violation)."""

    def read_events(self, run_id: str, after: int = 0, until: int | None = None) -> list[bytes]:
        base = self._run_no(run_id) * RUN_SPAN
        last = RUN_SPAN - 1 if until is None else min(until, RUN_SPAN - 1)
        rows = self._query(self._sql_read_events, (base + after, base + last))
        dec = self._dec
        return resolve_bodies([dec(r[0]) for r in rows], self.read_blobs)

    def last_seqs(self, run_ids: Sequence[str]) -> dict[str, int]:
        if not run_ids:
            return {}
        marks = ", ".join([self.param] * len(run_ids))
        rows = self._query(f"SELECT run_id, (SELECT e.id - runs.run_no * {RUN_SPAN} {_LAST_EVENT}) FROM runs "
                           f"WHERE run_id IN ({marks})", list(run_ids))
        return {r[0]: int(r[1] or 0) for r in rows}

    def read_checkpoint(self, run_id: str, at_most: int | None = None) -> tuple[int, bytes] | None:
        rows = self._query(self._sql_read_checkpoint, (run_id, at_most if at_most is not None else 2**62))
        return (int(rows[0][0]), self._dec(rows[0][1])) if rows else None

    # -- commands ---------------------------------------------------------------------------

    def enqueue_command(self, run_id: str, body: dict[str, Any]) -> int:
        with self._tx() as db:
            row = db.execute(self._sql_insert_command, (run_id, json.dumps(body), now_ms())).fetchone()
            self._bump_changes(db)
            return int(row[0]) if row else 0

    def pending_commands(self, run_id: str) -> list[CommandRow]:
        rows = self._query(self._sql_pending_commands, (run_id,))
        return [CommandRow(id=r[0], runId=r[1], body=json.loads(r[2]), createdAt=r[3]) for r in rows]

    def finish_command(self, command_id: int, seq: int) -> None:
        with self._tx() as db:
            db.execute(self._sql_finish_command, (seq, command_id))

    @abstractmethod
    def change_token(self) -> int: ...

    # -- leases -----------------------------------------------------------------------------

    def acquire_lease(self, run_id: str, owner: str, now_ms: int, ttl_ms: int,
                      steal_from: str | None = None) -> Lease:
        with self._tx() as db:
            row = db.execute(self._sql_lease_select, (run_id,)).fetchone()
            if row is None:
                raise UnknownRunError(run_id, self.location)
            holder, expires, epoch = row
            if holder is not None and holder not in (owner, steal_from) and (expires or 0) > now_ms:
                return Lease(str(holder), int(epoch))
            db.execute(self._sql_lease_take, (owner, now_ms + ttl_ms, int(epoch) + 1, run_id))
            return Lease(owner, int(epoch) + 1)

    def renew_lease(self, run_id: str, lease: Lease, now_ms: int, ttl_ms: int) -> bool:
        with self._tx() as db:
            return bool(db.execute(self._sql_lease_renew, (now_ms + ttl_ms, run_id, lease.owner, lease.epoch)).rowcount)

    def release_lease(self, run_id: str, lease: Lease) -> None:
        with self._tx() as db:
            row = db.execute(self._sql_lease_release, (run_id, lease.owner, lease.epoch)).fetchone()
            if row is not None and row[0] == "running" and row[1]:
                self._notify_queue(db)  # handed over mid-run: another worker continues it at once

    # -- the queue and the workers ----------------------------------------------------------

    def _notify_queue(self, db: Any) -> None:
        """In a transaction that makes a run claimable: wake the workers when it commits (if the
        store can; workers poll otherwise)."""

    def claim_runs(self, owner: str, now_ms: int, ttl_ms: int, limit: int,
                   dead: Sequence[str] = ()) -> list[Claim]:
        if limit <= 0:
            return []
        p = self.param
        where = self._sql_claimable.replace("{dead}", f" OR lease_owner IN ({', '.join([p] * len(dead))})" if dead else "")
        where += f" AND {self._sql_has_slot}"
        params: list[Any] = [now_ms, *dead, now_ms]
        if not self._query(f"SELECT 1 FROM runs WHERE {where} LIMIT 1", params):
            return []  # nothing to claim: no write transaction taken
        select = f"SELECT run_id, status, lease_epoch, flow_name, max_runs FROM runs WHERE {where} " \
                 f"ORDER BY created_at, run_no LIMIT {p}{self._claim_lock}"
        claims: list[Claim] = []
        with self._tx() as db:
            for run_id, status, epoch, flow_name, max_runs in db.execute(select, [*params, limit]).fetchall():
                if status == "queued" and max_runs is not None:
                    self._lock_flow(db, flow_name)
                    if int(db.execute(self._sql_slots_taken, (flow_name, now_ms)).fetchone()[0]) >= max_runs:
                        continue
                lease = Lease(owner, int(epoch) + 1)
                db.execute(self._sql_claim_take, (owner, now_ms + ttl_ms, lease.epoch, run_id))
                claims.append(Claim(runId=run_id, status=status, lease=lease))
        return claims

    #: Appended to the claim's SELECT: PostgreSQL locks the rows it claims and skips rows another
    #: worker is claiming; SQLite's write transaction is the only writer already.
    _claim_lock: ClassVar[str] = ""

    def _lock_flow(self, db: Any, flow_name: str) -> None:
        """Serialise the claims of one flow's runs (maxConcurrentRuns) until the transaction ends."""

    def register_worker(self, worker: WorkerRecord) -> None:
        with self._tx() as db:
            db.execute(self._sql_register_worker, (worker.workerId, worker.host, worker.pid, worker.startedAt,
                                                   worker.heartbeatAt, worker.concurrency, worker.leaseMs))

    def heartbeat(self, worker_id: str, now_ms: int) -> None:
        with self._tx() as db:
            db.execute(self._sql_heartbeat, (now_ms, worker_id))

    def remove_worker(self, worker_id: str) -> None:
        with self._tx() as db:
            db.execute(self._sql_remove_worker, (worker_id,))

    def list_workers(self) -> list[WorkerRecord]:
        held: dict[str, list[str]] = {}
        for owner, run_id in self._query(self._sql_held_runs):
            held.setdefault(owner, []).append(run_id)
        return [WorkerRecord(workerId=r[0], host=r[1], pid=int(r[2]), startedAt=int(r[3]), heartbeatAt=int(r[4]),
                             concurrency=int(r[5]), leaseMs=int(r[6]), runs=held.get(r[0], []))
                for r in self._query(self._sql_list_workers)]

    def listen(self) -> Listener | None:
        return None

    # -- telemetry --------------------------------------------------------------------------

    def get_trace_context(self, run_id: str) -> str | None:
        rows = self._query(self._sql_get_trace, (run_id,))
        return str(rows[0][0]) if rows else None

    def set_trace_context(self, run_id: str, trace_context: str) -> None:
        with self._tx() as db:
            db.execute(self._sql_set_trace, (run_id, trace_context))

    # -- agent runs -------------------------------------------------------------------------

    def list_agent_runs(self, *, run_id: str | None = None, agent_run_id: str | None = None,
                        status: str | None = None, agent_id: str | None = None, parent_run_id: str | None = None,
                        open_only: bool = False, before: int | None = None,
                        limit: int = 50) -> list[tuple[int, AgentRun]]:
        p = self.param
        sql = f"SELECT id, {_AGENT_RUN_COLUMNS} FROM agent_runs WHERE 1 = 1"
        params: list[Any] = []
        for cond, val in (("flow_run_id =", run_id), ("agent_run_id =", agent_run_id), ("status =", status),
                          ("node_id =", agent_id), ("parent_run_id =", parent_run_id), ("id <", before)):
            if val is not None:
                sql += f" AND {cond} {p}"
                params.append(val)
        if open_only:
            sql += " AND status IN ('running', 'waiting')"
        sql += f" ORDER BY id DESC LIMIT {p}"
        params.append(limit)
        return [_agent_run(r) for r in self._query(sql, params)]

    # -- agent conversations ----------------------------------------------------------------

    def _check_lease(self, db: Any, run_id: str, lease: Lease) -> None:
        """Fencing, inside the caller's transaction: ``lease`` must still hold ``run_id``."""
        row = db.execute(self._sql_lease_check, (run_id,)).fetchone()
        if row is None:
            raise UnknownRunError(run_id, self.location)
        if row[0] != lease.owner or row[1] != lease.epoch:
            raise LeaseLostError(run_id, row[0])

    def add_agent_message(self, row: dict[str, Any], *, lease: Lease | None = None) -> int:
        with self._tx() as db:
            if lease is not None:
                self._check_lease(db, row["flowRunId"], lease)
            self._lock_keys(db, "agent_messages")
            got = db.execute(
                self._sql_insert_message,
                (row["flowRunId"], row["runId"], row["nodeId"], row["sessionId"], row["role"],
                 json.dumps(row["content"]), row["step"], row.get("createdAt") or now_ms(),
                 json.dumps(row["modelCall"]) if row.get("modelCall") is not None else None)).fetchone()
            return int(got[0]) if got else 0

    def list_agent_messages(self, *, run_id: str | None = None, session_id: str | None = None,
                            flow_run_id: str | None = None, after: int = 0, limit: int = 100,
                            node_id: str | None = None) -> list[dict[str, Any]]:
        sql, params = self._filtered(f"SELECT {_MESSAGE_COLUMNS} FROM agent_messages", after, limit,
                                     (("run_id", run_id), ("session_id", session_id), ("flow_run_id", flow_run_id),
                                      ("node_id", node_id)))
        return [_message(r) for r in self._query(sql, params)]

    def add_tool_call(self, row: dict[str, Any], *, lease: Lease | None = None) -> int:
        with self._tx() as db:
            if lease is not None:
                self._check_lease(db, row["flowRunId"], lease)
            self._lock_keys(db, "agent_tool_calls")
            got = db.execute(
                self._sql_insert_tool_call,
                (row["flowRunId"], row["runId"], row["nodeId"], row["sessionId"], row.get("messageId"),
                 row["toolName"], row["toolUseId"], json.dumps(row.get("input")), json.dumps(row.get("output")),
                 row["status"], row.get("durationMs"), row["step"], row.get("createdAt") or now_ms())).fetchone()
            return int(got[0]) if got else 0

    def list_tool_calls(self, *, run_id: str | None = None, session_id: str | None = None,
                        flow_run_id: str | None = None, tool_name: str | None = None, status: str | None = None,
                        after: int = 0, limit: int = 100, node_id: str | None = None) -> list[dict[str, Any]]:
        sql, params = self._filtered(f"SELECT {_TOOL_CALL_COLUMNS} FROM agent_tool_calls", after, limit,
                                     (("run_id", run_id), ("session_id", session_id), ("flow_run_id", flow_run_id),
                                      ("tool_name", tool_name), ("status", status), ("node_id", node_id)))
        return [_tool_call(r) for r in self._query(sql, params)]

    def _filtered(self, select: str, after: int, limit: int,
                  filters: Iterable[tuple[str, str | None]]) -> tuple[str, list[Any]]:
        """``select`` for rows after id ``after`` matching the non-None ``filters``, by id, at most ``limit``."""
        p = self.param
        sql = f"{select} WHERE id > {p}"
        params: list[Any] = [after]
        for col, val in filters:
            if val is not None:
                sql += f" AND {col} = {p}"
                params.append(val)
        sql += f" ORDER BY id LIMIT {p}"
        params.append(limit)
        return sql, params
