"""The Python API: load flows, start runs, follow their events, command and resume them.

The CLI is a thin layer over this module::

    kernel = Kernel("runs.db")
    flow = kernel.load_flow("flows/hello.json")
    snapshot = anyio.run(kernel.run, flow, {"name": "Ada"})

``Kernel`` is a facade: each method delegates to the module of ``flowkernel.run`` named for its job
(``flow_cache``, ``creation``, ``reads``, ``execution``, ``leases``, ``inbox``, ``control``), whose
method's docstring it shows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowkernel.core.inputs import check_input
from flowkernel.core.services import RunServices
from flowkernel.history.agent_runs import AgentRunBackfill
from flowkernel.plugins.registry import Registry, default_registry
from flowkernel.run.children import KernelChildren
from flowkernel.run.committer import Committer
from flowkernel.run.control import Accepted, Control
from flowkernel.run.creation import Creation, Enqueued
from flowkernel.run.execution import Executor
from flowkernel.run.flow_cache import FlowCache
from flowkernel.run.inbox import CommandInbox
from flowkernel.run.judged import Before, Judge
from flowkernel.run.leases import LEASE_TTL_MS, Leases, owner_dead
from flowkernel.run.loop import COMMAND_POLL_S, EventListener, RunExecution
from flowkernel.run.reads import ENDED, Reads
from flowkernel.run.settings import RunSettings
from flowkernel.run.setup import RunSetup, services_of
from flowkernel.run.tuning import Tuning
from flowkernel.store.base import AgentRun, Lease, RunRecord, Store
from flowkernel.store.open import open_store

if TYPE_CHECKING:
    from flowkernel.core.commands import Command, CommandOutcome
    from flowkernel.core.compiler import CompiledFlow
    from flowkernel.core.events import BaseEvent, Event
    from flowkernel.core.node_context import ChildRuns
    from flowkernel.core.reducer import FlowLookup
    from flowkernel.core.snapshot import RunSnapshot
    from flowkernel.errors import FlowkernelError
    from flowkernel.history.conversations import Page
    from flowkernel.history.summaries import RunSummary
    from flowkernel.run.node_context import ShellNodeContext

__all__ = ["ENDED", "LEASE_TTL_MS", "Kernel", "owner_dead"]


class Kernel:
    """One store, one registry, and the runs executing in this process."""

    def __init__(self, store: Store | str | None = None, *, registry: Registry | None = None,
                 services: RunServices | Mapping[str, Any] | None = None, lease_ttl_ms: int = LEASE_TTL_MS,
                 settings: RunSettings | None = None, tuning: Tuning | None = None) -> None:
        """``services``: what runs use (``RunServices``, or the documented mapping of it); ``tuning``: how
        the shell runs them. ``settings``: how this process was told to execute runs (``--fixtures``,
        ``--plugin``). Runs it creates keep them; runs it continues keep theirs, with these replacing what
        they set."""
        self.registry = registry or default_registry()
        # A database from before agent runs were stored gets them folded from its logs as it opens.
        self.store: Store = store if store is not None and not isinstance(store, str) else \
            open_store(store, backfill=AgentRunBackfill(self.registry))
        # Read (and checked) before any run is created: a bad FLOWKERNEL_EXPR_* is an input error.
        services, self.tuning = services_of(services, tuning)
        self.settings = settings or RunSettings()
        self.leases = Leases(self.store, lease_ttl_ms)
        self.flows = FlowCache(self.store, self.registry)
        self.setup = RunSetup(self.store, self.registry, self.flows, services, self.settings)
        self.committer = Committer(self.store)  # the runs executing here share transactions
        self.creation = Creation(self.store, self.flows, self.leases, self.committer, self.settings)
        self.inbox = CommandInbox(self.store)
        self.judge = Judge(self.store, self.flows, self.registry)
        self.reads = Reads(self.store, self.flows, self.leases, lambda run_id: self.executor.executing_here(run_id))
        self.executor = Executor(self.store, self.registry, self.tuning, flows=self.flows, setup=self.setup,
                                 creation=self.creation, reads=self.reads, leases=self.leases, inbox=self.inbox,
                                 committer=self.committer, judge=self.judge, children=_children(self),
                                 reply=self.reply)
        self.control = Control(self.executor)

    @property
    def services(self) -> RunServices:
        """What runs use (their query function, prices, limits, ...); may be replaced between runs."""
        return self.setup.services

    @services.setter
    def services(self, value: RunServices) -> None:
        self.setup.services = value

    @property
    def owner(self) -> str:
        """The id this process takes leases as (``host:pid:random``)."""
        return self.leases.owner

    @owner.setter
    def owner(self, value: str) -> None:
        self.leases.owner = value

    @property
    def lease_ttl_ms(self) -> int:
        """How long a lease this process takes lasts unless renewed."""
        return self.leases.ttl_ms

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the event loop, without arguments) after each commit of the runs this
        kernel executes: a server's event feed reads new events then, not at its next poll."""
        self.committer.on_commit.append(callback)

    # -- flows (flow_cache, setup) ------------------------------------------------------------------
    def load_flow(self, path: str | Path) -> CompiledFlow:
        return self.flows.load(path)
    def compile(self, document: dict[str, Any], source: str = "<flow>", base_dir: Path | None = None,
                *, trusted: bool = False, stored: tuple[str, str] | None = None) -> CompiledFlow:
        return self.flows.compile(document, source, base_dir, trusted=trusted, stored=stored)
    def flow_of(self, run_id: str) -> CompiledFlow:
        return self.flows.of_run(run_id)
    def message_takers(self, flow: CompiledFlow) -> Callable[[str], bool]:
        return self.flows.message_takers(flow)
    def stored_flow(self, flow_hash: str, record: RunRecord) -> CompiledFlow:
        return self.flows.stored(flow_hash, record)
    def flows_of(self, record: RunRecord) -> FlowLookup:
        return self.flows.lookup(record)
    def flow_for_run(self, run_id: str, source: str | Path | dict[str, Any]) -> CompiledFlow:
        return self.setup.flow_for_run(run_id, source)
    def load_plugins_of(self, run_id: str) -> None:
        self.setup.load_plugins_of(run_id)
    check_input = staticmethod(check_input)

    # -- creating runs (creation) -------------------------------------------------------------------
    def create_run(self, flow: CompiledFlow, input: Any = None, *, parent_run_id: str | None = None,
                   parent_node_run_id: str | None = None, run_id: str | None = None) -> str:
        return self.creation.create(flow, input, parent_run_id=parent_run_id,
                                    parent_node_run_id=parent_node_run_id, run_id=run_id).run_id
    def enqueue(self, flow: CompiledFlow, input: Any = None, *, run_id: str | None = None,
                idempotency_key: str | None = None, settings: RunSettings | None = None) -> str:
        return self.creation.enqueue(flow, input, run_id=run_id, idempotency_key=idempotency_key, settings=settings)
    def enqueue_once(self, flow: CompiledFlow, input: Any = None, idempotency_key: str | None = None) -> Enqueued:
        return self.creation.enqueue_once(flow, input, idempotency_key)

    # -- reading runs (reads: no lease, nothing executes) -------------------------------------------
    def snapshot(self, run_id: str, at: int | None = None) -> RunSnapshot:
        return self.reads.snapshot(run_id, at)
    def check_seq(self, run_id: str, at: int) -> None:
        self.reads.check_seq(run_id, at)
    def events(self, run_id: str, after: int = 0, until: int | None = None) -> list[Event]:
        return self.reads.events(run_id, after, until)
    def stored_events(self, run_id: str, until: int | None = None) -> list[bytes]:
        return self.reads.stored_events(run_id, until)
    def event_page(self, run_id: str, *, after: int = 0, types: frozenset[str] | None = None,
                   limit: int = 100) -> tuple[list[bytes], int | None]:
        return self.reads.event_page(run_id, after=after, types=types, limit=limit)
    def runs(self, status: str | None = None, parent: str | None = None, limit: int = 1000) -> list[RunRecord]:
        return self.reads.runs(status, parent, limit)
    def summary(self, run_id: str) -> RunSummary:
        return self.reads.summary(run_id)
    def detail(self, run_id: str, at: int | None = None) -> dict[str, Any]:
        return self.reads.detail(run_id, at)
    def run_page(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                 before: int | None = None, limit: int = 50, oldest: bool = False, id_prefix: str | None = None,
                 error: str | None = None) -> tuple[list[RunSummary], int | None]:
        return self.reads.run_page(status=status, flow=flow, parent=parent, before=before, limit=limit,
                                   oldest=oldest, id_prefix=id_prefix, error=error)
    def run_records(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                    before: int | None = None, limit: int = 50, oldest: bool = False,
                    id_prefix: str | None = None, error: str | None = None) -> tuple[list[RunRecord], int | None]:
        return self.reads.run_records(status=status, flow=flow, parent=parent, before=before, limit=limit,
                                      oldest=oldest, id_prefix=id_prefix, error=error)
    def count_runs(self, *, status: str | None = None, flow: str | None = None, parent: str | None = None,
                   before: int | None = None) -> int:
        return self.reads.count_runs(status=status, flow=flow, parent=parent, before=before)
    def messages(self, *, run_id: str | None = None, flow_run_id: str | None = None,
                 session_id: str | None = None, after: int = 0, limit: int = 100, node_id: str | None = None) -> Page:
        return self.reads.messages(run_id=run_id, flow_run_id=flow_run_id, session_id=session_id, after=after,
                                   limit=limit, node_id=node_id)
    def tool_calls(self, *, run_id: str | None = None, flow_run_id: str | None = None,
                   session_id: str | None = None, tool_name: str | None = None, status: str | None = None,
                   after: int = 0, limit: int = 100, node_id: str | None = None) -> Page:
        return self.reads.tool_calls(run_id=run_id, flow_run_id=flow_run_id, session_id=session_id,
                                     tool_name=tool_name, status=status, after=after, limit=limit, node_id=node_id)
    def agent_run_page(self, *, run_id: str | None = None, status: str | None = None, agent_id: str | None = None,
                       parent_run_id: str | None = None, before: int | None = None,
                       limit: int = 50) -> tuple[list[AgentRun], int | None]:
        return self.reads.agent_run_page(run_id=run_id, status=status, agent_id=agent_id,
                                         parent_run_id=parent_run_id, before=before, limit=limit)
    def agent_run(self, agent_run_id: str, run_id: str | None = None) -> AgentRun | None:
        return self.reads.agent_run(agent_run_id, run_id)
    def follow(self, run_id: str, after: int = 0, poll_s: float = COMMAND_POLL_S) -> AsyncIterator[Event]:
        return self.reads.follow(run_id, after, poll_s)
    def interrupted(self, record: RunRecord) -> bool:
        return self.reads.interrupted(record)
    def executed(self, record: RunRecord) -> bool:
        return self.reads.executed(record)

    # -- executing runs under leases (execution) ----------------------------------------------------
    async def run(self, flow: CompiledFlow, input: Any = None, *, on_event: EventListener | None = None,
                  run_id: str | None = None) -> RunSnapshot:
        return await self.executor.run(flow, input, on_event=on_event, run_id=run_id)
    async def execute(self, run_id: str, *, on_event: EventListener | None = None,
                      first: list[BaseEvent] | None = None, before: Before | None = None, lease: Lease | None = None,
                      on_execution: Callable[[RunExecution], None] | None = None) -> RunSnapshot:
        return await self.executor.execute(run_id, on_event=on_event, first=first, before=before, lease=lease,
                                           on_execution=on_execution)
    async def recover(self, run_id: str, lease: Lease, *, on_event: EventListener | None = None,
                      on_execution: Callable[[RunExecution], None] | None = None) -> RunSnapshot:
        return await self.executor.recover(run_id, lease, on_event=on_event, on_execution=on_execution)
    def fail_to_start(self, run_id: str, exc: Exception, lease: Lease) -> FlowkernelError:
        return self.executor.fail_to_start(run_id, exc, lease)
    def executing(self, run_id: str) -> RunExecution | None:
        return self.executor.executing(run_id)
    async def continue_run(self, run_id: str, *, on_event: EventListener | None = None) -> RunSnapshot:
        return await self.executor.continue_run(run_id, on_event=on_event)

    # -- commands (control) -------------------------------------------------------------------------
    async def command(self, run_id: str, cmd: Command, *, timeout_s: float = 10.0) -> CommandOutcome:
        return await self.control.command(run_id, cmd, timeout_s=timeout_s)
    async def accept(self, run_id: str, cmd: Command) -> Accepted:
        return await self.control.accept(run_id, cmd)
    async def deliver(self, run_id: str, cmd: Command, *, on_event: EventListener | None = None,
                      on_accepted: Callable[[CommandOutcome], None] | None = None,
                      ) -> tuple[CommandOutcome, RunSnapshot | None]:
        return await self.control.deliver(run_id, cmd, on_event=on_event, on_accepted=on_accepted)
    async def reply(self, run_id: str, node_run_id: str | None, content: Any, *,
                    on_event: EventListener | None = None) -> RunSnapshot:
        return await self.control.reply(run_id, node_run_id, content, on_event=on_event)
    async def send(self, run_id: str, node_run_id: str | None, message: Any, *,
                   on_event: EventListener | None = None) -> RunSnapshot:
        return await self.control.send(run_id, node_run_id, message, on_event=on_event)
    async def resume(self, run_id: str, message: str | None = "continue", *, on_event: EventListener | None = None,
                     queue: bool = False, budget: float | None = None, flow: CompiledFlow | None = None) -> RunSnapshot:
        return await self.control.resume(run_id, message, on_event=on_event, queue=queue, budget=budget, flow=flow)
    async def retry(self, run_id: str, *, message: str | None = None, on_event: EventListener | None = None,
                    queue: bool = False, flow: CompiledFlow | None = None) -> RunSnapshot:
        return await self.control.retry(run_id, message=message, on_event=on_event, queue=queue, flow=flow)
    async def continue_in_pool(self, run_id: str, kind: str, *, message: str | None = None,
                               budget: float | None = None,
                               flow: CompiledFlow | str | Path | dict[str, Any] | None = None) -> Accepted:
        return await self.control.continue_in_pool(run_id, kind, message=message, budget=budget, flow=flow)
    def hand_to_pool(self, run_id: str, before: Before) -> RunSnapshot:
        return self.control.hand_to_pool(run_id, before)
    def close(self) -> None:
        """Close the store."""
        self.store.close()


def _children(kernel: Kernel) -> Callable[[ShellNodeContext], ChildRuns]:
    """``ctx.children`` of each node run: the child runs of that node run, over ``kernel``."""
    return lambda ctx: KernelChildren(kernel, run_id=ctx.flow_run_id, node_id=ctx.node_id, node_run_id=ctx.run_id,
                                      item=ctx.item, resumed_from=ctx.resumed_from)


def _delegates() -> dict[str, Any]:
    """Each facade method's collaborator method: its docstring is the facade's (``help(Kernel.run)``)."""
    out: dict[str, Any] = {}
    for cls, names in (
            (FlowCache, {"load_flow": "load", "compile": "compile", "flow_of": "of_run", "message_takers": None,
                         "stored_flow": "stored", "flows_of": "lookup"}),
            (RunSetup, {"flow_for_run": None, "load_plugins_of": None}),
            (Creation, {"create_run": "create", "enqueue": None, "enqueue_once": None}),
            (Reads, {n: None for n in ("snapshot", "check_seq", "events", "stored_events", "event_page", "runs",
                                       "summary", "detail", "run_page", "run_records", "count_runs", "messages",
                                       "tool_calls", "agent_run_page", "agent_run", "follow", "interrupted",
                                       "executed")}),
            (Executor, {n: None for n in ("run", "execute", "recover", "fail_to_start", "executing",
                                          "continue_run")}),
            (Control, {n: None for n in ("command", "accept", "deliver", "reply", "send", "resume", "retry",
                                         "continue_in_pool", "hand_to_pool")})):
        out |= {name: getattr(cls, there or name) for name, there in names.items()}
    return out


for _name, _target in _delegates().items():
    getattr(Kernel, _name).__doc__ = _target.__doc__
