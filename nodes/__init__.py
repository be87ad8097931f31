"""Built-in node types, imported on first use (see ``flowkernel.plugins.registry.LazyMap``)."""

from __future__ import annotations

BUILTIN_NODE_TYPES: dict[str, str] = {
    "noop": "flowkernel.nodes.basic:NoopNode",
    "transform": "flowkernel.nodes.basic:TransformNode",
    "state.set": "flowkernel.nodes.basic:StateSetNode",
    "python": "flowkernel.nodes.python_fn:PythonNode",
    "human.input": "flowkernel.nodes.human:HumanInputNode",
    "flow.call": "flowkernel.nodes.flow_call:FlowCallNode",
    "claude.agent": "flowkernel.nodes.claude:ClaudeAgentNode",
}
