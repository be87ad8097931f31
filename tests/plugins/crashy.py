"""Test plugin: deterministic python functions for crash and property tests.

Load it with ``--plugin tests.plugins.crashy`` (or ``FLOWKERNEL_PLUGINS``) and the repository root on
``PYTHONPATH``. ``crashy.step`` is the work of one node: its output is a digest of its label and of
what it was given, so a node that ran with the wrong input, or twice in a chain, changes every output
downstream. With ``CRASH_AT=K`` in the environment, the K-th call in this process SIGKILLs the
process from inside the node, so a crash test can die at a chosen, repeatable point mid-node.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from typing import Any

import anyio.lowlevel
from flowkernel.core.node_context import NodeContext
from flowkernel.plugins.registry import register_function

_calls = 0


def digest(label: str, prev: Any) -> str:
    """What ``crashy.step`` outputs for ``label`` given ``prev``: exposed so tests can predict it."""
    data = json.dumps([label, prev], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()[:16]


@register_function("crashy.step")
def step(label: str, prev: Any = None, trail: str | None = None, ctx: NodeContext | None = None) -> dict[str, Any]:
    """One node's work; appends ``label`` to ``state.<trail>`` when ``trail`` is given."""
    global _calls
    _calls += 1
    if os.environ.get("CRASH_AT") == str(_calls):
        os.kill(os.getpid(), signal.SIGKILL)
    if trail is not None and ctx is not None:
        ctx.patch_state("append", trail, label)
    return {"label": label, "digest": digest(label, prev)}


@register_function("crashy.check")
def check(value: Any, fail_when: int = 0) -> Any:
    """Fails (deterministically, from its input alone) when ``value`` modulo 3 equals ``fail_when``."""
    number = value if isinstance(value, int) else len(json.dumps(value, sort_keys=True))
    if number % 3 == fail_when:
        raise ValueError(f"crashy.check refuses {number} (≡ {fail_when} mod 3)")
    return number


@register_function("crashy.check_later")
async def check_later(value: Any, fail_when: int = 0, yields: int = 1) -> Any:
    """``check`` after yielding to the event loop ``yields`` times, so node runs finish out of order."""
    for _ in range(yields):
        await anyio.lowlevel.checkpoint()
    return check(value, fail_when)


@register_function("crashy.patch_then_work")
async def patch_then_work(path: str, value: Any, ctx: NodeContext) -> Any:
    """Patches the state, then goes on working until that patch is committed (a node whose patch is
    stored while it still runs: a crash then leaves the patch of an unfinished node run behind)."""
    ctx.patch_state("append", path, value)
    with anyio.fail_after(10):
        while not any(b'"state:patch"' in body and ctx.run_id.encode() in body
                      for body in ctx.store.read_events(ctx.flow_run_id)):
            await anyio.sleep(0.002)
    return value


@register_function("crashy.step_later")
async def step_later(label: str, prev: Any = None, trail: str | None = None, ctx: NodeContext | None = None) -> dict[str, Any]:
    """``step``, after yielding to the event loop: node runs of it run as tasks, concurrently."""
    await anyio.lowlevel.checkpoint()
    return step(label, prev, trail, ctx)
