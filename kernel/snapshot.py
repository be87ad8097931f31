"""The RunSnapshot (DESIGN §5): everything needed to continue a run, and nothing else."""

from __future__ import annotations

from typing import Any

import msgspec


class InboxMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    kind: str  # send | reply | resume
    content: Any
    seq: int  # the command:received event that accepted it


class ForEachState(msgspec.Struct, kw_only=True, omit_defaults=True):
    items: list[Any]
    results: list[Any]  # one slot per item: None until it finishes
    running: dict[str, str] = msgspec.field(default_factory=dict)  # str(item index) -> node run id


class NodeFault(msgspec.Struct, kw_only=True, omit_defaults=True):
    errorType: str
    message: str
    runId: str | None = None


class Waiting(msgspec.Struct, kw_only=True, omit_defaults=True):
    runId: str
    prompt: Any = None
    schema: dict[str, Any] | None = None


class RunSnapshot(msgspec.Struct, kw_only=True):
    runId: str
    status: str  # running | paused | waiting | completed | failed | aborted
    seq: int
    flowHash: str
    input: Any
    outputs: dict[str, Any]
    state: dict[str, Any]
    nodeStatus: dict[str, str]  # pending | running | waiting | done | failed | skipped
    edgeStatus: dict[str, str]  # pending | fired | skipped
    loopCounters: dict[str, int]
    inbox: dict[str, list[InboxMessage]]  # node run id -> undelivered messages
    agentSessions: dict[str, str]  # node id -> session id
    nodeRuns: dict[str, str]  # node id -> current node run id
    attempts: dict[str, int] = msgspec.field(default_factory=dict)
    faults: dict[str, NodeFault] = msgspec.field(default_factory=dict)
    waiting: dict[str, Waiting] = msgspec.field(default_factory=dict)  # node id -> what it waits for
    forEach: dict[str, ForEachState] = msgspec.field(default_factory=dict)
    resumedFrom: dict[str, str] = msgspec.field(default_factory=dict)  # node id -> interrupted run
    error: str | None = None
    parentRunId: str | None = None
    parentNodeRunId: str | None = None
