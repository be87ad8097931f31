"""The model-call seam (DESIGN §8): how an agent node makes one model call, and which way it is made.

A query function takes the Messages API request body the node built and a callback for the agent
events it streams (``agent:text:delta``, ``agent:thinking:delta``, ``agent:error`` …), and returns
the final assistant message. Nothing else in the kernel talks to a model. Three implement it:

- ``flowkernel.agents.anthropic.AnthropicQuery``: the Messages API through the ``anthropic`` SDK (the
  default: ``flowkernel.agents.default.default_query()``, which imports the SDK on its first call only);
- ``flowkernel.fixtures.MockQuery`` (and ``FixtureLibrary``): replays recorded calls (DESIGN §8);
- ``flowkernel.fixtures.RecordingQuery``: wraps another and records what it answers.

Which one a run uses is chosen in one place, ``flowkernel.run.setup.query_for``: the one given to the
Kernel, else the run's fixtures, else the default. Node types call ``ctx.services.query_fn``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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


class ReplaysRequests(Protocol):
    """A node type whose model calls can be replayed from a stored run (``fixtures_from_run``): it says
    what request body its node sent for a conversation, as a fixture's ``input`` records it."""

    def request_for(self, node_input: Any, node_id: str, messages: list[dict[str, Any]],
                    tools: Mapping[str, Any], *, tool_choice: dict[str, Any] | None = None) -> dict[str, Any]:
        """``messages``: the stored conversation before the call (each with the ``modelCall`` kept on
        assistant messages); ``tool_choice``: the one the call was made with, as it stored it."""
        ...
