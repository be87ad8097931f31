"""The built-in node types, as ``module:attr`` strings the registry imports on first use: the registry
never imports a node module itself, and a run that uses only ``transform`` nodes never loads the agent's."""

from __future__ import annotations

BUILTIN_NODE_TYPES: dict[str, str] = {
    "noop": "flowkernel.nodes.basic:NoopNode",
    "transform": "flowkernel.nodes.basic:TransformNode",
    "state.set": "flowkernel.nodes.basic:StateSetNode",
    "python": "flowkernel.nodes.python_fn:PythonNode",
    "human.input": "flowkernel.nodes.human:HumanInputNode",
    "flow.call": "flowkernel.nodes.flow_call:FlowCallNode",
    "claude.agent": "flowkernel.nodes.claude:ClaudeAgentNode",
    "claude.code": "flowkernel.nodes.claude_code:ClaudeCodeNode",
}
# The built-in node types whose node runs are agent runs (their ``records_agent_runs``), said here too so
# that a registry answers for a type it has not imported yet without importing it (tests/test_agent_runs.py
# checks that each agrees with its node type).
BUILTIN_AGENT_TYPES = frozenset({"claude.agent", "claude.code"})
