"""The node context the shell hands each node run (``ShellNodeContext``, implementing the core's
``NodeContext`` Protocol), and the ``Shell`` protocol it is served by."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec
from flowkernel.core.events import BaseEvent, InboxConsumed, StatePatch, encoder
from flowkernel.core.nonfinite import check_encoded
from flowkernel.core.snapshot import InboxMessage, RunSnapshot
from flowkernel.core.state_ops import OPS, apply_patch, apply_patches
from flowkernel.errors import NodeFailure

if TYPE_CHECKING:
    from flowkernel.core.compiler import CompiledFlow
    from flowkernel.core.expressions import Expr
    from flowkernel.core.node_context import ChildRuns
    from flowkernel.core.services import RunServices
    from flowkernel.plugins.registry import Registry
    from flowkernel.store.base import Store

T = TypeVar("T")


class Shell(Protocol):
    """What a node context needs from the shell that executes the run."""

    flow: CompiledFlow
    registry: Registry
    store: Store
    node_store: Store  # the store as node runs see it (``flowkernel.store.fenced``)

    def current_state(self) -> dict[str, Any]: ...

    def current_snapshot(self) -> RunSnapshot: ...

    def current_inbox(self, run_id: str) -> list[InboxMessage]: ...

    def submit(self, draft: BaseEvent) -> None: ...

    def submit_patch(self, draft: StatePatch, base: dict[str, Any], patched: dict[str, Any]) -> None: ...

    async def submit_durable(self, draft: BaseEvent) -> None: ...

    def pause_requested(self) -> bool: ...

    async def wait_for_pause(self) -> None: ...

    @property
    def stop_reason(self) -> str | None: ...

    @property
    def services(self) -> RunServices: ...

    def children_for(self, ctx: ShellNodeContext) -> ChildRuns: ...


class ShellNodeContext:
    """Everything a running node may see and do (``flowkernel.core.node_context.NodeContext``). One per node run."""

    def __init__(self, shell: Shell, *, node_id: str, run_id: str, flow_run_id: str, attempt: int,
                 input: Any, item: int | None, resumed_from: str | None) -> None:
        self._shell = shell
        self.node_id = node_id
        self.run_id = run_id
        self.flow_run_id = flow_run_id
        self.attempt = attempt
        self.input = input
        self.item = item
        self.resumed_from = resumed_from
        self._patches: list[tuple[str, str, Any]] = []  # this node run's own, staged until it finishes
        self._view: tuple[dict[str, Any], dict[str, Any]] | None = None  # (run state, it with our patches)
        self._cooperative: bool | None = None
        self._children: ChildRuns | None = None

    @property
    def flow(self) -> CompiledFlow:
        return self._shell.flow

    @property
    def registry(self) -> Registry:
        return self._shell.registry

    @property
    def store(self) -> Store:
        """The run's store; the agent rows a node adds through it are fenced by the run's lease."""
        return self._shell.node_store

    @property
    def services(self) -> RunServices:
        """What the run uses (``query_fn``, ``fixtures``, ``prices``, limits, ``extra``)."""
        return self._shell.services

    @property
    def children(self) -> ChildRuns:
        """Child runs of this node run (``flow.call``)."""
        if self._children is None:
            self._children = self._shell.children_for(self)
        return self._children

    @property
    def raw_input(self) -> dict[str, Any]:
        """The node's input as written in the flow file, bindings unresolved."""
        return self._shell.flow.nodes[self.node_id].raw_input

    def binding_context(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """What a ``{{ }}`` in this node would see now: the context and the ``$`` variables."""
        from flowkernel.core.scheduling import binding_context, item_variables

        snap = self._shell.current_snapshot()
        ctx = binding_context(snap)
        if self.item is not None and self.node_id in snap.forEach:
            edge = self.flow.edges[self.flow.for_each_into[self.node_id]]
            return item_variables(snap.forEach[self.node_id], self.item, edge.for_each_as, ctx)
        return ctx, {}

    @property
    def state(self) -> dict[str, Any]:
        """The run's state as this node run sees it (read-only: change it with ``patch_state``): the
        run's state now, with this node run's own patches applied. Other node runs see those patches
        once this one completes."""
        shared = self._shell.current_state()
        if not self._patches:
            return shared
        view = self._view
        if view is not None and view[0] is shared:
            return view[1]
        own = apply_patches(shared, self._patches)
        self._view = (shared, own)
        return own

    def emit(self, draft: BaseEvent) -> None:
        """Append an event for this node run; ordered, persisted with the next transition."""
        draft.nodeId = self.node_id
        draft.runId = self.run_id
        self._shell.submit(draft)

    async def emit_durable(self, draft: BaseEvent) -> None:
        """Append an event and wait until it is committed to the store."""
        draft.nodeId = self.node_id
        draft.runId = self.run_id
        await self._shell.submit_durable(draft)

    def patch_state(self, op: str, path: str, value: Any) -> dict[str, Any]:
        """Change the run's state (``set``, ``merge`` or ``append`` at a dotted path); returns the
        state as this node run now sees it.

        The patch is stored at once. For most node types it reaches the run's state when this node
        run completes (or waits): a node run that fails, is cancelled, or is cut short by a crash or a
        pause leaves the state as it was, so running it again changes the state once. A node type with
        ``cooperative_pause`` continues from its own progress after an interruption, so its patches
        apply at once.
        """
        if op not in OPS:
            raise NodeFailure(f"unknown state op {op!r}; use one of {', '.join(OPS)}", "state_error")
        try:  # here, in the node that asked, rather than later when the event is stored
            check_encoded(value, encoder.encode(value))
        except (TypeError, ValueError, RecursionError, msgspec.EncodeError) as exc:
            raise NodeFailure(f"state.{path}: the value is not JSON: {exc}", "state_error") from None
        shared = self._shell.current_state()
        patched = apply_patch(self.state, op, path, value)  # raises NodeFailure now, not at apply time
        draft = StatePatch(op=op, path=path, value=value, nodeId=self.node_id, runId=self.run_id)
        if self._continues_from_progress():
            self._shell.submit(draft)
            return patched
        draft.staged = True
        self._patches.append((op, path, value))
        self._view = (shared, patched)
        self._shell.submit_patch(draft, shared, patched)
        return patched

    def _continues_from_progress(self) -> bool:
        """A node type that pauses cooperatively stops at its own step boundaries and continues from
        the progress it stored (its patches are that progress): they apply at once. Every other node
        type runs again from the start after an interruption: its patches wait for it to complete."""
        if self._cooperative is None:
            node_type = self.registry.node_types.get(self.flow.nodes[self.node_id].type)
            self._cooperative = bool(getattr(node_type, "cooperative_pause", False))
        return self._cooperative

    def inbox(self) -> list[InboxMessage]:
        """Messages delivered to this node run and not yet consumed."""
        return list(self._shell.current_inbox(self.run_id))

    async def consume_inbox(self, count: int, step: int | None = None) -> None:
        """Mark the first ``count`` inbox messages as taken, durably, so none is delivered twice;
        ``step`` says where the node stored them (a node run that continues this one reads it back)."""
        if count > 0:
            await self.emit_durable(InboxConsumed(count=count, step=step))

    def pause_requested(self) -> bool:
        """True once the run is asked to pause: a node may finish its current step and return."""
        return self._shell.pause_requested()

    async def wait_for_pause(self) -> None:
        """Return when the run is asked to pause (for cooperative nodes that watch in a task)."""
        await self._shell.wait_for_pause()

    def raised_budget(self) -> float | None:
        """The limit ``resume --budget`` last set for this node (``flowkernel.core.budgets``), if any."""
        return self._shell.current_snapshot().costLimits.get(self.node_id)

    @property
    def stop_reason(self) -> str | None:
        """Why the run is stopping (``pause``, ``abort``, ``failed``), once it is; else None."""
        return self._shell.stop_reason

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread under the run's expression limits (see the Protocol)."""
        from flowkernel.core.expression_scope import EvaluationCancelled, Scope, limits_from_env
        from flowkernel.run.offload import CANCELLED, call_off_loop

        result = await call_off_loop(Scope(self.services.expression_limits or limits_from_env()), fn, *args)
        if result is CANCELLED:  # only the caller's cancellation cancels this scope, and that raised above
            raise EvaluationCancelled
        return result

    async def evaluate(self, expr: Expr, context: Any, variables: Any) -> Any:
        """Evaluate ``expr`` off the event loop, under the run's expression limits."""
        return await self.off_loop(expr.evaluate, context, variables)
