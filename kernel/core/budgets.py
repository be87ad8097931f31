"""Budgets (DESIGN §12): when what a run spent reaches a limit, it pauses and asks instead of failing.

Pure rules over the flow and the snapshot. The run shell asks ``over_budget`` after each model call
(an ``agent:usage`` event) and after a node finishes (a child run may have spent), and appends the
``flow:paused {reason: "budget"}`` it returns; a cooperative node (the Claude agent) then stops at
its next turn boundary. The limits in force are a fold of the log: the flow's, then those
``resume --budget`` recorded in ``flow:resumed`` (``RunSnapshot.costLimits``).

The run's cost includes its child runs (``below``: what the shell read of their totals from the
store); a node's cost is what its own model calls cost in this run, across its node runs (retries,
loop passes, resumes), so resuming never resets what a node may spend.
"""

from __future__ import annotations

import math

from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import FlowPaused
from flowkernel.core.snapshot import BudgetPause, RunSnapshot
from msgspec.structs import replace

RUN_BUDGET = "flow"  # the key of the run's own limit in ``costLimits`` (no node may be called ``flow``)
BUDGET = "budget"  # flow:paused's reason


def run_limit(flow: CompiledFlow, snap: RunSnapshot) -> float | None:
    """The run's limit in USD, child runs included (None: none)."""
    return snap.costLimits.get(RUN_BUDGET, flow.max_cost_usd)


def node_limit(flow: CompiledFlow, snap: RunSnapshot, node_id: str) -> float | None:
    node = flow.nodes.get(node_id)
    return snap.costLimits.get(node_id, node.policy.maxCostUsd if node is not None else None)


def has_budgets(flow: CompiledFlow) -> bool:
    return flow.max_cost_usd is not None or any(n.policy.maxCostUsd is not None for n in flow.nodes.values())


def usd(value: float) -> float:
    """Money as events carry it: summed floats rounded off their last bits (0.1 + 0.2 is 0.3 here)."""
    return round(value, 10)


def over_budget(flow: CompiledFlow, snap: RunSnapshot, *, node_id: str | None = None,
                below: float = 0.0) -> FlowPaused | None:
    """The pause for the first limit reached, or None: ``node_id``'s own (when given), then the run's.
    ``below``: what the run's child runs cost."""
    if node_id is not None:
        limit = node_limit(flow, snap, node_id)
        cost = usd(snap.nodeCostUsd.get(node_id, 0.0))
        if limit is not None and cost >= limit:
            return FlowPaused(reason=BUDGET, nodeId=node_id, costUsd=cost, limitUsd=limit)
    limit = run_limit(flow, snap)
    cost = usd(snap.totalCostUsd + below)
    if limit is not None and cost >= limit:
        return FlowPaused(reason=BUDGET, costUsd=cost, limitUsd=limit)
    return None


def budget_key(snap: RunSnapshot) -> str:
    """Which limit ``resume --budget`` sets: that of the node that paused the run, else the run's."""
    paused = snap.budgetPause
    return paused.nodeId if paused is not None and paused.nodeId else RUN_BUDGET


def resume_problem(flow: CompiledFlow, snap: RunSnapshot, budget: float | None, *, below: float = 0.0) -> str | None:
    """Why resuming ``snap`` (with ``budget`` as the new limit, if given) would pause again at once, or None."""
    paused = snap.budgetPause
    if paused is not None and (budget is None or budget <= paused.costUsd):
        # Whatever reached the limit (a child run's own budget, too) has spent this much: ask for more.
        return _spent(f"node {paused.nodeId}" if paused.nodeId else f"run {snap.runId}", paused.costUsd,
                      paused.limitUsd if budget is None else budget)
    limits = dict(snap.costLimits)
    if budget is not None:
        limits[budget_key(snap)] = budget
    raised = replace(snap, costLimits=limits)
    first = snap.budgetPause.nodeId if snap.budgetPause is not None else None
    nodes = [n for n in flow.nodes if n != first and n in snap.nodeCostUsd]
    for node_id in [first, *nodes, None] if first else [*nodes, None]:
        over = over_budget(flow, raised, node_id=node_id, below=below)
        if over is not None:
            return _spent(f"node {over.nodeId}" if over.nodeId else f"run {snap.runId}", over.costUsd or 0.0,
                          over.limitUsd or 0.0)
    return None


def _spent(whose: str, spent: float, limit: float) -> str:
    return (f"{whose} has spent {money(spent)} of its {money(limit)} budget; resume with a higher "
            f"limit: --budget {money(suggested_budget(spent, limit), sign=False)}")


def pause_hint(run_id: str, paused: BudgetPause) -> tuple[str, str]:
    """What a budget pause is, in words (``run R has spent $0.6 of its $0.5 budget``), and the
    ``resume`` command that raises the limit (without a store option)."""
    whose = f"node {paused.nodeId} of run {run_id}" if paused.nodeId else f"run {run_id}"
    more = money(suggested_budget(paused.costUsd, paused.limitUsd), sign=False)
    return (f"{whose} has spent {money(paused.costUsd)} of its {money(paused.limitUsd)} budget",
            f"flowkernel resume {run_id} --budget {more}")


def suggested_budget(cost: float, limit: float) -> float:
    """A new limit to offer in a hint: double the old one, or more when that is spent already (whole cents)."""
    target = 2 * limit if 2 * limit > cost else cost + limit
    return math.ceil(round(target * 100, 6)) / 100


def money(value: float, *, sign: bool = True) -> str:
    """``$5``, ``$0.07``, ``$12.5``: cents where there are any, no trailing zeros."""
    text = f"{value:.2f}".rstrip("0").rstrip(".") if value >= 0.01 or value == 0 else f"{value:.6f}".rstrip("0")
    return f"${text}" if sign else text
