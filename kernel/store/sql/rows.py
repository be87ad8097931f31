"""The columns the SQL stores read and write, and the mappers between their rows and records
(``RunRecord``, ``AgentRun``, agent messages and tool calls)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from flowkernel.core.events import USAGE_KEYS
from flowkernel.core.nesting import loads
from flowkernel.store.base import AgentRun, RunRecord
from flowkernel.store.sql.archive import RUN_SPAN

USAGE_COLUMNS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
                  "cost_usd")
RUN_COLUMNS = ("run_id, flow_name, flow_hash, status, seq, input, created_at, updated_at, error, parent_run_id, "
                "parent_node_run_id, forked_from, forked_at, flow_source, lease_owner, lease_expires_at, idempotency_key, "
                f"{', '.join(USAGE_COLUMNS)}, lease_epoch, pool, max_runs, settings")
# The run row is rewritten only when the status changes; the latest seq and time come from the log.
LAST_EVENT = (f"FROM events e WHERE e.id BETWEEN runs.run_no * {RUN_SPAN} AND runs.run_no * {RUN_SPAN} + "
               f"{RUN_SPAN - 1} ORDER BY e.id DESC LIMIT 1")
# A queued run has no events yet: its row's own seq (0) and time stand.
RUN_SELECT = (
    f"run_id, flow_name, flow_hash, status, COALESCE((SELECT e.id - runs.run_no * {RUN_SPAN} {LAST_EVENT}), seq), "
    f"input, created_at, COALESCE((SELECT e.ts {LAST_EVENT}), updated_at), error, "
    "parent_run_id, parent_node_run_id, forked_from, forked_at, flow_source, lease_owner, lease_expires_at, "
    f"idempotency_key, run_no, {', '.join(USAGE_COLUMNS)}, lease_epoch, pool, max_runs, settings")
# A pooled run holding one of its flow's maxConcurrentRuns slots; ``?`` is the time now.
SLOT_TAKEN = ("x.pool = 1 AND (x.status = 'running' OR "
               "(x.status = 'queued' AND x.lease_owner IS NOT NULL AND x.lease_expires_at >= ?))")
MESSAGE_COLUMNS = "id, flow_run_id, run_id, node_id, session_id, role, content, step, created_at, model_call"
AGENT_RUN_COLUMNS = ("agent_run_id, flow_run_id, node_id, status, created_at, attempt, item, step_count, max_steps, "
                      "session_id, model, resumed_from, parent_run_id, completed_at, duration_ms, error_message, "
                      f"summary, {', '.join(USAGE_COLUMNS)}")
TOOL_CALL_COLUMNS = ("id, flow_run_id, run_id, node_id, session_id, message_id, tool_name, tool_use_id, input, "
                      "output, status, duration_ms, step, created_at")


def like_escape(text: str) -> str:
    """``text`` matched literally by ``LIKE … ESCAPE '\\'``: its ``%``, ``_`` and backslashes escaped."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def record_of(row: Sequence[Any]) -> RunRecord:
    return RunRecord(runId=row[0], flowName=row[1], flowHash=row[2], status=row[3], seq=row[4],
                     input=loads(row[5]), createdAt=row[6], updatedAt=row[7], error=row[8],
                     parentRunId=row[9], parentNodeRunId=row[10], forkedFrom=row[11], forkedAt=row[12],
                     flowSource=row[13], leaseOwner=row[14], leaseExpiresAt=row[15], idempotencyKey=row[16],
                     runNo=row[17], usage=usage_of(row[18:22]), totalCostUsd=float(row[22]), leaseEpoch=int(row[23]),
                     pooled=bool(row[24]), maxRuns=row[25],
                     settings=json.loads(row[26]) if row[26] else None)


def agent_run_values(r: AgentRun) -> tuple[Any, ...]:
    """The columns of ``AGENT_RUN_COLUMNS`` from its third (``node_id``) on."""
    return (r.agentId, r.status, r.createdAt, r.attempt, r.item, r.stepCount, r.maxSteps, r.sessionId, r.model,
            r.resumedFrom, r.parentRunId, r.completedAt, r.durationMs, r.errorMessage, r.summary,
            *(r.usage.get(k, 0) for k in USAGE_KEYS), r.totalCostUsd)


def agent_run_of(r: Sequence[Any]) -> tuple[int, AgentRun]:
    return int(r[0]), AgentRun(
        agentRunId=r[1], runId=r[2], agentId=r[3], status=r[4], createdAt=r[5], attempt=r[6], item=r[7],
        stepCount=r[8], maxSteps=r[9], sessionId=r[10], model=r[11], resumedFrom=r[12], parentRunId=r[13],
        completedAt=r[14], durationMs=r[15], errorMessage=r[16], summary=r[17],
        usage={k: int(v) for k, v in zip(USAGE_KEYS, r[18:22], strict=True)}, totalCostUsd=float(r[22]))


def usage_of(values: Sequence[Any]) -> dict[str, int]:
    return {k: int(v) for k, v in zip(USAGE_KEYS, values, strict=True)} if any(values) else {}


def message_of(r: Sequence[Any]) -> dict[str, Any]:
    return {"id": r[0], "flowRunId": r[1], "runId": r[2], "nodeId": r[3], "sessionId": r[4], "role": r[5],
            "content": loads(r[6]), "step": r[7], "createdAt": r[8],
            "modelCall": json.loads(r[9]) if r[9] else None}


def tool_call_of(r: Sequence[Any]) -> dict[str, Any]:
    return {"id": r[0], "flowRunId": r[1], "runId": r[2], "nodeId": r[3], "sessionId": r[4], "messageId": r[5],
            "toolName": r[6], "toolUseId": r[7], "input": loads(r[8]) if r[8] else None,
            "output": loads(r[9]) if r[9] else None, "status": r[10], "durationMs": r[11],
            "step": r[12], "createdAt": r[13]}
