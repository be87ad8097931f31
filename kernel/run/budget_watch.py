"""When a run's spending reaches its budget (flowkernel.core.budgets), as its events come in.

Looked at after each model call (``agent:usage``) and, when child runs count toward the run's limit,
after each node run; while a child run executes, its model calls are in its own log, so what the
run's children have spent is also looked at every ``Tuning.budget_poll_s``.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
from flowkernel.core.budgets import has_budgets, over_budget, run_limit
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import AgentUsage, BaseEvent, FlowPaused, NodeComplete, NodeError
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.store.base import Store

_NODE_ENDS = frozenset({NodeComplete, NodeError})  # a child run may have spent: look at the run's budget


class BudgetWatch:
    """Whether a run is over its budget: the pause it takes when it is."""

    def __init__(self, flow: CompiledFlow, store: Store, poll_s: float) -> None:
        self._flow = flow
        self._store = store
        self._poll_s = poll_s
        # Budgets are checked after each model call and, when child runs count, after each node run.
        self._budgets = has_budgets(flow)
        self._calls = {n for n, node in flow.nodes.items() if node.type == "flow.call"}

    def concerns(self, event: BaseEvent) -> bool:
        """Whether the run's spending may have changed with ``event``."""
        return self._budgets and (type(event) is AgentUsage or (bool(self._calls) and type(event) in _NODE_ENDS))

    def over(self, snap: RunSnapshot, node_id: str | None) -> FlowPaused | None:
        """The pause the run takes when what was spent reached a limit: after a model call of
        ``node_id``, or after a node run finished (a child run may have spent)."""
        below = 0.0
        if self._calls and run_limit(self._flow, snap) is not None:
            totals = self._store.descendant_totals([snap.runId]).get(snap.runId)
            below = totals.totalCostUsd if totals is not None else 0.0
        return over_budget(self._flow, snap, node_id=node_id, below=below)

    def watches_children(self, snap: RunSnapshot) -> bool:
        return bool(self._calls) and run_limit(self._flow, snap) is not None

    async def watch_children(self, current: Callable[[], RunSnapshot], check: Callable[[], None]) -> None:
        """While a child run executes, its model calls are in its own log: ``check`` what the run's
        children have spent every ``budget_poll_s`` (default 1 s), so that the run pauses (and its
        children with it, at their next turn boundary) soon after they spend its budget, not only
        when a child finishes."""
        while True:
            await anyio.sleep(self._poll_s)
            snap = current()
            if snap.status == "running" and any(snap.nodeStatus.get(n) == "running" for n in self._calls):
                check()
