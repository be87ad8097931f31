"""Agent runs and their history (DESIGN §7, §10): agent runs, and the stored messages and tool calls
of runs and of agent runs.

An agent run is one node run of a ``claude.agent`` node: its id is the node run id (``nr_…``), the
``runId`` of its stored messages and tool calls (``flowkernel.history.agent_runs`` says how its row is kept).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Path, Query, Request, Response
from flowkernel.history.agent_runs import STATUSES
from flowkernel.history.conversations import Page
from flowkernel.server.document import problems
from flowkernel.server.pagination import (
    DEFAULT_LIMIT,
    MAX_INT,
    MAX_LIMIT,
    AgentRunsCursor,
    Cursors,
    MessagesCursor,
    ToolCallsCursor,
    cursors_of,
)
from flowkernel.server.problems import ApiProblem
from flowkernel.server.runs import json_response, kernel_of
from flowkernel.server.views import AgentRun, AgentRunDetail, Message, ToolCall
from flowkernel.server.views import Page as PageView

router = APIRouter(tags=["agents"])

Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description=f"items per page (at most {MAX_LIMIT})")]
RowId = Annotated[int, Path(ge=1, le=MAX_INT)]
ToolStatus = Annotated[str | None, Query(pattern="^(completed|error)$", description="completed | error")]
AgentStatus = Annotated[str | None, Query(pattern=f"^({'|'.join(STATUSES)})$", description=" | ".join(STATUSES))]
# The listing's fields; the detail adds model, summary and usage.
_LISTED = ("agentRunId", "runId", "agentId", "status", "stepCount", "maxSteps", "sessionId", "resumedFrom",
           "parentRunId", "createdAt", "completedAt", "durationMs", "errorMessage", "totalCostUsd")


def message_view(row: dict[str, Any]) -> dict[str, Any]:
    return {"messageId": row["id"], "agentRunId": row["runId"], "runId": row["flowRunId"], "agentId": row["nodeId"],
            "sessionId": row["sessionId"], "role": row["role"], "content": row["content"], "step": row["step"],
            "createdAt": row["createdAt"]}


def tool_call_view(row: dict[str, Any]) -> dict[str, Any]:
    return {"toolCallId": row["id"], "toolUseId": row["toolUseId"], "messageId": row["messageId"],
            "agentRunId": row["runId"], "runId": row["flowRunId"], "agentId": row["nodeId"],
            "toolName": row["toolName"], "input": row["input"], "output": row["output"], "status": row["status"],
            "durationMs": row["durationMs"], "step": row["step"], "createdAt": row["createdAt"]}


def _page(cursors: Cursors, page: Page, kind: str, view: Any) -> Response:
    return json_response({"items": [view(r) for r in page["items"]],
                          "nextCursor": cursors.encode(kind, page["nextCursor"])})


def agent_run_view(row: Any, *, detail: bool = False) -> dict[str, Any]:
    full: dict[str, Any] = msgspec.to_builtins(row)
    view = {k: full[k] for k in _LISTED}
    view["totalCostUsd"] = round(view["totalCostUsd"], 10)
    if detail:
        view.update(model=full["model"], summary=full["summary"], usage=full["usage"])
    return view


def _agent_run_of(request: Request, agent_run_id: str, run_id: str | None) -> str:
    """The run that holds agent run ``agent_run_id`` (404 if none does)."""
    found = kernel_of(request).agent_run(agent_run_id, run_id)
    if found is not None:
        return found.runId
    if run_id is None:  # a conversation stored before agent runs were kept
        rows = kernel_of(request).store.list_agent_messages(run_id=agent_run_id, limit=1)
        if rows:
            return str(rows[0]["flowRunId"])
    raise _unknown(agent_run_id, run_id)


def _unknown(agent_run_id: str, run_id: str | None) -> ApiProblem:
    return ApiProblem(404, f"no agent run {agent_run_id!r}" + (f" in run {run_id}" if run_id else "")
                      + ": agent runs are the node runs (nr_…) of claude.agent nodes", kind="unknown-agent-run")


ForkRun = Annotated[str | None, Query(description="the run whose agent run it is: a fork shares the node run ids "
                                                  "of the history it copied (default: the run that executed it)")]


# -- agent runs -------------------------------------------------------------------------------

@router.get("/agent-runs", response_model=PageView[AgentRun], summary="List agent runs, newest first",
            responses=problems(400))
def list_agent_runs(request: Request, status: AgentStatus = None, agentId: str | None = None,
                    runId: str | None = None, parentRunId: str | None = None, limit: Limit = DEFAULT_LIMIT,
                    cursor: AgentRunsCursor = None) -> Response:
    cursors = cursors_of(request)
    rows, last = kernel_of(request).agent_run_page(run_id=runId, status=status, agent_id=agentId,
                                                   parent_run_id=parentRunId,
                                                   before=cursors.decode("agent-runs", cursor), limit=limit)
    return json_response({"items": [agent_run_view(r) for r in rows], "nextCursor": cursors.encode("agent-runs", last)})


@router.get("/agent-runs/{agentRunId}", response_model=AgentRunDetail,
            summary="One agent run: steps, usage, cost, final text", responses=problems(404))
def get_agent_run(request: Request, agentRunId: str, runId: ForkRun = None) -> Response:
    found = kernel_of(request).agent_run(agentRunId, runId)
    if found is None:
        raise _unknown(agentRunId, runId)
    return json_response(agent_run_view(found, detail=True))


# -- a run's agents ---------------------------------------------------------------------------

@router.get("/runs/{runId}/messages", response_model=PageView[Message], summary="The stored agent messages of a run",
            responses=problems(400, 404))
def run_messages(request: Request, runId: str, nodeId: str | None = None, agentRunId: str | None = None,
                 limit: Limit = DEFAULT_LIMIT, cursor: MessagesCursor = None) -> Response:
    kernel = kernel_of(request)
    kernel.store.get_run(runId)
    cursors = cursors_of(request)
    page = kernel.messages(flow_run_id=runId, run_id=agentRunId, node_id=nodeId,
                           after=cursors.decode("messages", cursor) or 0, limit=limit)
    return _page(cursors, page, "messages", message_view)


@router.get("/runs/{runId}/tool-calls", response_model=PageView[ToolCall], summary="The stored tool calls of a run",
            responses=problems(400, 404))
def run_tool_calls(request: Request, runId: str, nodeId: str | None = None, agentRunId: str | None = None,
                   toolName: str | None = None, status: ToolStatus = None, limit: Limit = DEFAULT_LIMIT,
                   cursor: ToolCallsCursor = None) -> Response:
    kernel = kernel_of(request)
    kernel.store.get_run(runId)
    cursors = cursors_of(request)
    page = kernel.tool_calls(flow_run_id=runId, run_id=agentRunId, node_id=nodeId, tool_name=toolName, status=status,
                             after=cursors.decode("tool-calls", cursor) or 0, limit=limit)
    return _page(cursors, page, "tool-calls", tool_call_view)


# -- one agent run ----------------------------------------------------------------------------

@router.get("/agent-runs/{agentRunId}/messages", response_model=PageView[Message],
            summary="An agent run's messages, ordered by step", responses=problems(400, 404))
def agent_messages(request: Request, agentRunId: str, runId: ForkRun = None, limit: Limit = DEFAULT_LIMIT,
                   cursor: MessagesCursor = None) -> Response:
    holder = _agent_run_of(request, agentRunId, runId)
    cursors = cursors_of(request)
    page = kernel_of(request).messages(run_id=agentRunId, flow_run_id=holder,
                                       after=cursors.decode("messages", cursor) or 0, limit=limit)
    return _page(cursors, page, "messages", message_view)


@router.get("/agent-runs/{agentRunId}/messages/{messageId}", response_model=Message, summary="One stored message",
            responses=problems(400, 404))
def agent_message(request: Request, agentRunId: str, messageId: RowId, runId: ForkRun = None) -> Response:
    holder = _agent_run_of(request, agentRunId, runId)
    rows = kernel_of(request).store.list_agent_messages(run_id=agentRunId, flow_run_id=holder, after=messageId - 1,
                                                        limit=1)
    if not rows or rows[0]["id"] != messageId:
        raise ApiProblem(404, f"no message {messageId} in agent run {agentRunId!r}", kind="unknown-message")
    return json_response(message_view(rows[0]))


@router.get("/agent-runs/{agentRunId}/tool-calls", response_model=PageView[ToolCall],
            summary="An agent run's tool calls", responses=problems(400, 404))
def agent_tool_calls(request: Request, agentRunId: str, runId: ForkRun = None, toolName: str | None = None,
                     status: ToolStatus = None, limit: Limit = DEFAULT_LIMIT,
                     cursor: ToolCallsCursor = None) -> Response:
    holder = _agent_run_of(request, agentRunId, runId)
    cursors = cursors_of(request)
    page = kernel_of(request).tool_calls(run_id=agentRunId, flow_run_id=holder, tool_name=toolName, status=status,
                                         after=cursors.decode("tool-calls", cursor) or 0, limit=limit)
    return _page(cursors, page, "tool-calls", tool_call_view)


@router.get("/agent-runs/{agentRunId}/tool-calls/{toolCallId}", response_model=ToolCall, summary="One tool call",
            responses=problems(400, 404))
def agent_tool_call(request: Request, agentRunId: str, toolCallId: RowId, runId: ForkRun = None) -> Response:
    holder = _agent_run_of(request, agentRunId, runId)
    rows = kernel_of(request).store.list_tool_calls(run_id=agentRunId, flow_run_id=holder, after=toolCallId - 1,
                                                    limit=1)
    if not rows or rows[0]["id"] != toolCallId:
        raise ApiProblem(404, f"no tool call {toolCallId} in agent run {agentRunId!r}", kind="unknown-tool-call")
    return json_response(tool_call_view(rows[0]))
