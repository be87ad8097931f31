"""Functions for command tests, loaded with ``--plugin tests.plugins.waiters``."""

from __future__ import annotations

import anyio
from flowkernel.core.node_context import NodeContext
from flowkernel.plugins.registry import register_function


@register_function("await_message")
async def await_message(ctx: NodeContext) -> list[object]:
    """Waits until its inbox holds a message, then outputs every message it holds."""
    while not ctx.inbox():
        await anyio.sleep(0.01)
    return [m.content for m in ctx.inbox()]


@register_function("block_first_run")
async def block_first_run(ctx: NodeContext) -> object:
    """Blocks forever unless this node run continues an interrupted one; then outputs its inbox."""
    if ctx.resumed_from is None:
        await anyio.sleep_forever()
    return {"resumedFrom": ctx.resumed_from, "inbox": [m.content for m in ctx.inbox()]}


@register_function("sleep_then")
async def sleep_then(seconds: float, value: object = None) -> object:
    await anyio.sleep(seconds)
    return value


@register_function("wait_for_file")
async def wait_for_file(path: str, value: object = None) -> object:
    """Holds its node run until the file at ``path`` exists (a gate a test opens), then outputs ``value``."""
    while not await anyio.Path(path).exists():
        await anyio.sleep(0.01)
    return value
