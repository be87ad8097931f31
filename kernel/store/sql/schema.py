"""The SQL stores' schema: its version, the tables and indexes both dialects create (``{id}``, ``{key}``
and ``{body}`` stand for each dialect's column types), and the statements that migrate each older
version to the next."""

from __future__ import annotations

from flowkernel.store.sql.archive import RUN_SPAN
from flowkernel.store.sql.rows import USAGE_COLUMNS
from flowkernel.store.sql.sessions import SESSION_SCHEMA

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
            *(f"ALTER TABLE runs ADD COLUMN {col} BIGINT NOT NULL DEFAULT 0" for col in USAGE_COLUMNS[:4]),
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
