"""Resume is exact for every node type, whatever the crash point (each test kills a real process at a
chosen durable write with ``tests.plugins.crashpoint``, then resumes it in a new one).

WHEN a node run is killed part-way (after its state patch was stored, after ``agent:start`` but
before the prompt row, in the middle of a tool call, inside a child run)
THEN ``flowkernel resume`` finishes the run with what an uninterrupted run would have: each patch
counted once, each agent's conversation starting with its prompt, once, each tool call stored once,
the same child run carried on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from flowkernel.api import Kernel
from flowkernel.events import StatePatch

from tests.crash_support import KILLED, flowkernel, only_run, write_flow
from tests.helpers import py, registry, run_flow

CRASHY = ("tests.plugins.crashy",)


def patch_flow() -> dict[str, Any]:
    return {"name": "patches", "state": {"initial": {"xs": [1, 2, 3]}},
            "nodes": [py("add", "crashy.patch_then_work", {"path": "xs", "value": 4}),
                      {"id": "after", "type": "transform", "input": {"expr": "state.xs"}}],
            "edges": [{"from": "add", "to": "after"}]}


def test_a_patch_stored_by_a_node_run_killed_before_it_finished_counts_once_after_resume(tmp_path: Path) -> None:
    flow = write_flow(tmp_path, patch_flow())
    db = tmp_path / "runs.db"
    crashed = flowkernel(db, "run", str(flow), plugins=CRASHY, crash="after-event:state:patch:1")
    assert crashed.returncode == KILLED, crashed.stderr
    run_id = only_run(db)
    kernel = Kernel(str(db))
    try:
        assert any(isinstance(e, StatePatch) for e in kernel.events(run_id)), "the patch was stored before the kill"
        before = kernel.snapshot(run_id)
        assert before.nodeStatus["add"] == "running"
        assert before.state["xs"] == [1, 2, 3], "a patch of an unfinished node run is not in the state yet"
    finally:
        kernel.close()

    resumed = flowkernel(db, "resume", run_id, plugins=CRASHY)
    assert resumed.returncode == 0, resumed.stderr
    kernel = Kernel(str(db))
    try:
        final = kernel.snapshot(run_id)
        assert final.state["xs"] == [1, 2, 3, 4]
        assert final.outputs["after"] == [1, 2, 3, 4]
    finally:
        kernel.close()


def test_a_node_run_sees_its_own_patches_before_it_completes_and_others_see_them_after() -> None:
    seen: dict[str, Any] = {}

    async def writer(ctx: Any) -> str:
        ctx.patch_state("append", "xs", 4)
        ctx.patch_state("merge", "meta", {"by": "writer"})
        seen["own"] = ctx.state
        with anyio.fail_after(10):  # until both patches are stored
            while sum(b'"state:patch"' in b for b in ctx.store.read_events(ctx.flow_run_id)) < 2:
                await anyio.sleep(0.002)
        seen["stored"] = ctx.services["kernel"].snapshot(ctx.flow_run_id)
        return "ok"

    doc = {"name": "own", "state": {"initial": {"xs": [1]}},
           "nodes": [py("writer", "writer"), {"id": "reader", "type": "transform", "input": {"expr": "state"}}],
           "edges": [{"from": "writer", "to": "reader"}]}
    _, snap, _ = run_flow(doc, reg=registry(writer=writer))
    assert seen["own"] == {"xs": [1, 4], "meta": {"by": "writer"}}
    stored = seen["stored"]
    assert stored.state == {"xs": [1]}, "the run's state changes when the node run completes"
    assert [(p.op, p.path) for p in stored.staged[stored.nodeRuns["writer"]]] == [("append", "xs"), ("merge", "meta")]
    assert snap.outputs["reader"] == {"xs": [1, 4], "meta": {"by": "writer"}}


def test_a_retried_node_run_applies_its_patches_once() -> None:
    calls = {"n": 0}

    def flaky(ctx: Any) -> int:
        calls["n"] += 1
        ctx.patch_state("append", "xs", calls["n"])
        if calls["n"] == 1:
            raise RuntimeError("first attempt fails after patching")
        return calls["n"]

    doc = {"name": "retry", "state": {"initial": {"xs": []}},
           "nodes": [py("flaky", "flaky", policy={"retry": {"maxAttempts": 2, "backoffMs": 0}})]}
    _, snap, _ = run_flow(doc, reg=registry(flaky=flaky))
    assert snap.status == "completed"
    assert snap.state["xs"] == [2], "the failed attempt's patch is discarded with it"


def test_a_failed_node_run_leaves_the_state_as_it_was() -> None:
    def broken(ctx: Any) -> None:
        ctx.patch_state("set", "flag", True)
        raise RuntimeError("broken")

    doc = {"name": "failing", "state": {"initial": {"flag": False}},
           "nodes": [py("broken", "broken", policy={"continueOnError": True}),
                     {"id": "after", "type": "transform", "input": {"expr": "state.flag"}}],
           "edges": [{"from": "broken", "to": "after"}]}
    _, snap, _ = run_flow(doc, reg=registry(broken=broken))
    assert snap.nodeStatus["broken"] == "failed"
    assert snap.state == {"flag": False} and snap.outputs["after"] is False


def test_patches_of_a_node_type_that_continues_from_its_progress_apply_at_once() -> None:
    seen: list[Any] = []

    class Stepper:
        """Cooperative: its patches are its progress (a node run that continues it reads them back)."""

        name = "stepper"
        cooperative_pause = True

        async def run(self, ctx: Any) -> Any:
            ctx.patch_state("set", "progress", 1)
            with anyio.fail_after(10):  # the patch is in the run's state before the node run ends
                while ctx.services["kernel"].snapshot(ctx.flow_run_id).state.get("progress") != 1:
                    await anyio.sleep(0.002)
            seen.append(True)
            return "done"

    reg = registry()
    reg.add_node_type(Stepper)
    _, snap, events = run_flow({"name": "steps", "nodes": [{"id": "s", "type": "stepper", "input": {}}]}, reg=reg)
    patch = next(e for e in events if isinstance(e, StatePatch))
    assert patch.staged is False and seen == [True]
    assert snap.state == {"progress": 1} and snap.staged == {}
