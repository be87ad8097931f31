"""Which node runs are agent runs is the node type's declaration (``records_agent_runs``, ``max_steps``):
the read models fold them from the log knowing no node type, and a new agent node type gets its agent
runs by declaring it."""

from __future__ import annotations

from typing import Any

import anyio
from flowkernel.core.events import AgentStart, AgentUsage
from flowkernel.core.node import RecordsAgentRuns
from flowkernel.core.node_context import NodeContext
from flowkernel.plugins.builtins import BUILTIN_AGENT_TYPES, BUILTIN_NODE_TYPES
from flowkernel.plugins.registry import Registry, default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore


def test_the_built_in_table_says_which_types_record_agent_runs_as_the_types_themselves_do() -> None:
    registry = default_registry()
    for name in BUILTIN_NODE_TYPES:
        declared = bool(getattr(registry.node_types[name], "records_agent_runs", False))
        assert declared == (name in BUILTIN_AGENT_TYPES), name


def test_a_registry_answers_for_a_built_in_agent_type_without_importing_it() -> None:
    registry = Registry()
    for name, target in BUILTIN_NODE_TYPES.items():
        registry.node_types.add_lazy(name, target, instantiate=True)
    assert registry.records_agent_runs("claude.agent") and not registry.records_agent_runs("transform")
    assert registry.node_types.lazy("claude.agent")  # still not imported


class Scribe:
    """An agent node type of a plugin: one model call of its own, recorded as an agent run."""

    name = "test.scribe"
    records_agent_runs = True

    def max_steps(self, node_input: Any) -> int | None:
        return int(node_input.get("budget", 3))

    async def run(self, ctx: NodeContext) -> Any:
        await ctx.emit_durable(AgentStart(sessionId="ses_scribe", model="scribe-1", prompt="write"))
        ctx.emit(AgentUsage(model="scribe-1", usage={"inputTokens": 5, "outputTokens": 7}, costUsd=0.25))
        return "written"


def test_a_node_type_that_declares_it_records_agent_runs_gets_one_per_node_run() -> None:
    assert isinstance(Scribe(), RecordsAgentRuns)
    registry = default_registry()  # (the suite's replay audit folds agent runs with the default registry)
    if "test.scribe" not in registry.node_types:
        registry.add_node_type(Scribe)
    kernel = Kernel(MemoryStore(), registry=registry)
    flow = kernel.compile({"name": "scribes", "nodes": [{"id": "s", "type": "test.scribe", "input": {"budget": 7}},
                                                        {"id": "t", "type": "transform", "input": {"expr": "1"}}]})
    snap = anyio.run(kernel.run, flow, {})
    assert snap.status == "completed"
    [(_, row)] = kernel.store.list_agent_runs(run_id=snap.runId)
    assert (row.agentId, row.agentRunId, row.status, row.maxSteps, row.stepCount, row.sessionId, row.totalCostUsd) == \
        ("s", snap.nodeRuns["s"], "completed", 7, 1, "ses_scribe", 0.25)
