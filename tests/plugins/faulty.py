"""Node types and functions with the bugs a kernel must survive, for ``--plugin tests.plugins.faulty``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
from flowkernel.core.events import LoopIterate
from flowkernel.core.node_context import NodeContext
from flowkernel.plugins.registry import register_function, register_node_type


@register_function("faulty.exit")
def exit_process(code: int = 3) -> None:
    """Calls ``sys.exit``, as a careless script would."""
    sys.exit(code)


@register_function("faulty.base")
def base_exception() -> None:
    """Raises a bare BaseException, which no ``except Exception`` catches."""
    raise BaseException("not an Exception")


@register_function("faulty.deep")
def deep(depth: int = 100_000) -> list[Any]:
    """A list nested deeper than any JSON encoder goes."""
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@register_function("faulty.surrogate")
def surrogate() -> str:
    """Text with a lone surrogate: a Python str, not UTF-8."""
    return "bad \ud800"


@register_function("faulty.patch")
def patch(ctx: NodeContext, value: str = "surrogate") -> str:
    """Writes a value that is not JSON into the state."""
    ctx.patch_state("set", "odd", "bad \udc80" if value == "surrogate" else object())
    return "unreachable"


@register_function("faulty.wait_for_file")
async def wait_for_file(path: str) -> str:
    """Waits until the test creates ``path``: the test decides when this node finishes."""
    while not Path(path).exists():
        await anyio.sleep(0.02)
    return Path(path).read_text()


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
