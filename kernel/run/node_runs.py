"""A run's node runs: which are in flight, starting them, and each one's attempts.

A node run is a task in the run's task group (or, for node types that finish without awaiting, a call
in the loop's own task). Its attempts: ``timeoutMs`` through ``anyio.fail_after``; a failure is a
``node:error`` with ``willRetry`` while attempts remain, then a new node run, announced durably, after
``backoffMs * 2**(attempt-1)``. Cancelled when the run stops or a loop resets the node; on pause, node
types that stop at their next step boundary (``cooperative_pause``) finish their step first.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import (
    BaseEvent,
    FlowPaused,
    NodeComplete,
    NodeError,
    NodeSkipped,
    NodeStart,
    NodeWaiting,
)
from flowkernel.core.expressions import is_constant
from flowkernel.core.node import Interrupted, WaitFor
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.errors import FlowkernelError, NodeFailure
from flowkernel.ids import new_node_run_id
from flowkernel.plugins.registry import Registry
from flowkernel.run.node_context import Shell, ShellNodeContext
from flowkernel.telemetry import traces as telemetry

Key = tuple[str, int | None]  # a node, and the forEach item of its node run (None: not an item)


class Host(Shell, Protocol):
    """What node runs need from the run loop besides what their contexts use."""

    def finished(self, node_id: str, item: int | None, pause: FlowPaused | None) -> None:
        """A node run ended without an event (interrupted at a step boundary, perhaps pausing the run)."""


class NodeRuns:
    """The node runs of one execution: in flight (with their cancel scopes), decided and not yet started."""

    def __init__(self, host: Host, flow: CompiledFlow, registry: Registry) -> None:
        self._host = host
        self._flow = flow
        self._registry = registry
        self.active: dict[Key, anyio.CancelScope | None] = {}  # None: decided, or running inline
        self._to_launch: list[NodeStart] = []
        self._inline_of: dict[str, bool] = {}  # node -> runs inline (for nodes whose input has no binding)

    # -- which node run an event comes from --------------------------------------------------

    def key(self, ev: BaseEvent, snap: RunSnapshot) -> Key:
        n, item = ev.nodeId or "", getattr(ev, "item", None)
        if item is None and n in snap.forEach and ev.runId and not isinstance(ev, NodeStart):
            # Agent and state events of a forEach item carry no ``item``: find it by the node run.
            for key, run_id in snap.forEach[n].running.items():
                if run_id == ev.runId:
                    return (n, int(key))
        return (n, item)

    def stale(self, ev: BaseEvent, snap: RunSnapshot) -> bool:
        """Whether a node's event comes from a node run that is no longer the live one."""
        key = self.key(ev, snap)
        if key not in self.active:
            return True
        if isinstance(ev, NodeStart):
            return False  # a retry announcing its new node run
        n, item = key
        if item is not None:
            fe = snap.forEach.get(n)
            return fe is None or fe.running.get(str(item)) != ev.runId
        return snap.nodeRuns.get(n) != ev.runId

    def ended(self, ev: NodeComplete | NodeSkipped | NodeError | NodeWaiting, snap: RunSnapshot) -> None:
        """A node's run ended (or waits): it is no longer in flight."""
        if isinstance(ev, NodeError) and ev.willRetry:
            return
        if not isinstance(ev, NodeSkipped):
            self.active.pop(self.key(ev, snap), None)  # a skipped node never ran

    def gone(self, node_id: str, item: int | None) -> None:
        self.active.pop((node_id, item), None)

    # -- starting ----------------------------------------------------------------------------

    def decided(self, start: NodeStart, snap: RunSnapshot) -> None:
        """A start was decided (before it is appended): it occupies a slot from now on."""
        self.active[self.key(start, snap)] = None

    def to_launch(self, start: NodeStart, snap: RunSnapshot) -> None:
        """After its start was appended: launch it with the next commit, unless something followed it
        (its own error for a bad binding, a forEach group's items)."""
        if self._launchable(start, snap):
            self._to_launch.append(start)
        else:
            self.active.pop(self.key(start, snap), None)

    def _launchable(self, s: NodeStart, snap: RunSnapshot) -> bool:
        n = s.nodeId or ""
        if s.item is not None:
            fe = snap.forEach.get(n)
            return fe is not None and fe.running.get(str(s.item)) == s.runId
        return snap.nodeStatus.get(n) == "running" and snap.nodeRuns.get(n) == s.runId and n not in snap.forEach

    async def launch(self, tg: TaskGroup | None) -> None:
        """Start the node runs decided (and saved)."""
        launch, self._to_launch = self._to_launch, []
        snap = self._host.current_snapshot()
        if snap.status == "running" and tg is not None:
            for s in launch:
                if self._inline(s):
                    # Finishes without awaiting anything: no task needed; its events arrive like any other's.
                    await self.attempts(s)
                    continue
                scope = anyio.CancelScope()
                self.active[self.key(s, snap)] = scope
                tg.start_soon(self._run_node, s, scope)

    def _inline(self, s: NodeStart) -> bool:
        """Node runs that complete synchronously (no timeout, no retry) run in the shell's own task."""
        n = s.nodeId or ""
        known = self._inline_of.get(n)
        if known is not None:
            return known
        node = self._flow.nodes[n]
        if node.policy.timeoutMs or (node.policy.retry and node.policy.retry.maxAttempts > 1):
            inline = False
        else:
            node_type = self._registry.node_types.get(node.type)
            probe = getattr(node_type, "runs_inline", None)
            inline = bool(probe(s.input, self._registry)) if probe is not None else False
        if is_constant(node.input):  # the same input on every run of this node: the same answer
            self._inline_of[n] = inline
        return inline

    # -- stopping ----------------------------------------------------------------------------

    def cancel(self, nodes: tuple[str, ...]) -> None:
        """A loop reset these nodes: node runs of theirs still in flight are cancelled."""
        reset = set(nodes)
        for key, scope in list(self.active.items()):
            if key[0] in reset:
                if scope is not None:
                    scope.cancel()
                del self.active[key]
        # Decided in this same step but not launched yet: never launch them.
        self._to_launch = [s for s in self._to_launch if s.nodeId not in reset]

    def stop(self, *, cooperative: bool) -> None:
        """Cancel the node runs in flight; with ``cooperative``, node types that stop at their next step
        boundary when asked are left to do so."""
        for key, scope in list(self.active.items()):
            if cooperative and scope is not None and self._cooperative(key[0]):
                continue
            if scope is not None:
                scope.cancel()
            self.active.pop(key, None)

    def _cooperative(self, node_id: str) -> bool:
        node_type = self._registry.node_types.get(self._flow.nodes[node_id].type)
        return bool(getattr(node_type, "cooperative_pause", False))

    # -- one node run ------------------------------------------------------------------------

    async def _run_node(self, start: NodeStart, scope: anyio.CancelScope) -> None:
        with scope:
            await self.attempts(start)

    async def attempts(self, start: NodeStart) -> None:
        host = self._host
        node = self._flow.nodes[start.nodeId or ""]
        node_type = self._registry.node_types[node.type]
        policy = node.policy
        max_attempts = policy.retry.maxAttempts if policy.retry else 1
        backoff_ms = policy.retry.backoffMs if policy.retry else 0
        attempt, run_id, start_seq = start.attempt, start.runId or "", start.seq
        flow_run_id = host.current_snapshot().runId
        while True:
            ctx = ShellNodeContext(host, node_id=node.id, run_id=run_id, flow_run_id=flow_run_id, attempt=attempt,
                                   input=start.input, item=start.item, resumed_from=start.resumedFrom)
            began = time.monotonic()
            try:
                with telemetry.node_span(node.id, node.type, run_id, attempt, start.item):
                    if policy.timeoutMs:
                        with anyio.fail_after(policy.timeoutMs / 1000):
                            result = await node_type.run(ctx)
                    else:
                        result = await node_type.run(ctx)
            except BaseException as exc:
                if not _is_node_failure(exc):
                    raise
                error_type, message = _describe(exc, policy.timeoutMs)
                will_retry = attempt < max_attempts and not host.pause_requested()
                host.submit(NodeError(nodeId=node.id, runId=run_id, item=start.item, errorType=error_type,
                                      message=message, attempt=attempt, willRetry=will_retry,
                                      details=_traceback(exc, policy.timeoutMs)))
                if not will_retry:
                    return
                await anyio.sleep(backoff_ms * (2 ** (attempt - 1)) / 1000)
                attempt += 1
                run_id = new_node_run_id()
                again = NodeStart(nodeId=node.id, runId=run_id, attempt=attempt, input=start.input, item=start.item)
                await host.submit_durable(again)
                start_seq = again.seq
                continue
            duration = int((time.monotonic() - began) * 1000)
            if isinstance(result, Interrupted):
                host.finished(node.id, start.item, result.pause)
            elif isinstance(result, WaitFor):
                # ``cause``: the node:start of the run that now waits. It saw its inbox as of then, so
                # only messages that came after wake it again (a node type that waits on, ignoring a
                # message, must not be restarted for it forever).
                host.submit(NodeWaiting(nodeId=node.id, runId=run_id, prompt=result.prompt, schema=result.schema,
                                        cause=start_seq))
            else:
                host.submit(NodeComplete(nodeId=node.id, runId=run_id, item=start.item, output=result,
                                         durationMs=duration))
            return


TRACEBACK_FRAMES = 30  # the innermost ones: where the code that failed was
TRACEBACK_CHARS = 16_000


def _traceback(exc: BaseException, timeout_ms: int | None) -> Any:
    """``{"traceback": ...}`` for an exception no node type raised on purpose (a bug in a function, a
    tool, a plugin): the message alone rarely says where. Expected failures (NodeFailure, timeouts,
    flowkernel's own errors) carry their meaning in the message, and a NodeFailure its own details
    (a fixture mismatch: the differing paths)."""
    if isinstance(exc, NodeFailure):
        return exc.details
    if isinstance(exc, FlowkernelError) or (isinstance(exc, TimeoutError) and timeout_ms):
        return None
    import traceback

    text = "".join(traceback.format_exception(exc, limit=-TRACEBACK_FRAMES))
    if len(text) > TRACEBACK_CHARS:
        text = "…" + text[-(TRACEBACK_CHARS - 1):]
    return {"traceback": text}


def _is_node_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised from a node run, is that node's failure. Cancellation (a timeout, a pause,
    an abort), Ctrl-C and a coroutine being closed go on; anything else a node's code raises, SystemExit
    and a bare BaseException included, must not end the process (and every other run it executes) with
    the run left half-done."""
    if isinstance(exc, Exception):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_node_failure(e) for e in exc.exceptions)
    return not isinstance(exc, (anyio.get_cancelled_exc_class(), KeyboardInterrupt, GeneratorExit))


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error to report from a task group's exception group: a flowkernel error if there is one
    (it carries the message meant for the user), else the first one."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop(0)
        if isinstance(exc, BaseExceptionGroup):
            pending[:0] = list(exc.exceptions)
        else:
            leaves.append(exc)
    return next((e for e in leaves if isinstance(e, FlowkernelError)), leaves[0])


def _describe(exc: BaseException, timeout_ms: int | None) -> tuple[str, str]:
    if isinstance(exc, BaseExceptionGroup):  # from a task group inside the node: say what failed in it
        exc = first_error(exc)
    if isinstance(exc, TimeoutError) and timeout_ms:
        return "timeout", f"timed out after {timeout_ms} ms"
    if isinstance(exc, NodeFailure):
        return exc.error_type, str(exc)
    if isinstance(exc, FlowkernelError):
        return type(exc).__name__, str(exc)
    if not isinstance(exc, Exception):  # SystemExit, a bare BaseException: say what was raised
        return type(exc).__name__, f"raised {type(exc).__name__}({exc})"
    return type(exc).__name__, str(exc) or type(exc).__name__
