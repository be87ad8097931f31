"""What a decided event's ``cause`` is: the last event of each decision kind, per node and edge.

The scheduling rules draft events without a ``cause``; the run shell asks ``Causes`` for one before it
appends each draft. ``Causes`` follows the applied events (``applied``, as ``Progress.follow`` does),
so the ``cause`` of a draft depends only on the events before it in the log, never on when node runs
happened to report.
"""

from __future__ import annotations

from typing import Any

from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import (
    BaseEvent,
    EdgeFire,
    EdgeSkip,
    LoopIterate,
    NodeComplete,
    NodeError,
    NodeSkipped,
)


class Causes:
    """The last event of each decision kind, per node and edge: what a drafted event's ``cause`` is."""

    __slots__ = ("_decided_at", "_finished_at", "_flow", "_reset_at")

    def __init__(self, flow: CompiledFlow) -> None:
        self._flow = flow
        self._finished_at: dict[str, int] = {}  # node -> seq of its last finish (a forEach item's excepted)
        self._decided_at: dict[str, int] = {}  # edge -> seq of its last decision (fired or skipped)
        self._reset_at: dict[str, int] = {}  # node -> seq of the loop:iterate that last reset it

    def applied(self, event: BaseEvent, touched: Any = None) -> None:
        """Follow an event applied to the run (``touched`` is the reducer's, unused here)."""
        cls = type(event)
        if cls is NodeComplete or cls is NodeSkipped or cls is NodeError:
            if cls is NodeError and event.willRetry:  # type: ignore[attr-defined]
                return  # another attempt follows: the node has not finished
            if getattr(event, "item", None) is None:
                self._finished_at[event.nodeId or ""] = event.seq
        elif cls is EdgeFire or cls is EdgeSkip:
            self._decided_at[event.edgeId] = event.seq  # type: ignore[attr-defined]
        elif cls is LoopIterate:
            for n in self._flow.reset_sets[event.edgeId]:  # type: ignore[attr-defined]
                self._reset_at[n] = event.seq

    def cause_of(self, draft: BaseEvent, seq: int) -> int:
        """The event that made the rules decide ``draft``, appended after event ``seq``: an edge
        decision is caused by its source finishing; a start or skip by the last decision on the node's
        incoming edges (or the loop iteration that reset it); anything else by event ``seq``."""
        edge = getattr(draft, "edgeId", None)
        if edge is not None:
            return self._finished_at.get(self._flow.edges[edge].source, seq)
        node = draft.nodeId
        if node is not None and node in self._flow.nodes:
            seqs = [self._decided_at[e] for e in self._flow.incoming[node] if e in self._decided_at]
            if node in self._reset_at:
                seqs.append(self._reset_at[node])
            if getattr(draft, "item", None) is None and seqs:
                return max(seqs)
        return seq
