"""A plugin module as an operator would write one: a function and a node type."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowkernel.core.node_context import NodeContext
from flowkernel.plugins.registry import register_function, register_node_type


@register_function("shout")
def shout(text: str) -> str:
    return text.upper() + "!"


@register_function("fail_first_time")
def fail_first_time(marker: str) -> str:
    """Fails until the marker file exists (it creates it): a transient fault a retry gets past."""
    path = Path(marker)
    if not path.exists():
        path.write_text("failed once")
        raise RuntimeError(f"transient failure ({path.name})")
    return "ok"


class Reverse:
    name = "text.reverse"

    async def run(self, ctx: NodeContext) -> Any:
        return str(ctx.input.get("text", ""))[::-1]


register_node_type(Reverse)
