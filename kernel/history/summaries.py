"""Run summaries (DESIGN §10 ``RunSummary``): what lists of runs show, cost included.

A run's own usage and cost are a fold of its ``agent:usage`` events, kept on its row by the commits
that change them; a summary adds those of every descendant run (sub-flows), read from their rows
in one query per page, so listing runs never reads an event.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from flowkernel.core.events import USAGE_KEYS
from flowkernel.store.base import RunRecord, RunTotals, Store

FINISHED = frozenset({"completed", "failed", "aborted"})


class Usage(msgspec.Struct, kw_only=True):
    """Tokens of the model calls of a run (children included) or of an agent run."""

    inputTokens: int = 0
    outputTokens: int = 0
    cacheCreationInputTokens: int = 0
    cacheReadInputTokens: int = 0

    @staticmethod
    def of(values: dict[str, int]) -> Usage:
        return Usage(**{k: int(values.get(k, 0)) for k in USAGE_KEYS})


class RunSummary(msgspec.Struct, kw_only=True):
    runId: str
    flowName: str
    status: str
    parentRunId: str | None
    createdAt: int
    updatedAt: int
    completedAt: int | None
    durationMs: int | None
    totalCostUsd: float
    usage: Usage
    error: str | None


def summary(record: RunRecord, descendants: RunTotals | None = None, *, interrupted: bool = False) -> RunSummary:
    """The summary of ``record``, with its descendants' totals added when given. ``interrupted``: the
    run is ``running`` but no process executes it (its executor was killed); it shows as ``interrupted``."""
    usage = {k: record.usage.get(k, 0) for k in USAGE_KEYS}
    cost = record.totalCostUsd
    if descendants is not None:
        for k in USAGE_KEYS:
            usage[k] += descendants.usage.get(k, 0)
        cost += descendants.totalCostUsd
    # A finished run's last event is its flow:complete: ``updatedAt`` is when it finished.
    completed = record.updatedAt if record.status in FINISHED else None
    return RunSummary(runId=record.runId, flowName=record.flowName,
                      status="interrupted" if interrupted and record.status == "running" else record.status,
                      parentRunId=record.parentRunId, createdAt=record.createdAt, updatedAt=record.updatedAt,
                      completedAt=completed, durationMs=None if completed is None else completed - record.createdAt,
                      totalCostUsd=round(cost, 10), usage=Usage.of(usage), error=record.error)


# Fields of the run row that a summary leaves out but a run's detail shows (``show --json``, the API).
# ``pooled``: the workers execute the run, so the API's resume and retry can hand it back to them.
_DETAIL = ("seq", "flowHash", "input", "parentNodeRunId", "forkedFrom", "forkedAt", "idempotencyKey", "settings",
           "pooled")


def detail_view(record: RunRecord, run: RunSummary) -> dict[str, Any]:
    """``run`` as ``show --json`` and ``GET /api/v1/runs/{id}`` print it: the summary and the row's details."""
    out: dict[str, Any] = msgspec.to_builtins(run)
    for name in _DETAIL:
        out[name] = getattr(record, name)
    out["rerunOf"] = (record.settings or {}).get("rerunOf")  # a rerun: the run whose recording it replays
    return out


def summaries(store: Store, records: Sequence[RunRecord],
              interrupted: Callable[[RunRecord], bool] | None = None) -> list[RunSummary]:
    """Summaries of ``records``, each with its descendants' usage and cost added (one query); runs for
    which ``interrupted`` says so show as ``interrupted``."""
    below = store.descendant_totals([r.runId for r in records])
    return [summary(r, below.get(r.runId), interrupted=interrupted is not None and interrupted(r)) for r in records]
