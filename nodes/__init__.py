"""Built-in node types."""

from __future__ import annotations

from kernel.node import NodeType


def builtin_node_types() -> list[NodeType]:
    from nodes.basic import NoopNode, StateSetNode, TransformNode
    from nodes.python_fn import PythonNode

    types: list[NodeType] = [NoopNode(), TransformNode(), StateSetNode(), PythonNode()]
    for optional in ("nodes.human:HumanInputNode", "nodes.flow_call:FlowCallNode", "nodes.claude:ClaudeAgentNode"):
        module, _, cls = optional.partition(":")
        try:
            mod = __import__(module, fromlist=[cls])
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        types.append(getattr(mod, cls)())
    return types
