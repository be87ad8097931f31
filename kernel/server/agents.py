"""Agent history (DESIGN §7, §10): the stored messages and tool calls of runs and of agent runs.

An agent run is one node run of a ``claude.agent`` node: its id is the node run id (``nr_…``), the
``runId`` of its stored messages and tool calls.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from flowkernel.history import Page
from flowkernel.server.pagination import DEFAULT_LIMIT, MAX_LIMIT, decode_cursor, encode_cursor
from flowkernel.server.problems import ApiProblem
from flowkernel.server.runs import json_response, kernel_of
from flowkernel.server.views import Message, ToolCall
from flowkernel.server.views import Page as PageView

router = APIRouter(tags=["agents"])

Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT)]
ToolStatus = Annotated[str | None, Query(pattern="^(completed|error)$", description="completed | error")]


def message_view(row: dict[str, Any]) -> dict[str, Any]:
    return {"messageId": row["id"], "agentRunId": row["runId"], "runId": row["flowRunId"], "agentId": row["nodeId"],
            "sessionId": row["sessionId"], "role": row["role"], "content": row["content"], "step": row["step"],
            "createdAt": row["createdAt"]}


def tool_call_view(row: dict[str, Any]) -> dict[str, Any]:
    return {"toolCallId": row["id"], "toolUseId": row["toolUseId"], "messageId": row["messageId"],
            "agentRunId": row["runId"], "runId": row["flowRunId"], "agentId": row["nodeId"],
            "toolName": row["toolName"], "input": row["input"], "output": row["output"], "status": row["status"],
            "durationMs": row["durationMs"], "step": row["step"], "createdAt": row["createdAt"]}


def _page(page: Page, kind: str, view: Any) -> Response:
    return json_response({"items": [view(r) for r in page["items"]],
                          "nextCursor": encode_cursor(kind, page["nextCursor"])})


def _known_agent_run(request: Request, agent_run_id: str) -> None:
    """404 unless some agent message was stored for ``agent_run_id``."""
    if not kernel_of(request).store.list_agent_messages(run_id=agent_run_id, limit=1):
        raise ApiProblem(404, f"no agent run {agent_run_id!r}: no agent conversation is stored under that node run id",
                         kind="unknown-agent-run")


# -- a run's agents ---------------------------------------------------------------------------

@router.get("/runs/{runId}/messages", response_model=PageView[Message], summary="The stored agent messages of a run")
def run_messages(request: Request, runId: str, nodeId: str | None = None, agentRunId: str | None = None,
                 limit: Limit = DEFAULT_LIMIT, cursor: str | None = None) -> Response:
    kernel = kernel_of(request)
    kernel.store.get_run(runId)
    page = kernel.messages(flow_run_id=runId, run_id=agentRunId, node_id=nodeId,
                           after=decode_cursor("messages", cursor) or 0, limit=limit)
    return _page(page, "messages", message_view)


@router.get("/runs/{runId}/tool-calls", response_model=PageView[ToolCall], summary="The stored tool calls of a run")
def run_tool_calls(request: Request, runId: str, nodeId: str | None = None, agentRunId: str | None = None,
                   toolName: str | None = None, status: ToolStatus = None, limit: Limit = DEFAULT_LIMIT,
                   cursor: str | None = None) -> Response:
    kernel = kernel_of(request)
    kernel.store.get_run(runId)
    page = kernel.tool_calls(flow_run_id=runId, run_id=agentRunId, node_id=nodeId, tool_name=toolName, status=status,
                             after=decode_cursor("tool-calls", cursor) or 0, limit=limit)
    return _page(page, "tool-calls", tool_call_view)


# -- one agent run ----------------------------------------------------------------------------

@router.get("/agent-runs/{agentRunId}/messages", response_model=PageView[Message],
            summary="An agent run's messages, ordered by step")
def agent_messages(request: Request, agentRunId: str, limit: Limit = DEFAULT_LIMIT,
                   cursor: str | None = None) -> Response:
    _known_agent_run(request, agentRunId)
    page = kernel_of(request).messages(run_id=agentRunId, after=decode_cursor("messages", cursor) or 0, limit=limit)
    return _page(page, "messages", message_view)


@router.get("/agent-runs/{agentRunId}/messages/{messageId}", response_model=Message, summary="One stored message")
def agent_message(request: Request, agentRunId: str, messageId: int) -> Response:
    rows = kernel_of(request).store.list_agent_messages(run_id=agentRunId, after=messageId - 1, limit=1)
    if not rows or rows[0]["id"] != messageId:
        raise ApiProblem(404, f"no message {messageId} in agent run {agentRunId!r}", kind="unknown-message")
    return json_response(message_view(rows[0]))


@router.get("/agent-runs/{agentRunId}/tool-calls", response_model=PageView[ToolCall],
            summary="An agent run's tool calls")
def agent_tool_calls(request: Request, agentRunId: str, toolName: str | None = None, status: ToolStatus = None,
                     limit: Limit = DEFAULT_LIMIT, cursor: str | None = None) -> Response:
    _known_agent_run(request, agentRunId)
    page = kernel_of(request).tool_calls(run_id=agentRunId, tool_name=toolName, status=status,
                                         after=decode_cursor("tool-calls", cursor) or 0, limit=limit)
    return _page(page, "tool-calls", tool_call_view)


@router.get("/agent-runs/{agentRunId}/tool-calls/{toolCallId}", response_model=ToolCall, summary="One tool call")
def agent_tool_call(request: Request, agentRunId: str, toolCallId: int) -> Response:
    rows = kernel_of(request).store.list_tool_calls(run_id=agentRunId, after=toolCallId - 1, limit=1)
    if not rows or rows[0]["id"] != toolCallId:
        raise ApiProblem(404, f"no tool call {toolCallId} in agent run {agentRunId!r}", kind="unknown-tool-call")
    return json_response(tool_call_view(rows[0]))
