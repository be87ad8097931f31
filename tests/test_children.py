"""A node type starts and drives child runs through ``ctx.children`` (what ``flow.call`` uses), never
through the Kernel: the child run is its node run's, and a command reaches it through the same door."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
from flowkernel.core.commands import Command
from flowkernel.core.node_context import NodeContext
from flowkernel.errors import CommandRejectedError
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore

from tests.helpers import registry

CHILD = {"name": "child", "nodes": [{"id": "double", "type": "transform", "input": {"expr": "flow.input.n * 2"}}]}


class Delegate:
    """Runs ``child.json`` beside its flow as a child run and outputs what the child did."""

    name = "delegate"

    async def run(self, ctx: NodeContext) -> Any:
        children = ctx.children
        flow = children.load(ctx.flow.base_dir / "child.json")  # type: ignore[operator]
        child_id = children.create(flow, {"n": ctx.input["n"]})
        snap = await children.drive(child_id, adopted=False, resume_message=None, raised_budget=None)
        refused = ""
        try:
            await children.command(child_id, Command(kind="pause", reason="too late"))
        except CommandRejectedError as exc:
            refused = str(exc)
        return {"child": child_id, "status": snap.status, "outputs": snap.outputs, "ancestry": children.ancestry(),
                "refused": refused, "seen": children.snapshot(child_id).status}


def test_a_node_type_runs_a_child_run_of_its_own_through_ctx_children(tmp_path: Path) -> None:
    (tmp_path / "child.json").write_text(json.dumps(CHILD))
    (tmp_path / "parent.json").write_text(json.dumps(
        {"name": "parent", "nodes": [{"id": "d", "type": "delegate", "input": {"n": 21}}]}))
    reg = registry()
    reg.add_node_type(Delegate)
    kernel = Kernel(MemoryStore(), registry=reg)
    snap = anyio.run(kernel.run, kernel.load_flow(tmp_path / "parent.json"), {})
    assert snap.status == "completed", snap.error
    out = snap.outputs["d"]
    assert (out["status"], out["outputs"], out["ancestry"], out["seen"]) == \
        ("completed", {"double": 42}, ["parent"], "completed")
    assert "completed" in out["refused"]  # a command to a child that stopped is refused, as for any run
    [child] = kernel.runs(parent=snap.runId)
    assert (child.runId, child.parentNodeRunId) == (out["child"], snap.nodeRuns["d"])
