"""The API's request bodies and response shapes as pydantic models: they make the OpenAPI document.

Responses are encoded with msgspec from the Python API's own structs (the same bytes ``events
--json`` prints for an event); these models describe them.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProblemItem(BaseModel):
    path: str = Field(description="where: a JSON path into the body (`$.input.name`) or a parameter's name")
    message: str


class Problem(BaseModel):
    """An error (RFC 9457, ``application/problem+json``)."""

    type: str = Field(description="a URI naming the kind of problem, e.g. …/problems/unknown-run")
    title: str
    status: int
    detail: str = Field(description="what is wrong and what to do, in one line")
    errors: list[ProblemItem] | None = Field(None, description="each problem with where it is")


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    store: Literal["sqlite", "postgresql", "memory"]


class Usage(BaseModel):
    inputTokens: int
    outputTokens: int
    cacheCreationInputTokens: int
    cacheReadInputTokens: int


class RunSummary(BaseModel):
    runId: str
    flowName: str
    # "interrupted": stored as running, but no process executes it (its executor died); resume continues it
    status: Literal["queued", "running", "paused", "waiting", "completed", "failed", "aborted", "interrupted"]
    parentRunId: str | None
    createdAt: int = Field(description="Unix ms")
    updatedAt: int = Field(description="Unix ms of the run's last event")
    completedAt: int | None
    durationMs: int | None
    totalCostUsd: float = Field(description="the run's model calls and its child runs'")
    usage: Usage
    error: str | None


class RunInfo(RunSummary):
    seq: int
    flowHash: str
    input: Any
    parentNodeRunId: str | None = None
    forkedFrom: str | None = None
    forkedAt: int | None = None
    rerunOf: str | None = Field(None, description="a rerun: the run whose recording it replays; its "
                                                  "`flow:complete` says whether it matched (`rerun`)")
    idempotencyKey: str | None = None
    pooled: bool = Field(False, description="the worker pool executes the run (it was queued): `/resume` and "
                                            "`/retry` hand it back to the workers; a run a `flowkernel run` process "
                                            "started is not theirs (409 `not-pooled`): continue it with the CLI")


class NodeInfo(BaseModel):
    type: str
    takesMessages: bool = Field(description="whether `send` reaches it (its type reads messages); a send to a "
                                            "node run of a node that does not is refused (409)")


class RunDetail(BaseModel):
    run: RunInfo
    snapshot: dict[str, Any] = Field(description="the RunSnapshot (DESIGN §5)")
    children: list[RunSummary]
    nodes: dict[str, NodeInfo] = Field(description="the nodes of the flow the snapshot follows, by id")


class Page(BaseModel, Generic[T]):
    items: list[T]
    nextCursor: str | None = Field(description="pass as ?cursor= for the next page; null at the end")


class Event(BaseModel):
    """An event exactly as `flowkernel events --json` prints it (DESIGN §4)."""

    model_config = ConfigDict(extra="allow")
    type: str
    seq: int
    timestamp: int
    flowRunId: str


class Worker(BaseModel):
    """A live worker, as ``flowkernel workers --json`` prints it."""

    workerId: str = Field(description="its owner id on the leases it holds (host:pid:…)")
    host: str
    pid: int
    startedAt: int = Field(description="Unix ms")
    heartbeatAt: int = Field(description="Unix ms of its last heartbeat")
    concurrency: int = Field(description="runs it executes at once, at most")
    leaseMs: int = Field(description="its lease time: how soon another worker takes its runs over if it dies")
    runs: list[str] = Field(description="the runs whose lease it holds")


class Workers(BaseModel):
    items: list[Worker] = Field(description="every live worker (a list that is never paged: one row per process)")


class FlowInfo(BaseModel):
    name: str
    description: str | None
    inputs: dict[str, Any] | None


# What the server checks of a flow document before anything else (the rest, every problem with its JSON
# path, is the 422 of validation): `flowkernel schema` prints the whole JSON Schema of flow files.
FLOW_DOCUMENT: dict[str, Any] = {
    "type": "object", "required": ["name", "nodes"],
    "properties": {"name": {"type": "string"}, "nodes": {"type": "array"}, "edges": {"type": "array"}},
    "description": "a flow document, as in a flow file (`flowkernel schema` prints its JSON Schema)"}


def _exactly_one_flow(schema: dict[str, Any]) -> None:
    """``flow`` or ``flowDocument``, exactly one of them not null (as ``POST /runs`` checks)."""
    schema["properties"]["flowDocument"] = {"anyOf": [FLOW_DOCUMENT, {"type": "null"}],
                                            "description": "a whole flow document"}
    schema["oneOf"] = [
        {"required": ["flow"], "properties": {"flow": {"type": "string"}, "flowDocument": {"type": "null"}}},
        {"required": ["flowDocument"], "properties": {"flowDocument": {"type": "object"}, "flow": {"type": "null"}}}]


def _flow_update(schema: dict[str, Any]) -> None:
    schema["properties"]["flowDocument"] = {"anyOf": [FLOW_DOCUMENT, {"type": "null"}], "description": _UPDATE}


class CreateRun(_Body):
    """``flow`` (a name) or ``flowDocument``, not both; ``input`` must satisfy that flow's ``inputs``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_exactly_one_flow)
    flow: str | None = Field(None, min_length=1,
                             description="the name of a flow in the server's --flows folders (GET /flows)")
    flowDocument: dict[str, Any] | None = Field(None, description="a whole flow document")
    input: Any = Field(None, description="the run's input: what the flow's `inputs` schema asks for")
    idempotencyKey: str | None = Field(None, min_length=1, max_length=200)


class Valid(BaseModel):
    valid: Literal[True]


_UPDATE = ("continue on this flow document instead of the run's own (`resume`/`retry --flow`): every node "
           "that has run and every edge decided must keep its id; the run records `flow:updated`")


class Resume(_Body):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_flow_update)
    message: str | None = Field(None, description='delivered to every interrupted node run (default "continue")')
    budget: float | None = Field(None, gt=0, allow_inf_nan=False, description=(
        "the new limit in US dollars for what paused the run for its budget (a node's policy.maxCostUsd, "
        "else the run's budget.maxCostUsd), as `flowkernel resume RUN --budget USD`"))
    flowDocument: dict[str, Any] | None = Field(None, description=_UPDATE)


class Retry(_Body):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_flow_update)
    message: str | None = Field(None, description="delivered to every interrupted node run")
    flowDocument: dict[str, Any] | None = Field(None, description=_UPDATE)


class Fork(_Body):
    at: int = Field(ge=1, le=2**53 - 1, description="the seq of the event whose snapshot the new run starts from")
    input: dict[str, Any] | None = Field(None, description=(
        "input keys to change from here on (nodes that have finished keep their outputs), as "
        "`flowkernel fork --input K=V`; the input as changed must satisfy the flow's `inputs`"))


class Rerun(_Body):
    """Nothing to give: the run's flow (its file as it is now, else the stored one) and input, as
    ``flowkernel rerun RUN``."""


class Send(_Body):
    to: str | None = Field(None, description="the node run (nr_…) the message is for")
    message: Any = None


class Reply(_Body):
    to: str | None = Field(None, description="the waiting node run (nr_…)")
    content: Any = None


class Pause(_Body):
    reason: str | None = None


class Abort(_Body):
    reason: str | None = None


class Accepted(BaseModel):
    accepted: Literal[True]
    seq: int = Field(description="the seq of the command:received event that accepted it")


class AgentRun(BaseModel):
    """One node run of a ``claude.agent`` node."""

    agentRunId: str = Field(description="its node run id (nr_…)")
    runId: str
    agentId: str = Field(description="the node id")
    status: Literal["running", "waiting", "completed", "failed", "interrupted"] = Field(
        description="interrupted: stopped unfinished (the run paused, failed, was aborted or crashed, a loop "
                    "reset it); a resume continues its conversation in an agent run whose resumedFrom names it")
    stepCount: int = Field(description="model calls it made")
    maxSteps: int | None = Field(description="its maxTurns: the model calls it may make")
    sessionId: str | None
    resumedFrom: str | None
    parentRunId: str | None = Field(description="the parent of its run (the agents of a flow.call child)")
    createdAt: int = Field(description="Unix ms")
    completedAt: int | None
    durationMs: int | None
    errorMessage: str | None
    totalCostUsd: float


class AgentRunDetail(AgentRun):
    model: str | None
    summary: str | None = Field(description="its final text")
    usage: Usage


class Message(BaseModel):
    messageId: int
    agentRunId: str
    runId: str
    agentId: str
    sessionId: str
    role: str
    content: Any
    step: int
    createdAt: int


class ToolCall(BaseModel):
    toolCallId: int
    toolUseId: str
    messageId: int | None
    agentRunId: str
    runId: str
    agentId: str
    toolName: str
    input: Any
    output: Any
    status: Literal["completed", "error"]
    durationMs: int | None
    step: int
    createdAt: int
