"""The query-function seam (DESIGN §8): how a Claude node makes one model call.

A query function takes the Messages API request body the node built and a callback for the agent
events it streams (``agent:text:delta``, ``agent:thinking:delta``, ``agent:error`` …), and returns
the final assistant message. The default calls the ``anthropic`` SDK; ``MockQuery`` (fixtures)
replays recorded calls. Nothing else in the kernel talks to a model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypedDict

from flowkernel.core.events import BaseEvent


class ModelMessage(TypedDict, total=False):
    """The final assistant message of one call."""

    content: list[dict[str, Any]]  # API content blocks: text, thinking (with signature), tool_use, compaction
    stopReason: str | None
    # inputTokens, outputTokens, cacheCreationInputTokens, cacheReadInputTokens: what the call is billed
    # for, a compaction's own summarizing pass included
    usage: dict[str, int]
    model: str
    id: str
    # The API's ``usage.iterations`` when the call did more than one pass (a compaction, then the
    # message): each ``{"type": "compaction" | "message", "inputTokens", "outputTokens", …}``.
    iterations: list[dict[str, Any]]


class QueryContext(Protocol):
    """Who is calling: the fixtures key calls by node id and call index."""

    node_id: str
    run_id: str
    flow_run_id: str


class QueryFn(Protocol):
    async def __call__(self, request: dict[str, Any], emit: Callable[[BaseEvent], None],
                       ctx: QueryContext) -> ModelMessage: ...
