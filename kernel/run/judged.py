"""Judged continuations: what continues a stopped run (a resume, a retry, the ``flow:resumed`` after a
reply or send) judged against its snapshot as a command is, with the switch to a new flow checked and
stored first; and appending drafted events to a run at once, under its lease."""

from __future__ import annotations

from collections.abc import Callable

from flowkernel.core.budgets import run_limit
from flowkernel.core.commands import Command, CommandOutcome, judge_command
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import BaseEvent, FlowResumed, FlowUpdated
from flowkernel.core.inputs import check_input
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.errors import CommandRejectedError, FlowUpdateError, RunInputError
from flowkernel.plugins.registry import Registry
from flowkernel.run.append import append_now
from flowkernel.run.flow_cache import FlowCache
from flowkernel.store.base import Lease, Store

Before = Callable[[RunSnapshot], list[BaseEvent]]  # a run's first events after it is loaded (may raise Refused)


class Refused(Exception):
    """A ``before`` hook refused the command that would continue the run: record it, then raise."""

    def __init__(self, outcome: CommandOutcome) -> None:
        super().__init__(outcome.reason)
        self.outcome = outcome


def continue_stopped(snap: RunSnapshot) -> list[BaseEvent]:
    """What continues a run that nobody executes after a reply or send landed in it."""
    if snap.status in ("waiting", "running"):
        return [FlowResumed(message=None)]
    return []


def interrupted(snap: RunSnapshot) -> bool:
    """Node runs were in flight when the run's executor went away (they need a resume). A forEach
    group stays ``running`` across a ``flow:resumed``, which moved its items in flight to
    ``resumedFrom`` (they start again, with the resume's message, as the run goes on): only items still
    ``running`` were cut short. A run handed to the workers by a resume must not be resumed twice."""
    if snap.status != "running":
        return False
    for node_id, status in snap.nodeStatus.items():
        if status == "running":
            group = snap.forEach.get(node_id)
            if group is None or group.running:
                return True
    return False


def raise_if_refused(outcome: CommandOutcome) -> CommandOutcome:
    if not outcome.accepted:
        raise CommandRejectedError(outcome.reason or "command refused", invalid=outcome.invalid)
    return outcome


class Judge:
    """Judges continuations of runs and appends events to them, over ``store``."""

    def __init__(self, store: Store, flows: FlowCache, registry: Registry) -> None:
        self.store, self.flows, self.registry = store, flows, registry

    def judged(self, run_id: str, cmd: Command, then: Callable[[RunSnapshot], BaseEvent],
                update: CompiledFlow | None = None) -> Before:
        def before(snap: RunSnapshot) -> list[BaseEvent]:
            current = self.flows.stored(snap.flowHash, self.store.get_run(run_id))
            below = 0.0
            if cmd.kind in ("resume", "retry") and (run_limit(current, snap) is not None or cmd.budget is not None):
                totals = self.store.descendant_totals([run_id]).get(run_id)
                below = totals.totalCostUsd if totals is not None else 0.0
            outcome = judge_command(current, snap, cmd, executing=False, below=below,
                                    takes_messages=self.flows.message_takers(current))
            if not outcome.accepted:
                raise Refused(outcome)  # recorded by ``execute``, under the lease it holds
            if update is None or update.hash == current.hash:
                return [outcome.record, then(snap)]
            self.check_update(current, update, snap)
            # Stored before the event that names it, so that no reader folds a flow:updated it cannot follow.
            self.store.put_flow(update.hash, update.name, update.canonical)
            self.flows.remember(update)
            return [outcome.record, FlowUpdated(fromHash=current.hash, toHash=update.hash), then(snap)]
        return before

    def check_update(self, current: CompiledFlow, update: CompiledFlow, snap: RunSnapshot) -> None:
        """Raise FlowUpdateError, listing every problem, unless the run in ``snap`` can follow ``update``."""
        from flowkernel.core.flow_update import incompatibilities

        problems = incompatibilities(current, update, snap)
        try:
            check_input(update, snap.input)
        except RunInputError as exc:
            problems += [f"the run's {where} does not match the new flow's `inputs`: {message}"
                         for where, message in exc.problems]
        if problems:
            raise FlowUpdateError(snap.runId, update.source, problems)

    def resume_interrupted(self, run_id: str) -> Before:
        """``recover``'s first events: a resume when node runs were in flight as the executor went away."""
        resume = self.judged(run_id, Command(kind="resume", content="continue"),
                             lambda snap: FlowResumed(message="continue"))
        return lambda snap: resume(snap) if interrupted(snap) else []

    def append_now(self, snap: RunSnapshot, drafts: list[BaseEvent], lease: Lease, *,
                    release: bool = False) -> RunSnapshot:
        """Append ``drafts`` through the one append path (``run/append.py``) and commit them at once."""
        record = self.store.get_run(snap.runId)
        return append_now(self.store, snap, drafts, lease, flows=lambda h: self.flows.stored(h, record),
                          agent_types=self.registry, release=release)

