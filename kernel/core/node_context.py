"""What a node type sees of its run: the ``NodeContext`` Protocol (one per node run), the store as a
node run sees it (``NodeStore``) and the child runs it may start (``ChildRuns``). The run shell implements them (``flowkernel.run.node_context``); a node
type imports them from here, and so never depends on the shell that runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from pathlib import Path

    from flowkernel.core.commands import Command
    from flowkernel.core.compiler import CompiledFlow
    from flowkernel.core.events import BaseEvent
    from flowkernel.core.expressions import Expr
    from flowkernel.core.names import Registered
    from flowkernel.core.services import RunServices
    from flowkernel.core.snapshot import InboxMessage, RunSnapshot

T = TypeVar("T")


class NodeStore(Protocol):
    """The store as a node run sees it: the run's log, and the agent conversation rows it adds (written
    only while the execution that runs it holds the run's lease)."""

    def read_events(self, run_id: str, after: int = 0, until: int | None = None) -> list[bytes]: ...

    def add_agent_message(self, row: dict[str, Any]) -> int: ...

    def list_agent_messages(self, *, run_id: str | None = None, session_id: str | None = None,
                            flow_run_id: str | None = None, after: int = 0, limit: int = 100,
                            node_id: str | None = None) -> list[dict[str, Any]]: ...

    def add_tool_call(self, row: dict[str, Any]) -> int: ...

    def list_tool_calls(self, *, run_id: str | None = None, session_id: str | None = None,
                        flow_run_id: str | None = None, tool_name: str | None = None, status: str | None = None,
                        after: int = 0, limit: int = 100, node_id: str | None = None) -> list[dict[str, Any]]: ...


class NodeContext(Protocol):
    """Everything a running node may see and do. One per node run.

    ``node_id``, ``run_id`` (the node run, ``nr_…``), ``flow_run_id`` (the run), ``attempt`` (1 for the
    first), ``input`` (resolved), ``item`` (a forEach item's index, else None) and ``resumed_from`` (the
    node run this one continues after an interruption, else None) say which node run this is.
    """

    node_id: str
    run_id: str
    flow_run_id: str
    attempt: int
    input: Any
    item: int | None
    resumed_from: str | None

    @property
    def flow(self) -> CompiledFlow:
        """The compiled flow the run follows."""
        ...

    @property
    def registry(self) -> Registered:
        """The node types, functions and tools the run may use."""
        ...

    @property
    def store(self) -> NodeStore:
        """The run's store; the agent rows a node adds through it are fenced by the run's lease."""
        ...

    @property
    def services(self) -> RunServices:
        """What the run uses from the process that executes it: ``query_fn``, ``fixtures``, ``prices``,
        expression and node limits, and what the embedding program added (``extra``)."""
        ...

    @property
    def children(self) -> ChildRuns:
        """Child runs of this node run (``flow.call``)."""
        ...

    @property
    def raw_input(self) -> dict[str, Any]:
        """The node's input as written in the flow file, bindings unresolved."""
        ...

    def binding_context(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """What a ``{{ }}`` in this node would see now: the context and the ``$`` variables."""
        ...

    @property
    def state(self) -> dict[str, Any]:
        """The run's state as this node run sees it (read-only: change it with ``patch_state``)."""
        ...

    def emit(self, draft: BaseEvent) -> None:
        """Append an event for this node run; ordered, persisted with the next transition."""
        ...

    async def emit_durable(self, draft: BaseEvent) -> None:
        """Append an event and wait until it is committed to the store."""
        ...

    def patch_state(self, op: str, path: str, value: Any) -> dict[str, Any]:
        """Change the run's state (``set``, ``merge`` or ``append`` at a dotted path); returns the state as
        this node run now sees it."""
        ...

    def inbox(self) -> list[InboxMessage]:
        """Messages delivered to this node run and not yet consumed."""
        ...

    async def consume_inbox(self, count: int, step: int | None = None) -> None:
        """Mark the first ``count`` inbox messages as taken, durably, so none is delivered twice."""
        ...

    def pause_requested(self) -> bool:
        """True once the run is asked to pause: a node may finish its current step and return."""
        ...

    async def wait_for_pause(self) -> None:
        """Return when the run is asked to pause (for cooperative nodes that watch in a task)."""
        ...

    def raised_budget(self) -> float | None:
        """The limit ``resume --budget`` last set for this node, if any."""
        ...

    @property
    def stop_reason(self) -> str | None:
        """Why the run is stopping (``pause``, ``abort``, ``failed``), once it is; else None."""
        ...

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread under the run's expression limits, so the event loop goes on
        meanwhile: for what may take long (an open expression, a JSON Schema's patterns). The node's
        timeout, a pause and an abort stop it at its next evaluation step; raises
        ``EvaluationCancelled`` when it was stopped from outside."""
        ...

    async def evaluate(self, expr: Expr, context: Any, variables: Any) -> Any:
        """Evaluate ``expr`` over ``context`` and ``variables`` off the event loop (``off_loop``)."""
        ...


class ChildRuns(Protocol):
    """What a node run may do with child runs of its run (``flow.call``), and nothing else of the Kernel:
    load a child flow, start a child run, find the one an earlier node run of this pass started, drive
    it until it stops, and command it."""

    def ancestry(self) -> list[str]:
        """The flow names of this run and of the runs above it, this run's first."""
        ...

    def load(self, path: Path) -> CompiledFlow:
        """Read and validate a child flow file with the names this run's registry knows."""
        ...

    def adopt(self) -> str | None:
        """The child run an earlier node run of this pass started (before a pause or a crash), if any."""
        ...

    def create(self, flow: CompiledFlow, input: Any) -> str:
        """Store a new child run of ``flow`` for this node run (``parentRunId``, ``parentNodeRunId``)."""
        ...

    async def drive(self, child_id: str, *, adopted: bool, resume_message: str | None,
                    raised_budget: float | None) -> RunSnapshot:
        """Execute the child run until it stops and return its snapshot: a paused child is resumed (with
        ``resume_message``, and ``raised_budget`` when it paused for a budget below it), a failed one
        retried, an adopted one still ``running`` resumed, a waiting one continued once a reply is in
        its inbox; a stopped one is only read. A child that another process executes is not taken."""
        ...

    async def command(self, child_id: str, command: Command) -> None:
        """Deliver a command to the child run (a pause or an abort cascading to it); raises
        ``CommandRejectedError`` when it is refused (the child stopped already)."""
        ...

    def snapshot(self, child_id: str) -> RunSnapshot:
        """The child run's snapshot now."""
        ...
