"""The built-in node types (one module each, imported on first use: ``flowkernel.plugins.registry.LazyMap``); they see the run through ``ctx`` and never import the shell."""

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
