"""Node types and functions with the bugs a kernel must survive, for ``--plugin tests.plugins.faulty``."""

from __future__ import annotations

import sys
from typing import Any

from flowkernel.context import NodeContext
from flowkernel.events import LoopIterate
from flowkernel.registry import register_function, register_node_type


@register_function("faulty.exit")
def exit_process(code: int = 3) -> None:
    """Calls ``sys.exit``, as a careless script would."""
    sys.exit(code)


class BadProbe:
    """A node type whose inline probe (asked by the run shell, not inside the node run) has a bug."""

    name = "faulty.probe"

    def runs_inline(self, input: Any, registry: Any) -> bool:
        raise AttributeError("'NoneType' object has no attribute 'inline'")

    async def run(self, ctx: NodeContext) -> Any:
        return "never"


class BadEvent:
    """A node type that emits an event naming an edge the flow does not have."""

    name = "faulty.event"

    async def run(self, ctx: NodeContext) -> Any:
        ctx.emit(LoopIterate(edgeId="no-such-edge", iteration=1))
        return "done"


register_node_type(BadProbe)
register_node_type(BadEvent)
