"""The ``cause`` of a decided event is computed by deterministic code from the log before it.

``flowkernel.core.causes.Causes`` follows the applied events; the run shell asks it for the ``cause``
of each draft of the scheduling rules. Over the random flows of ``tests/test_properties.py``: every
``cause`` names an earlier event of a kind that can cause it, and folding ``Causes`` over the stored
log gives back the ``cause`` the live run recorded (whatever order node runs reported in).
"""

from __future__ import annotations

from flowkernel.core.causes import Causes
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import (
    BaseEvent,
    EdgeFire,
    EdgeSkip,
    FlowResumed,
    LoopExhausted,
    LoopIterate,
    NodeComplete,
    NodeError,
    NodeSkipped,
    NodeStart,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_properties import Case, _compile, _execute, cases

_EDGE_DECISIONS = (EdgeFire, EdgeSkip, LoopIterate, LoopExhausted)
_NODE_ENDS = (NodeComplete, NodeError, NodeSkipped)


def _allowed_cause(flow: CompiledFlow, event: BaseEvent, by_seq: dict[int, BaseEvent]) -> bool:
    """Whether ``event``'s ``cause`` names an event that can have made the rules decide it."""
    cause = event.cause
    assert cause is not None
    if cause == event.seq - 1:
        return True  # what was applied last (the step's seq): always a possible cause
    caused_by = by_seq[cause]
    if isinstance(event, _EDGE_DECISIONS):
        source = flow.edges[event.edgeId].source
        return isinstance(caused_by, _NODE_ENDS) and caused_by.nodeId == source
    node = event.nodeId or ""
    if isinstance(caused_by, (EdgeFire, EdgeSkip)):
        return caused_by.edgeId in flow.incoming[node]
    if isinstance(caused_by, LoopIterate):
        return node in flow.reset_sets[caused_by.edgeId]
    return isinstance(caused_by, FlowResumed)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(cases())
def test_every_recorded_cause_is_earlier_allowed_and_what_causes_folded_over_the_log_gives(case: Case) -> None:
    outcome = _execute(case)
    by_seq = {ev.seq: ev for ev in outcome.events}
    causes = Causes(outcome.flow)
    with_cause = 0
    for ev in outcome.events:
        if ev.cause is not None:
            with_cause += 1
            assert 0 < ev.cause < ev.seq, f"event {ev.seq} ({ev.type}) names a cause that is not before it"
            assert _allowed_cause(outcome.flow, ev, by_seq), f"event {ev.seq} ({ev.type}): cause {ev.cause}"
            assert causes.cause_of(ev, ev.seq - 1) == ev.cause, f"event {ev.seq} ({ev.type})"
        causes.applied(ev)
    assert with_cause or len(outcome.events) <= 2


def _chain() -> CompiledFlow:
    return _compile(["a", "b", "c"], [{"from": "a", "to": "b"}, {"from": "b", "to": "c"},
                                       {"from": "b", "to": "a", "maxIterations": 2}])


_EVENT_KINDS = st.sampled_from(["complete", "error", "retry", "skip", "fire", "edge-skip", "iterate", "item"])


def _model_cause(flow: CompiledFlow, prefix: list[BaseEvent], draft: BaseEvent, seq: int) -> int:
    """The rule for ``cause``, read from the log's prefix by a backwards scan (independent of ``Causes``)."""
    edge = getattr(draft, "edgeId", None)
    if edge is not None:
        source = flow.edges[edge].source
        for ev in reversed(prefix):
            if isinstance(ev, _NODE_ENDS) and ev.nodeId == source and ev.item is None \
                    and not (isinstance(ev, NodeError) and ev.willRetry):
                return ev.seq
        return seq
    node = draft.nodeId or ""
    if getattr(draft, "item", None) is not None:
        return seq
    for ev in reversed(prefix):
        if isinstance(ev, (EdgeFire, EdgeSkip)) and ev.edgeId in flow.incoming[node]:
            return ev.seq
        if isinstance(ev, LoopIterate) and node in flow.reset_sets[ev.edgeId]:
            return ev.seq
    return seq


_EVENT_KINDS = st.sampled_from(["complete", "error", "retry", "skip", "fire", "edge-skip", "iterate", "item"])


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.lists(st.tuples(_EVENT_KINDS, st.sampled_from(["a", "b", "c"]), st.booleans(), st.integers(0, 2)),
                max_size=30))
def test_causes_agrees_with_the_rule_read_back_from_the_log_after_every_event(
        steps: list[tuple[str, str, bool, int]]) -> None:
    flow = _chain()
    edges = list(flow.edges)
    loop = next(e for e in edges if flow.edges[e].is_loop)
    drafts: list[BaseEvent] = [NodeStart(nodeId=n) for n in ("a", "b", "c")]
    drafts += [EdgeFire(edgeId=e, from_=flow.edges[e].source, to=flow.edges[e].target) for e in edges]
    drafts += [LoopIterate(edgeId=loop, iteration=1), NodeStart(nodeId="b", item=0)]
    causes = Causes(flow)
    log: list[BaseEvent] = []
    for seq, (kind, node, flag, which) in enumerate(steps, start=2):
        edge = edges[which % len(edges)]
        ev: BaseEvent
        if kind == "complete":
            ev = NodeComplete(nodeId=node, runId="r", item=0 if flag else None)
        elif kind in ("error", "retry"):
            ev = NodeError(nodeId=node, runId="r", errorType="x", message="m", willRetry=kind == "retry")
        elif kind == "skip":
            ev = NodeSkipped(nodeId=node, reason="gate", item=1 if flag else None)
        elif kind in ("fire", "edge-skip"):
            cls = EdgeFire if kind == "fire" else EdgeSkip
            ev = cls(edgeId=edge, from_=flow.edges[edge].source, to=flow.edges[edge].target)
        elif kind == "iterate":
            ev = LoopIterate(edgeId=loop, iteration=1)
        else:
            ev = NodeStart(nodeId=node, runId="r", item=1)
        ev.seq = seq
        causes.applied(ev)
        log.append(ev)
        for draft in drafts:
            assert causes.cause_of(draft, seq) == _model_cause(flow, log, draft, seq), (draft, log)
