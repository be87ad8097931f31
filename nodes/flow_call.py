"""``flow.call``: runs another flow as a child run and outputs the child's final outputs."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import anyio
from flowkernel.core.events import FlowPaused, NodeStart
from flowkernel.core.node import INTERRUPTED, Interrupted, WaitFor, bindable
from flowkernel.core.node_context import NodeContext
from flowkernel.errors import FlowkernelError, NodeFailure, Problem
from flowkernel.flowfiles.localfiles import resolve_inside

if TYPE_CHECKING:
    from flowkernel.core.snapshot import RunSnapshot
    from flowkernel.run.kernel import Kernel

DEFAULT_MAX_DEPTH = 8


class FlowCallNode:
    """Input ``{"flow": "<path relative to this flow>", "input"?: {...}}``.

    The child flow must be a regular file inside this flow's folder (or a folder the operator allows:
    ``flowkernel.flowfiles.localfiles``), whether the path is written in the flow or comes from a binding.

    The child run records ``parentRunId`` and ``parentNodeRunId``. Pause and abort cascade to it; a
    child waiting for a human makes this node (and so the parent run) wait; when this node runs
    again after an interruption it continues the same child instead of starting another.
    """

    name = "flow.call"
    input_schema: dict[str, Any] = {
        "type": "object", "required": ["flow"], "additionalProperties": False,
        "properties": {
            "flow": {"type": "string", "description": (
                "The child flow file, relative to this flow's folder (and inside it, or a folder allowed "
                "with --allow-dir).")},
            "input": bindable({"type": "object", "description": "The child run's input."}),
        },
    }
    cooperative_pause = True
    # A send is not forwarded to the child run: send to the child's node runs (its own run id).
    takes_messages = False

    def check(self, raw_input: dict[str, Any], path: str, problems: list[Problem]) -> None:
        if not isinstance(raw_input.get("flow"), str):
            problems.append(Problem(f"{path}.flow", "flow.call needs a `flow` path (relative to this flow file)"))
        if raw_input.get("input") is not None and not isinstance(raw_input.get("input"), (dict, str)):
            problems.append(Problem(f"{path}.input", "input must be an object"))

    async def run(self, ctx: NodeContext) -> Any:
        kernel: Kernel = ctx.services.extra["kernel"]
        data = ctx.input if isinstance(ctx.input, dict) else {}
        target = data.get("flow")
        if not isinstance(target, str):
            raise NodeFailure("flow.call needs a `flow` path", "invalid_input")
        try:
            path = resolve_inside(ctx.flow.base_dir, target, "flow.call")
        except FlowkernelError as exc:
            raise NodeFailure(str(exc), "invalid_flow") from None
        chain = self._ancestry(kernel, ctx.flow_run_id)
        limit = int(ctx.services.limits.flow_depth or os.environ.get("FLOWKERNEL_MAX_FLOW_DEPTH") or DEFAULT_MAX_DEPTH)
        if len(chain) >= limit:
            names = " → ".join(reversed(chain))
            raise NodeFailure(f"flow.call depth limit {limit} reached calling {target} ({names} → …); a flow that "
                              "calls itself needs a `when` that ends the recursion (or raise "
                              "FLOWKERNEL_MAX_FLOW_DEPTH)", "recursion_limit")
        try:
            child_flow = kernel.load_flow(path)
        except FlowkernelError as exc:
            raise NodeFailure(f"flow.call {target}: {exc}", "invalid_flow") from None

        child_id = self._adopt(kernel, ctx) if ctx.resumed_from else None
        adopted = child_id is not None
        if child_id is None:
            try:
                child_id = kernel.create_run(child_flow, data.get("input") or {}, parent_run_id=ctx.flow_run_id,
                                             parent_node_run_id=ctx.run_id)
            except FlowkernelError as exc:
                raise NodeFailure(f"flow.call {target}: {exc}", "invalid_input") from None
        try:
            snap = await self._drive(kernel, ctx, child_id, adopted)
        except anyio.get_cancelled_exc_class():
            if ctx.stop_reason == "abort":
                with anyio.CancelScope(shield=True):
                    await _abort_quietly(kernel, child_id)
            raise
        if snap.status == "completed":
            return snap.outputs
        if snap.status == "paused":
            if ctx.pause_requested():
                return INTERRUPTED  # the parent pauses, and paused the child with it
            return Interrupted(pause=_child_paused(ctx.node_id, child_id, snap))
        if snap.status == "waiting":
            waits = [{"nodeId": n, "runId": w.runId, "prompt": w.prompt} for n, w in snap.waiting.items()]
            return WaitFor(prompt={"childRunId": child_id, "waiting": waits})
        raise NodeFailure(f"child run {child_id} ({target}) {snap.status}: {snap.error}", "child_" + snap.status)

    async def _drive(self, kernel: Kernel, ctx: NodeContext, child_id: str, adopted: bool) -> Any:
        from flowkernel.core.commands import Command

        record = kernel.store.get_run(child_id)
        resume_message = next((m.content for m in ctx.inbox() if m.kind == "resume"), None)
        result: list[Any] = []
        async with anyio.create_task_group() as tg:
            async def cascade_pause() -> None:
                await ctx.wait_for_pause()
                try:
                    await kernel.command(child_id, Command(kind="pause", reason="parent paused"))
                except FlowkernelError:
                    pass  # the child has stopped already

            tg.start_soon(cascade_pause)
            if record.status == "paused" and ctx.resumed_from:
                result.append(await kernel.resume(child_id, resume_message or "continue",
                                                  budget=_budget_for(kernel, ctx, child_id)))
            elif record.status == "failed" and ctx.resumed_from:
                result.append(await kernel.retry(child_id))
            elif record.status == "running" and adopted:
                # Its executor (this node's interrupted run, in a process that died) left it running:
                # it is resumed like any interrupted run, with the parent's resume message.
                result.append(await kernel.resume(child_id, resume_message))
            elif record.status in ("running", "waiting"):
                result.append(await kernel.execute(child_id, before=_continue_waiting))
            else:
                result.append(kernel.snapshot(child_id))
            tg.cancel_scope.cancel()
        return result[0]

    @staticmethod
    def _ancestry(kernel: Kernel, run_id: str) -> list[str]:
        names: list[str] = []
        current: str | None = run_id
        while current is not None and len(names) < 1000:
            record = kernel.store.get_run(current)
            names.append(record.flowName)
            current = record.parentRunId
        return names

    @staticmethod
    def _adopt(kernel: Kernel, ctx: NodeContext) -> str | None:
        """The child started by an earlier node run of this same pass (before a pause or crash)."""
        runs: list[str] = []
        for ev in kernel.events(ctx.flow_run_id):
            if isinstance(ev, NodeStart) and ev.nodeId == ctx.node_id and ev.item == ctx.item:
                if ev.resumedFrom is None:
                    runs = []
                runs.append(ev.runId or "")
        mine = set(runs)
        children = [c for c in kernel.runs(parent=ctx.flow_run_id) if c.parentNodeRunId in mine]
        return children[0].runId if children else None


def _child_paused(node_id: str, child_id: str, snap: RunSnapshot) -> FlowPaused:
    """What pauses the parent when its child paused of its own accord: the child's budget, as this
    node's (so ``resume --budget`` on the parent raises it), or whatever else paused the child."""
    paused = snap.budgetPause
    if paused is not None:
        return FlowPaused(reason="budget", nodeId=node_id, costUsd=paused.costUsd, limitUsd=paused.limitUsd)
    return FlowPaused(reason=f"child run {child_id} paused")


def _budget_for(kernel: Kernel, ctx: NodeContext, child_id: str) -> float | None:
    """The limit to resume a child paused for its budget with: the one ``resume --budget`` gave this
    node in the parent, when that is above what the child spent (else the child decides)."""
    raised = ctx.raised_budget()
    paused = kernel.snapshot(child_id).budgetPause
    return raised if raised is not None and paused is not None and raised > paused.costUsd else None


def _continue_waiting(snap: Any) -> list[Any]:
    from flowkernel.core.events import FlowResumed

    # A waiting child whose inbox now holds a reply continues; otherwise it stays as it is.
    if snap.status == "waiting" and any(snap.inbox.get(w.runId) for w in snap.waiting.values()):
        return [FlowResumed(message=None)]
    return []


async def _abort_quietly(kernel: Kernel, child_id: str) -> None:
    from flowkernel.core.commands import Command

    try:
        await kernel.command(child_id, Command(kind="abort", reason="parent aborted"))
    except FlowkernelError:
        pass
