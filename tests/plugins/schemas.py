"""A plugin node type that says what its input is with an ``input_schema`` alone (no ``check``)."""

from __future__ import annotations

from typing import Any

from flowkernel.core.node import bindable
from flowkernel.core.node_context import NodeContext
from flowkernel.plugins.registry import register_node_type


@register_node_type
class Pad:
    name = "text.pad"
    input_schema = {"type": "object", "required": ["text"], "additionalProperties": False,
                    "properties": {"text": {"type": "string"},
                                   "width": bindable({"type": "integer", "minimum": 1})}}

    async def run(self, ctx: NodeContext) -> Any:
        return str(ctx.input["text"]).ljust(int(ctx.input.get("width", 10)))
