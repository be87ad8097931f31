"""Mixed into ``SqlStore``: what agent runs leave beside the log (agent runs, messages, tool calls) and
a run's trace context."""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from flowkernel.errors import LeaseLostError, UnknownRunError
from flowkernel.ids import now_ms
from flowkernel.store.base import AgentRun, Lease
from flowkernel.store.sql.rows import (
    AGENT_RUN_COLUMNS,
    MESSAGE_COLUMNS,
    TOOL_CALL_COLUMNS,
    agent_run_of,
    message_of,
    tool_call_of,
)


class SqlAgentRows:
    """The ``AgentRows`` and ``Traces`` methods of the SQL stores (statements as in ``SqlStore``)."""

    location: str
    param: ClassVar[str]

    # Fencing: read in the commit's own transaction (PostgreSQL adds a row lock that holds until it ends).
    _sql_lease_check: ClassVar[str] = "SELECT lease_owner, lease_epoch FROM runs WHERE run_id = ?"
    _sql_get_trace: ClassVar[str] = "SELECT trace_context FROM run_traces WHERE run_id = ?"
    _sql_set_trace: ClassVar[str] = ("INSERT INTO run_traces (run_id, trace_context) VALUES (?, ?) "
                                     "ON CONFLICT (run_id) DO NOTHING")
    _sql_insert_message: ClassVar[str] = (
        "INSERT INTO agent_messages (flow_run_id, run_id, node_id, session_id, role, content, step, created_at, "
        "model_call) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id")
    _sql_insert_tool_call: ClassVar[str] = (
        "INSERT INTO agent_tool_calls (flow_run_id, run_id, node_id, session_id, message_id, tool_name, "
        "tool_use_id, input, output, status, duration_ms, step, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id")

    @abstractmethod
    def _tx(self, conflict: str | None = None, run: str = "") -> AbstractContextManager[Any]: ...

    @abstractmethod
    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    @abstractmethod
    def _lock_keys(self, db: Any, table: str) -> None: ...

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
        sql = f"SELECT id, {AGENT_RUN_COLUMNS} FROM agent_runs WHERE 1 = 1"
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
        return [agent_run_of(r) for r in self._query(sql, params)]

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
        sql, params = self._filtered(f"SELECT {MESSAGE_COLUMNS} FROM agent_messages", after, limit,
                                     (("run_id", run_id), ("session_id", session_id), ("flow_run_id", flow_run_id),
                                      ("node_id", node_id)))
        return [message_of(r) for r in self._query(sql, params)]

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
        sql, params = self._filtered(f"SELECT {TOOL_CALL_COLUMNS} FROM agent_tool_calls", after, limit,
                                     (("run_id", run_id), ("session_id", session_id), ("flow_run_id", flow_run_id),
                                      ("tool_name", tool_name), ("status", status), ("node_id", node_id)))
        return [tool_call_of(r) for r in self._query(sql, params)]

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
