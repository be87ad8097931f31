"""What a run uses from the process that executes it (``RunServices``, which node types see as
``ctx.services``), and the limits it puts on node types (``NodeLimits``).

Given to the Kernel (``Kernel(services=RunServices(...))``, or the documented mapping
``Kernel(services={"query_fn": ..., "prices": ...})``, which ``flowkernel.run.setup.services_of`` reads
key by key). How the shell itself runs (commit window, polls, grace periods) is not here: that is
``flowkernel.run.tuning.Tuning``, which node types never see.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from flowkernel.core.expression_scope import ExpressionLimits


class NodeLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Limits a process sets on what node types do (None: the node type's default, or its variable)."""

    flow_depth: int | None = None  # flow.call nesting (else FLOWKERNEL_MAX_FLOW_DEPTH, else 8)
    agent_total_turns: int | None = None  # model calls of one agent session, across node runs (else 500)
    tool_result_bytes: int | None = None  # a tool result sent to the model is cut to this many bytes


class RunServices(msgspec.Struct, frozen=True, kw_only=True):
    """What a run uses: how model calls are made, the fixtures they come from, where traces go, the price
    table, the limits of open expressions and of node types, and (``extra``) what the embedding program
    gives its own node types under names flowkernel does not know.

    ``query_fn``: the query function agent nodes call (``flowkernel.agents.query.QueryFn``); the shell
    fills it for each run (``flowkernel.run.setup.query_for``): the one given, else the fixtures' mock
    query, else the Messages API. Typed loosely here: the core does not import agents/."""

    query_fn: Callable[..., Any] | None = None
    # ``claude.code``: the session query for a flow's name when the run's sessions come from fixtures
    # (filled by ``query_for`` beside ``query_fn``); None: the node's own default, the real SDK.
    session_query: Callable[[str], Any] | None = None
    fixtures: str | None = None
    tracer_provider: Any = None
    prices: Mapping[str, Any] | None = None
    expression_limits: ExpressionLimits | None = None  # None: the FLOWKERNEL_EXPR_* variables'
    limits: NodeLimits = msgspec.field(default_factory=NodeLimits)
    extra: Mapping[str, Any] = msgspec.field(default_factory=dict)

    # The mapping ``ctx.services`` was before it was typed, kept for node types written against it:
    # ``ctx.services.get("prices")``, ``ctx.services["my_service"]`` (a name of ``extra``).

    def get(self, key: str, default: Any = None) -> Any:
        """The service named ``key`` as the documented mapping named it, else ``default``."""
        field = _KEYS.get(key)
        value = field(self) if field is not None else self.extra.get(key)
        return default if value is None else value

    def __getitem__(self, key: str) -> Any:
        field = _KEYS.get(key)
        if field is not None:
            return field(self)
        return self.extra[key]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (self.get(key) is not None)


_KEYS: dict[str, Callable[[RunServices], Any]] = {
    "query_fn": lambda s: s.query_fn,
    "fixtures": lambda s: s.fixtures,
    "tracer_provider": lambda s: s.tracer_provider,
    "prices": lambda s: s.prices,
    "expression_limits": lambda s: s.expression_limits,
    "max_flow_depth": lambda s: s.limits.flow_depth,
    "agent_max_total_turns": lambda s: s.limits.agent_total_turns,
    "tool_result_max_bytes": lambda s: s.limits.tool_result_bytes,
}
