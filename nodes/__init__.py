"""Built-in node types, imported on first use (see ``kernel.registry.LazyMap``)."""

from __future__ import annotations

BUILTIN_NODE_TYPES: dict[str, str] = {
    "noop": "nodes.basic:NoopNode",
    "transform": "nodes.basic:TransformNode",
    "state.set": "nodes.basic:StateSetNode",
    "python": "nodes.python_fn:PythonNode",
    "human.input": "nodes.human:HumanInputNode",
    "flow.call": "nodes.flow_call:FlowCallNode",
    "claude.agent": "nodes.claude:ClaudeAgentNode",
}
