"""Small builders shared by the tests."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import anyio
from flowkernel.core.events import BaseEvent
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.plugins.registry import Registry, default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.base import Store
from flowkernel.store.memory import MemoryStore


def flow(nodes: list[dict[str, Any]], edges: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": extra.pop("name", "t"), "nodes": nodes, "edges": edges or [], **extra}


def t(node_id: str, expr: str, **extra: Any) -> dict[str, Any]:
    """A transform node."""
    return {"id": node_id, "type": "transform", "input": {"expr": expr}, **extra}


def py(node_id: str, function: str, args: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "python", "input": {"function": function, "args": args or {}}, **extra}


def registry(**functions: Any) -> Registry:
    reg = default_registry().copy()
    for name, fn in functions.items():
        reg.add_function(name, fn)
    return reg


def run_flow(document: dict[str, Any], input: Any = None, *, store: Store | None = None,
             reg: Registry | None = None) -> tuple[Kernel, RunSnapshot, list[BaseEvent]]:
    kernel = Kernel(store or MemoryStore(), registry=reg or registry())
    compiled = kernel.compile(document)
    snap = anyio.run(kernel.run, compiled, input)
    return kernel, snap, list(kernel.events(snap.runId))


def types(events: list[BaseEvent], *, node: str | None = None) -> list[str]:
    return [e.type for e in events if node is None or e.nodeId == node]


def started(events: list[BaseEvent]) -> list[str]:
    return [e.nodeId or "" for e in events if e.type == "node:start" and getattr(e, "item", None) is None]


def run_id_once_a_node_started(proc: subprocess.Popen[str]) -> str | None:
    """Read a `run --json` process's events until a node starts: the run's id, or None if it ended first."""
    assert proc.stdout is not None
    run_id = ""
    for line in proc.stdout:
        event = json.loads(line)
        run_id = run_id or event["flowRunId"]
        if event["type"] == "node:start":
            return run_id
    return None
