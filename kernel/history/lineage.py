"""Which earlier node runs a node run carries on, read from the run's log.

A node run that starts again after a crash, a pause, a reply, a ``retry`` or a failed attempt does
not start from nothing: it continues the node run it replaces (``node:start`` names it in
``resumedFrom``; a policy retry's attempt N continues attempt N-1). Following those links back to
the first node run of the pass gives the *lineage*: what a node type needs to pick up exactly where
the work stopped (an agent: which stored messages are already its own, whether its prompt is in).
"""

from __future__ import annotations

from dataclasses import dataclass

from flowkernel.core.events import AgentStart, FlowResumed, InboxConsumed, NodeError, NodeStart, decode
from flowkernel.core.node_context import NodeStore

# Events worth decoding: the rest of a long run's log (deltas, tool events) is skipped unread.
_WANTED = (b'"node:start"', b'"node:error"', b'"agent:start"', b'"inbox:consumed"', b'"flow:resumed"')


@dataclass(frozen=True, slots=True)
class Lineage:
    runs: tuple[str, ...]  # this node run first, then each one it continues, back to the pass's first
    resumed: tuple[str, ...]  # the same, but only as far as ``resumedFrom`` links go (no earlier attempts)
    sessions: dict[str, str]  # node run id -> the session of its ``agent:start``
    failed: frozenset[str]  # those of ``runs`` that ended with ``node:error``
    consumed_steps: frozenset[int]  # ``inbox:consumed`` steps of ``runs`` (agents' turn boundaries)
    restart_seq: int  # the last ``flow:resumed`` before this node run started (0 if none)

    @property
    def previous(self) -> str | None:
        """The node run this one directly continues."""
        return self.runs[1] if len(self.runs) > 1 else None

    def session(self) -> str | None:
        """The session the node runs this one resumed worked in (the newest that started one)."""
        for run_id in self.resumed[1:]:
            if run_id in self.sessions:
                return self.sessions[run_id]
        return None


def find_lineage(store: NodeStore, flow_run_id: str, node_id: str, item: int | None, run_id: str) -> Lineage:
    """The lineage of node run ``run_id`` (of ``node_id``, forEach ``item``) in run ``flow_run_id``."""
    starts: list[NodeStart] = []
    sessions: dict[str, str] = {}
    errors: set[str] = set()
    consumed: dict[str, set[int]] = {}
    resumed_at = 0
    restart_seq = 0
    for body in store.read_events(flow_run_id):
        if not any(t in body for t in _WANTED):
            continue
        ev = decode(body)
        if isinstance(ev, FlowResumed):
            resumed_at = ev.seq
        elif ev.nodeId != node_id:
            continue
        elif isinstance(ev, NodeStart):
            if ev.item == item:
                starts.append(ev)
                if ev.runId == run_id:
                    restart_seq = resumed_at
        elif isinstance(ev, AgentStart) and ev.runId:
            sessions[ev.runId] = ev.sessionId
        elif isinstance(ev, NodeError) and ev.runId:
            errors.add(ev.runId)
        elif isinstance(ev, InboxConsumed) and ev.runId and ev.step is not None:
            consumed.setdefault(ev.runId, set()).add(ev.step)
    position = {s.runId: i for i, s in enumerate(starts) if s.runId}
    runs: list[str] = [run_id]
    resumed: list[str] = [run_id]
    links_resumed = True
    at = position.get(run_id)
    while at is not None:
        start = starts[at]
        if start.resumedFrom is not None:
            parent = start.resumedFrom
            at = position.get(parent)
        elif start.attempt > 1 and at > 0:
            links_resumed = False
            at -= 1
            parent = starts[at].runId or ""
        else:
            break
        if parent in runs:
            break
        runs.append(parent)
        if links_resumed:
            resumed.append(parent)
    mine = set(runs)
    return Lineage(runs=tuple(runs), resumed=tuple(resumed),
                   sessions={r: s for r, s in sessions.items() if r in mine},
                   failed=frozenset(errors & mine),
                   consumed_steps=frozenset(step for r in runs for step in consumed.get(r, ())),
                   restart_seq=restart_seq)
