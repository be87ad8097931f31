"""Commands, inboxes, human input and sub-flows through the Python API (DESIGN §6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.commands import Command
from flowkernel.core.events import CommandReceived, FlowPaused, FlowResumed, NodeStart, NodeWaiting
from flowkernel.errors import CommandRejectedError
from flowkernel.plugins.registry import default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore

import tests.plugins.waiters  # noqa: F401  (registers the functions)
from tests.helpers import flow, py, registry

FLOWS = Path(__file__).parent / "flows"


def human(node_id: str, prompt: str = "?", schema: dict[str, Any] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"prompt": prompt}
    if schema is not None:
        data["schema"] = schema
    return {"id": node_id, "type": "human.input", "input": data}


def make_kernel(tmp_path: Path, **functions: Any) -> Kernel:
    return Kernel(SqliteStore(tmp_path / "runs.db"), registry=registry(**functions))


def waiting_run(kernel: Kernel, doc: dict[str, Any]) -> tuple[str, dict[str, str]]:
    snap = anyio.run(kernel.run, kernel.compile(doc), {})
    assert snap.status == "waiting"
    return snap.runId, {n: w.runId for n, w in snap.waiting.items()}


def records(kernel: Kernel, run_id: str) -> list[CommandReceived]:
    return [e for e in kernel.events(run_id) if isinstance(e, CommandReceived)]


def test_human_input_waits_then_completes_with_the_reply(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path)
    run_id, waits = waiting_run(kernel, flow([human("ask", "Your name?"), {"id": "hi", "type": "transform",
                                                "input": {"expr": "'hi ' & ask"}}], [{"from": "ask", "to": "hi"}]))
    waiting = [e for e in kernel.events(run_id) if isinstance(e, NodeWaiting)]
    assert [(e.nodeId, e.runId, e.prompt) for e in waiting] == [("ask", waits["ask"], "Your name?")]
    snap = anyio.run(kernel.reply, run_id, waits["ask"], "Ada")
    assert snap.status == "completed"
    assert snap.outputs == {"ask": "Ada", "hi": "hi Ada"}
    [record] = records(kernel, run_id)
    assert record.accepted and record.target == waits["ask"]
    assert [e.type for e in kernel.events(run_id)].count("flow:resumed") == 1


def test_several_human_nodes_wait_at_once_and_are_answered_separately(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path)
    run_id, waits = waiting_run(kernel, flow([human("a"), human("b"), {"id": "both", "type": "transform",
                                              "input": {"expr": "a & '+' & b"}}],
                                             [{"from": "a", "to": "both"}, {"from": "b", "to": "both"}]))
    assert set(waits) == {"a", "b"}
    snap = anyio.run(kernel.reply, run_id, waits["b"], "B")
    assert snap.status == "waiting" and snap.nodeStatus["b"] == "done" and snap.nodeStatus["a"] == "waiting"
    snap = anyio.run(kernel.reply, run_id, waits["a"], "A")
    assert snap.status == "completed" and snap.outputs["both"] == "A+B"


def test_send_without_run_id_is_rejected_and_recorded(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path)
    run_id, _ = waiting_run(kernel, flow([human("ask")]))
    before = kernel.snapshot(run_id)
    with pytest.raises(CommandRejectedError, match="needs the node runId"):
        anyio.run(kernel.command, run_id, Command(kind="send", content="hello"))
    after = kernel.snapshot(run_id)
    [record] = records(kernel, run_id)
    assert not record.accepted and "needs the node runId" in (record.reason or "")
    assert after.seq == before.seq + 1
    assert after.inbox == before.inbox and after.nodeStatus == before.nodeStatus and after.status == "waiting"


def test_reply_to_a_node_run_of_another_run_is_rejected(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path)
    first, waits_first = waiting_run(kernel, flow([human("ask")]))
    second, _ = waiting_run(kernel, flow([human("ask")]))
    with pytest.raises(CommandRejectedError, match="not a live node run of run"):
        anyio.run(kernel.reply, second, waits_first["ask"], "wrong run")
    assert kernel.snapshot(second).inbox == {}
    assert kernel.snapshot(first).inbox == {}
    assert not records(kernel, second)[0].accepted


def test_reply_that_fails_the_schema_is_refused_with_the_reason(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path)
    schema = {"type": "object", "properties": {"approve": {"type": "boolean"}}, "required": ["approve"]}
    run_id, waits = waiting_run(kernel, flow([human("ok", "Approve?", schema)]))
    with pytest.raises(CommandRejectedError, match="approve"):
        anyio.run(kernel.reply, run_id, waits["ok"], '{"approve": "yes"}')
    assert kernel.snapshot(run_id).status == "waiting"
    snap = anyio.run(kernel.reply, run_id, waits["ok"], '{"approve": true}')
    assert snap.status == "completed" and snap.outputs["ok"] == {"approve": True}


def test_reply_to_a_finished_node_run_is_refused(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path)
    run_id, waits = waiting_run(kernel, flow([human("a"), human("b")], [{"from": "a", "to": "b"}]))
    anyio.run(kernel.reply, run_id, waits["a"], "first")
    with pytest.raises(CommandRejectedError, match=r"has finished|not a live node run"):
        anyio.run(kernel.reply, run_id, waits["a"], "again")


def test_resume_of_a_completed_run_is_refused_and_recorded(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path)
    snap = anyio.run(kernel.run, kernel.compile(flow([{"id": "x", "type": "noop"}])), {})
    with pytest.raises(CommandRejectedError, match="completed; there is nothing to resume"):
        anyio.run(kernel.resume, snap.runId)
    assert kernel.snapshot(snap.runId).status == "completed"
    assert not records(kernel, snap.runId)[-1].accepted


def test_pause_interrupts_running_nodes_and_resume_delivers_the_message_once(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path)
    doc = flow([py("slow", "block_first_run"), py("other", "block_first_run")])
    compiled = kernel.compile(doc)
    run_id = kernel.create_run(compiled, {})

    async def main() -> Any:
        async with anyio.create_task_group() as tg:
            result: list[Any] = []

            async def execute() -> None:
                result.append(await kernel.execute(run_id))

            tg.start_soon(execute)
            while len([e for e in kernel.events(run_id) if isinstance(e, NodeStart)]) < 2:
                await anyio.sleep(0.01)
            await kernel.command(run_id, Command(kind="pause"))
        return result[0]

    paused = anyio.run(main)
    assert paused.status == "paused"
    assert [e.type for e in kernel.events(run_id)].count("flow:paused") == 1
    interrupted = dict(paused.nodeRuns)
    snap = anyio.run(kernel.resume, run_id, "carry on")
    assert snap.status == "completed"
    events = kernel.events(run_id)
    assert [type(e) for e in events].count(FlowResumed) == 1
    for node in ("slow", "other"):
        assert snap.outputs[node] == {"resumedFrom": interrupted[node], "inbox": ["carry on"]}
    assert any(isinstance(e, FlowPaused) for e in events)


def test_abort_is_final(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path)
    run_id, _ = waiting_run(kernel, flow([human("ask")]))
    anyio.run(kernel.command, run_id, Command(kind="abort", reason="no longer needed"))
    snap = kernel.snapshot(run_id)
    assert snap.status == "aborted" and snap.error == "no longer needed"
    with pytest.raises(CommandRejectedError, match="aborted"):
        anyio.run(kernel.resume, run_id)
    with pytest.raises(CommandRejectedError):
        anyio.run(kernel.command, run_id, Command(kind="abort"))


def test_retry_reruns_failed_nodes_with_fresh_attempts_and_keeps_history(tmp_path: Path) -> None:
    broken = {"yes": True}

    def fragile() -> str:
        if broken["yes"]:
            raise RuntimeError("disk full")
        return "fixed"

    kernel = make_kernel(tmp_path, fragile=fragile)
    doc = flow([{"id": "a", "type": "noop", "input": {"v": 1}}, py("b", "fragile"), {"id": "c", "type": "noop"}],
               [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}])
    snap = anyio.run(kernel.run, kernel.compile(doc), {})
    assert snap.status == "failed"
    broken["yes"] = False
    done = anyio.run(kernel.retry, snap.runId)
    assert done.status == "completed" and done.outputs["b"] == "fixed"
    events = kernel.events(snap.runId)
    starts = [e for e in events if isinstance(e, NodeStart)]
    assert [e.nodeId for e in starts] == ["a", "b", "b", "c"]  # a is not re-run
    assert starts[2].attempt == 1 and starts[2].resumedFrom == starts[1].runId
    assert any(e.type == "node:error" for e in events)


def test_send_reaches_only_the_inbox_of_that_node_run(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path)
    doc = flow([py("listener", "await_message"), py("other", "block_first_run")])
    run_id = kernel.create_run(kernel.compile(doc), {})

    async def main() -> Any:
        async with anyio.create_task_group() as tg:
            result: list[Any] = []

            async def execute() -> None:
                result.append(await kernel.execute(run_id))

            tg.start_soon(execute)
            while "listener" not in kernel.snapshot(run_id).nodeRuns:
                await anyio.sleep(0.01)
            target = kernel.snapshot(run_id).nodeRuns["listener"]
            await kernel.command(run_id, Command(kind="send", target=target, content="psst"))
            while kernel.snapshot(run_id).nodeStatus["listener"] != "done":
                await anyio.sleep(0.01)
            await kernel.command(run_id, Command(kind="pause"))
        return result[0]

    snap = anyio.run(main)
    assert snap.outputs["listener"] == ["psst"]
    assert snap.inbox == {}


def test_flow_call_runs_a_child_and_outputs_its_outputs(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path)
    snap = anyio.run(kernel.run, kernel.load_flow(FLOWS / "parent.json"), {})
    assert snap.status == "completed"
    assert snap.outputs["call"] == {"double": 42} and snap.outputs["after"] == 42
    [child] = kernel.runs(parent=snap.runId)
    assert child.flowName == "child" and child.status == "completed"
    assert child.parentNodeRunId == snap.nodeRuns["call"]


def test_child_waiting_for_a_human_makes_the_parent_wait_and_the_reply_finishes_both(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path)
    parent = anyio.run(kernel.run, kernel.load_flow(FLOWS / "parent_asks.json"), {})
    assert parent.status == "waiting"
    [child] = kernel.runs(parent=parent.runId)
    child_snap = kernel.snapshot(child.runId)
    assert child_snap.status == "waiting"
    assert parent.waiting["call"].prompt["childRunId"] == child.runId
    anyio.run(kernel.reply, child.runId, child_snap.waiting["ask"].runId, "teal")
    assert kernel.snapshot(child.runId).status == "completed"
    final = kernel.snapshot(parent.runId)
    assert final.status == "completed" and final.outputs["after"] == "child got teal"
    assert len(kernel.runs(parent=parent.runId)) == 1  # the same child continued, none started again


def test_pause_cascades_to_the_child_and_resume_continues_the_same_child(tmp_path: Path) -> None:
    (tmp_path / "slow_child.json").write_text(
        '{"name": "slow-child", "nodes": [{"id": "work", "type": "python", "input": {"function": "block_first_run"}}]}')
    (tmp_path / "parent.json").write_text(
        '{"name": "p", "nodes": [{"id": "call", "type": "flow.call", "input": {"flow": "slow_child.json"}}]}')
    kernel = make_kernel(tmp_path)
    parent_id = kernel.create_run(kernel.load_flow(tmp_path / "parent.json"), {})

    async def main() -> Any:
        async with anyio.create_task_group() as tg:
            result: list[Any] = []

            async def execute() -> None:
                result.append(await kernel.execute(parent_id))

            tg.start_soon(execute)
            while not kernel.runs(parent=parent_id) or \
                    "work" not in kernel.snapshot(kernel.runs(parent=parent_id)[0].runId).nodeRuns:
                await anyio.sleep(0.01)
            await kernel.command(parent_id, Command(kind="pause"))
        return result[0]

    assert anyio.run(main).status == "paused"
    [child] = kernel.runs(parent=parent_id)
    assert child.status == "paused"
    done = anyio.run(kernel.resume, parent_id, "go on")
    assert done.status == "completed"
    assert kernel.runs(parent=parent_id)[0].runId == child.runId
    assert kernel.snapshot(child.runId).outputs["work"]["inbox"] == ["go on"]
    assert done.outputs["call"]["work"]["resumedFrom"] is not None


def test_abort_cascades_to_a_waiting_child(tmp_path: Path) -> None:
    kernel = make_kernel(tmp_path)
    parent = anyio.run(kernel.run, kernel.load_flow(FLOWS / "parent_asks.json"), {})
    [child] = kernel.runs(parent=parent.runId)
    assert kernel.snapshot(child.runId).status == "waiting"
    anyio.run(kernel.command, parent.runId, Command(kind="abort"))
    assert kernel.snapshot(parent.runId).status == "aborted"
    assert kernel.snapshot(child.runId).status == "aborted"


def test_recursion_is_stopped_by_the_depth_limit(tmp_path: Path) -> None:
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), registry=default_registry(), services={"max_flow_depth": 3})
    snap = anyio.run(kernel.run, kernel.load_flow(FLOWS / "recursive.json"), {})
    assert snap.status == "failed"
    assert "depth limit 3" in (snap.error or "")
    chain = [r for r in kernel.runs() if r.flowName == "recursive"]
    assert len(chain) == 3


class _Stepper:
    """A cooperative node type: works in steps, stops between two steps when the run pauses."""

    name = "test.stepper"
    cooperative_pause = True

    def __init__(self, stubborn: bool = False) -> None:
        self.stubborn = stubborn
        self.steps_done: list[int] = []

    async def run(self, ctx: Any) -> Any:
        from flowkernel.core.node import INTERRUPTED

        start = len(self.steps_done)
        for step in range(start, 3):
            await anyio.sleep(0.05)
            self.steps_done.append(step)
            if ctx.pause_requested() and not self.stubborn:
                return INTERRUPTED
            if self.stubborn and step == 0:
                await anyio.sleep_forever()
        return list(self.steps_done)


def _stepper_run(tmp_path: Path, stepper: _Stepper, services: dict[str, Any] | None = None) -> tuple[Kernel, str]:
    """A kernel that knows ``stepper``, and a created run of a flow made of it alone."""
    reg = registry()
    reg.add_node_type(stepper)
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), registry=reg, services=services)
    return kernel, kernel.create_run(kernel.compile(flow([{"id": "s", "type": "test.stepper"}])), {})


def _pause_while_running(kernel: Kernel, run_id: str, on_event: Any = None) -> Any:
    async def main() -> Any:
        result: list[Any] = []
        async with anyio.create_task_group() as tg:
            async def execute() -> None:
                result.append(await kernel.execute(run_id, on_event=on_event))

            tg.start_soon(execute)
            while "s" not in kernel.snapshot(run_id).nodeRuns:
                await anyio.sleep(0.01)
            await kernel.command(run_id, Command(kind="pause"))
        return result[0]
    return anyio.run(main)


def test_a_cooperative_node_finishes_its_current_step_on_pause(tmp_path: Path) -> None:
    stepper = _Stepper()
    kernel, run_id = _stepper_run(tmp_path, stepper)
    assert _pause_while_running(kernel, run_id).status == "paused"
    assert stepper.steps_done == [0]  # the step in flight finished; the next one did not start
    done = anyio.run(kernel.resume, run_id)
    assert done.status == "completed" and done.outputs["s"] == [0, 1, 2]


def test_a_paused_run_keeps_its_lease_until_its_node_runs_have_finished(tmp_path: Path) -> None:
    stepper = _Stepper()
    kernel, run_id = _stepper_run(tmp_path, stepper)
    holder_at_pause: list[str | None] = []

    def watch(ev: Any) -> None:
        if ev.type == "flow:paused":  # committed while the stepper still finishes its step
            holder_at_pause.append(kernel.store.get_run(run_id).leaseOwner)

    assert _pause_while_running(kernel, run_id, on_event=watch).status == "paused"
    assert holder_at_pause == [kernel.owner], "a node run in flight may still write: the lease is kept"
    assert kernel.store.get_run(run_id).leaseOwner is None


def test_a_cooperative_node_that_ignores_the_pause_is_cancelled_after_the_grace_period(tmp_path: Path) -> None:
    stepper = _Stepper(stubborn=True)
    kernel, run_id = _stepper_run(tmp_path, stepper, services={"pause_grace_s": 0.1})
    paused = _pause_while_running(kernel, run_id)
    assert paused.status == "paused" and paused.nodeStatus["s"] == "running"  # interrupted, re-run on resume
