"""Tools that log each call (tool, input, idempotency key) to ``<folder>/calls.jsonl``, for the crash tests.

``slow`` logs its start, then waits until ``<folder>/release`` exists: a process killed while it waits
leaves a call that started and has no result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
from flowkernel.agents.tools import ToolContext
from flowkernel.plugins.registry import Registry


def _log(folder: Path, **entry: Any) -> None:
    with (folder / "calls.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def calls(folder: Path) -> list[dict[str, Any]]:
    path = folder / "calls.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def register(registry: Registry, folder: Path) -> None:
    def fast(text: str, ctx: ToolContext) -> str:
        """Does a quick thing."""
        _log(folder, tool="fast", text=text, key=ctx.idempotency_key)
        return f"fast {text}"

    async def slow(text: str, ctx: ToolContext) -> str:
        """Does a slow thing."""
        _log(folder, tool="slow", text=text, key=ctx.idempotency_key)
        while not (folder / "release").exists():
            await anyio.sleep(0.02)
        return f"slow {text}"

    registry.add_tool("fast", fast)
    registry.add_tool("slow", slow)
