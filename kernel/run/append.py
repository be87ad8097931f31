"""The one way an event joins a run's log: stamp, encode (packing a large payload), apply, fold.

``Appender`` is used by the run loop for every event of an execution, and by ``append_now`` for the
events the Kernel appends and commits at once under a lease (a command judged while no execution
holds the run, a flow switch before a resume, a failure to start, a hand-over). A run's first event,
its ``flow:start``, has no snapshot to join yet: ``Appender.start`` stamps and encodes it and makes
the snapshot it starts (run creation, a queued run a worker starts, a fork's first event).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgspec
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import (
    BaseEvent,
    EdgeFire,
    EdgeSkip,
    FlowComplete,
    FlowStart,
    FlowUpdated,
    FlowWaiting,
    LoopExhausted,
    LoopIterate,
    NodeComplete,
    NodeError,
    NodeSkipped,
    NodeStart,
    NodeWaiting,
    StatePatch,
    decode,
    encoder,
)
from flowkernel.core.nonfinite import check_encoded, refuse_non_finite
from flowkernel.core.reducer import apply, initial_snapshot, own
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.errors import NodeFailure
from flowkernel.history.agent_runs import FOLDED, AgentRunFold, AgentTypes
from flowkernel.redaction import holds_secret, redact_bytes
from flowkernel.store.base import AgentRun, EventRow, Lease, Store
from flowkernel.store.checkpoint import encode_checkpoint
from flowkernel.store.packing import LEAF, PACKED_PREFIX, Packer
from msgspec.structs import replace

log = logging.getLogger("flowkernel.run")

# The nodes an applied event may have made ready: ``reducer.ALL`` for every node.
Touched = frozenset[str]


class View(msgspec.Struct):
    """The state a node run sees after its patches (``patched``), computed from the run's ``base``."""

    base: dict[str, Any]
    patched: dict[str, Any]
    count: int  # patches it has submitted
    exact: bool  # every one was applied as submitted (no JSON normalisation changed it)


class Started(NamedTuple):
    """A run's ``flow:start`` as stored: the event (read back as the run reads it), its row, and the
    snapshot it starts."""

    event: FlowStart
    row: EventRow
    snapshot: RunSnapshot


class Appender:
    """The one way an event joins a run's log: stamp, encode (packing a large payload), apply, fold.

    Owns its snapshot (applied in place) and the rows appended since the last ``take``.
    """

    __slots__ = ("_agents", "_flows", "applied", "flow", "packer", "rows", "snap", "views")

    def __init__(self, flow: CompiledFlow, snapshot: RunSnapshot, *, agents: AgentRunFold | None,
                 packer: Packer | None = None, flows: Callable[[str], CompiledFlow] | None = None) -> None:
        self.flow = flow
        self.snap = own(snapshot)  # applied in place from here on: nobody else holds its maps
        self._agents = agents
        self._flows = flows  # flow hash -> flow, to follow a ``flow:updated``
        self.packer = packer or Packer()  # large payloads and checkpoints, packed in proportion to what changed
        self.views: dict[str, View] = {}  # node run id -> the state it sees (see RunExecution.submit_patch)
        self.rows: list[EventRow] = []
        self.applied: list[BaseEvent] = []

    @staticmethod
    def first(draft: FlowStart, run_id: str) -> tuple[FlowStart, EventRow]:
        """A run's first event: ``draft`` stamped (seq 1, now, run ``run_id``), encoded as it is stored,
        and read back as the run reads it; and its row."""
        draft.seq = 1
        draft.timestamp = int(time.time() * 1000)
        draft.flowRunId = run_id
        body = _encode(draft)
        event = decode(body)
        assert type(event) is FlowStart
        return event, (1, draft.timestamp, body)

    @staticmethod
    def start(flow: CompiledFlow, draft: FlowStart, run_id: str) -> Started:
        """``first``, and the snapshot the run starts with (the state the flow declares, a copy of its own:
        the flow document's lists and maps stay the flow's)."""
        event, row = Appender.first(draft, run_id)
        snap = initial_snapshot(flow, event)
        return Started(event, row, replace(snap, state=msgspec.json.decode(msgspec.json.encode(snap.state))))

    def agent_runs(self) -> Sequence[AgentRun]:
        """The agent runs changed since the last call (for the next commit)."""
        return self._agents.changed() if self._agents is not None else ()

    def take(self) -> tuple[list[EventRow], list[BaseEvent]]:
        """The rows and events appended since the last call (for a commit)."""
        rows, applied = self.rows, self.applied
        self.rows, self.applied = [], []
        return rows, applied

    def append(self, draft: BaseEvent) -> tuple[BaseEvent, Touched, int]:
        """Stamp, normalise (JSON round trip), apply and buffer one event: the event applied, the nodes
        it touched and its stored size. A state patch that cannot apply is recorded ``rejected``."""
        snap = self.snap
        draft.seq = snap.seq + 1
        draft.timestamp = int(time.time() * 1000)  # ids.now_ms, inlined: this runs for every event
        draft.flowRunId = snap.runId
        field = _PAYLOAD_OF.get(type(draft))
        large = field is not None and type(payload := getattr(draft, field)) in _WHOLE and _large(payload)
        try:
            if large:
                self.packer.nulls = False
                body, event = self._pack(draft, field)  # type: ignore[arg-type]
                if self.packer.nulls or _NULL in body:
                    refuse_non_finite(payload)
            else:
                body = _encode(draft)
                if field is not None:
                    check_encoded(getattr(draft, field), body)
                if holds_secret(body):  # an error that echoed a request's headers, say: never stored
                    body = redact_bytes(body)
                    event = decode(body)
                else:
                    event = draft if _json_already(draft) else decode(body)
        except (TypeError, ValueError, RecursionError, msgspec.EncodeError) as exc:
            # Not JSON: a set, a key that is not a string, text with a lone surrogate (a ValueError),
            # nesting deeper than the encoder goes (a RecursionError), a NaN or Infinity (which the
            # encoder would write as null: a ValueError naming where it is).
            if isinstance(draft, NodeComplete):
                draft = NodeError(nodeId=draft.nodeId, runId=draft.runId, item=draft.item,
                                  errorType="invalid_output", message=f"output is not JSON: {exc}",
                                  attempt=snap.attempts.get(draft.nodeId or "", 1))
                return self.append(draft)
            raise
        if type(event) is FlowUpdated and self._flows is not None:
            self.flow = self._flows(event.toHash)
            if self._agents is not None:
                self._agents.follow(self.flow)
        if self._agents is not None and type(event) in FOLDED:
            self._agents.apply(snap, event)  # before the reducer, which changes ``snap`` in place
        if self.views:
            snap = self._landed(snap, draft, event)
        try:
            self.snap, touched = apply(self.flow, snap, event, owned=True)
        except NodeFailure as exc:
            if type(event) is not StatePatch:
                raise
            # Checked by the node against the state it saw, the patch cannot apply to the state as it is
            # now: it is recorded rejected, as a no-op, so the log says what happened and replays it.
            log.warning("run %s: rejected a state patch from node %s (seq %d): %s", snap.runId, event.nodeId,
                        event.seq, exc)
            event = replace(event, rejected=str(exc))
            body = _encode(event)
            self.snap, touched = apply(self.flow, snap, event, owned=True)
        self.rows.append((event.seq, event.timestamp, body))
        self.applied.append(event)
        return event, touched, len(body)

    def _pack(self, draft: BaseEvent, field: str) -> tuple[bytes, BaseEvent]:
        """The stored body of an event whose payload ``field`` is large: it refers to blobs, so a
        transcript that grew by one message costs that message, not the transcript. And the event to
        apply, whose payload is rebuilt from the packer's own objects (as a JSON round trip would give)."""
        packer = self.packer
        packed = packer.pack_inline(getattr(draft, field))
        skeleton = _encode(replace(draft, **{field: packed}))
        data = msgspec.json.decode(skeleton)
        payload = data.pop(field, None)
        event: BaseEvent = msgspec.convert(data, type(draft))  # its own type: converting to the union costs ~18 µs
        value = packer.resolver().unpack(payload)
        packer.remember(value, packed)
        setattr(event, field, value)
        return PACKED_PREFIX + skeleton[1:], event

    def _landed(self, snap: RunSnapshot, draft: BaseEvent, event: BaseEvent) -> RunSnapshot:
        """``snap`` with the staged patches of the node run that ``event`` finishes already in its
        state, when the node computed that state itself (equal to what the reducer would make)."""
        if isinstance(event, StatePatch):
            view = self.views.get(event.runId or "")
            if view is not None and event is not draft and event.value != getattr(draft, "value", None):
                view.exact = False  # the JSON round trip changed the value: the node's view is not the log's
            return snap
        if not isinstance(event, NodeComplete | NodeWaiting | NodeError):
            return snap
        view = self.views.pop(event.runId or "", None)
        if view is None or not view.exact or isinstance(event, NodeError) or view.base is not snap.state:
            return snap
        staged = snap.staged.get(event.runId or "")
        if staged is None or len(staged) != view.count:
            return snap
        del snap.staged[event.runId or ""]  # owned: see __init__
        return replace(snap, state=view.patched)


def append_now(store: Store, snap: RunSnapshot, drafts: list[BaseEvent], lease: Lease, *,
               flows: Callable[[str], CompiledFlow], agent_types: AgentTypes, release: bool = False) -> RunSnapshot:
    """Append ``drafts`` to ``snap``'s run and commit them at once, with a checkpoint, under ``lease``
    (commands, flow switches, failures to start, hand-overs); the snapshot after them."""
    flow = flows(snap.flowHash)
    appender = Appender(flow, snap, flows=flows, agents=AgentRunFold.for_run(flow, snap, store, agent_types))
    for d in drafts:
        appender.append(d)
    snap = appender.snap
    skeleton, blobs = encode_checkpoint(snap)
    store.commit(snap.runId, appender.rows, snap.status, snap.seq, snap.error, skeleton, blobs, lease=lease,
                 release=release, agent_runs=appender.agent_runs())
    return snap


# Events whose fields the kernel fills with strings and integers only, and the one field that carries
# a node's data in the others: when that is a str, int, bool or None, decoding the encoded event
# would give back an equal event, so the draft itself is applied.
_KERNEL_MADE = frozenset({EdgeSkip, NodeSkipped, LoopIterate, LoopExhausted, FlowComplete, FlowWaiting})
_PAYLOAD = {StatePatch: "value", NodeComplete: "output", EdgeFire: "items"}
_EXACT_JSON = frozenset({str, int, bool, type(None)})  # not float: NaN would come back as null


def _json_already(draft: BaseEvent) -> bool:
    cls = type(draft)
    if cls in _KERNEL_MADE:
        return True
    field = _PAYLOAD.get(cls)
    return field is not None and type(getattr(draft, field)) in _EXACT_JSON


_encode = encoder.encode
_NULL = b"null"  # in an encoded payload wherever a None was, or a NaN or Infinity (flowkernel.core.nonfinite)

# The field of an event that carries a node's data, and when that data is large enough to pack: a long
# list or a long string, at most three levels down (a transcript in an output, a history in the args of
# an input), the values that come back event after event.
_PAYLOAD_OF: dict[type[BaseEvent], str] = {
    NodeStart: "input", NodeComplete: "output", StatePatch: "value", EdgeFire: "items", NodeWaiting: "prompt",
}
_WHOLE = frozenset({dict, list, tuple, str})
_LONG_LIST = 2 * LEAF
_LONG_STRING = 4096


def _large(value: Any, depth: int = 0) -> bool:
    t = type(value)
    if t is str:
        return len(value) >= _LONG_STRING
    if t is dict:
        values: Any = value.values()
    elif len(value) > _LONG_LIST:
        return True
    else:
        values = value
    if depth < 2:
        for v in values:
            if type(v) in _WHOLE and _large(v, depth + 1):
                return True
    return False
