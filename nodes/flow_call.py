"""``flow.call``: runs another flow as a child run and outputs the child's final outputs."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import anyio
from flowkernel.core.commands import Command
from flowkernel.core.events import FlowPaused
from flowkernel.core.node import INTERRUPTED, Interrupted, WaitFor, bindable
from flowkernel.core.node_context import NodeContext
from flowkernel.errors import FlowkernelError, NodeFailure, Problem
from flowkernel.flowfiles.localfiles import resolve_inside

if TYPE_CHECKING:
    from flowkernel.core.snapshot import RunSnapshot

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
        children = ctx.children
        data = ctx.input if isinstance(ctx.input, dict) else {}
        target = data.get("flow")
        if not isinstance(target, str):
            raise NodeFailure("flow.call needs a `flow` path", "invalid_input")
        try:
            path = resolve_inside(ctx.flow.base_dir, target, "flow.call")
        except FlowkernelError as exc:
            raise NodeFailure(str(exc), "invalid_flow") from None
        chain = children.ancestry()
        limit = int(ctx.services.limits.flow_depth or os.environ.get("FLOWKERNEL_MAX_FLOW_DEPTH") or DEFAULT_MAX_DEPTH)
        if len(chain) >= limit:
            names = " → ".join(reversed(chain))
            raise NodeFailure(f"flow.call depth limit {limit} reached calling {target} ({names} → …); a flow that "
                              "calls itself needs a `when` that ends the recursion (or raise "
                              "FLOWKERNEL_MAX_FLOW_DEPTH)", "recursion_limit")
        try:
            child_flow = children.load(path)
        except FlowkernelError as exc:
            raise NodeFailure(f"flow.call {target}: {exc}", "invalid_flow") from None

        child_id = children.adopt() if ctx.resumed_from else None
        adopted = child_id is not None
        if child_id is None:
            try:
                child_id = children.create(child_flow, data.get("input") or {})
            except FlowkernelError as exc:
                raise NodeFailure(f"flow.call {target}: {exc}", "invalid_input") from None
        try:
            snap = await _drive(ctx, child_id, adopted)
        except anyio.get_cancelled_exc_class():
            if ctx.stop_reason == "abort":
                with anyio.CancelScope(shield=True):
                    await _quietly(ctx, child_id, Command(kind="abort", reason="parent aborted"))
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


async def _drive(ctx: NodeContext, child_id: str, adopted: bool) -> RunSnapshot:
    """The child run driven until it stops; a pause of this run pauses it too, meanwhile."""
    resume_message = next((m.content for m in ctx.inbox() if m.kind == "resume"), None)
    result: list[RunSnapshot] = []
    async with anyio.create_task_group() as tg:
        async def cascade_pause() -> None:
            await ctx.wait_for_pause()
            await _quietly(ctx, child_id, Command(kind="pause", reason="parent paused"))

        tg.start_soon(cascade_pause)
        result.append(await ctx.children.drive(child_id, adopted=adopted, resume_message=resume_message,
                                               raised_budget=ctx.raised_budget()))
        tg.cancel_scope.cancel()
    return result[0]


def _child_paused(node_id: str, child_id: str, snap: RunSnapshot) -> FlowPaused:
    """What pauses the parent when its child paused of its own accord: the child's budget, as this
    node's (so ``resume --budget`` on the parent raises it), or whatever else paused the child."""
    paused = snap.budgetPause
    if paused is not None:
        return FlowPaused(reason="budget", nodeId=node_id, costUsd=paused.costUsd, limitUsd=paused.limitUsd)
    return FlowPaused(reason=f"child run {child_id} paused")


async def _quietly(ctx: NodeContext, child_id: str, command: Command) -> None:
    """A pause or abort cascading to the child; refused when it has stopped already, which is fine."""
    try:
        await ctx.children.command(child_id, command)
    except FlowkernelError:
        pass
