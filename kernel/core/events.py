"""The event catalogue (DESIGN §4): msgspec structs, a tagged union on ``type``.

Nodes and the scheduler produce *drafts* (``seq == 0``); the run shell stamps ``seq``,
``timestamp`` and ``flowRunId`` when it appends them to the log.
"""

# No `from __future__ import annotations`: msgspec reads these structs' field types when it first
# encodes or decodes them (the event union's decoder is built when this module loads), and evaluating
# annotations kept as strings costs several times more.
from typing import Any

import msgspec
from flowkernel.core.nesting import read_deep


class BaseEvent(msgspec.Struct, kw_only=True, tag_field="type", omit_defaults=True, gc=False):
    seq: int = 0
    timestamp: int = 0
    flowRunId: str = ""
    nodeId: str | None = None
    runId: str | None = None
    cause: int | None = None

    @property
    def type(self) -> str:
        return str(self.__struct_config__.tag)


# --- the run -------------------------------------------------------------------------------

class FlowStart(BaseEvent, tag="flow:start"):
    flowName: str
    flowHash: str
    input: Any = None
    parentRunId: str | None = None
    parentNodeRunId: str | None = None
    forkedFrom: str | None = None
    forkedAt: int | None = None
    rerunOf: str | None = None  # a rerun (``POST /runs/{id}/rerun``): the run whose recording it replays


class FlowPaused(BaseEvent, tag="flow:paused"):
    """``reason`` ``budget``: what was spent reached a limit; ``costUsd`` and ``limitUsd`` say how much,
    and ``nodeId`` names the node whose ``policy.maxCostUsd`` it was (absent: the run's ``budget``)."""

    reason: str | None = None
    costUsd: float | None = None
    limitUsd: float | None = None


class FlowResumed(BaseEvent, tag="flow:resumed"):
    """``budgetUsd``: the new limit for what paused the run (``resume --budget``), or the run's budget."""

    message: str | None = None
    retry: bool = False
    budgetUsd: float | None = None


class FlowWaiting(BaseEvent, tag="flow:waiting"):
    reason: str | None = None


class RerunDivergence(msgspec.Struct, omit_defaults=True):
    """Where a rerun first parts from its recording: ``kind`` (``request``, ``extra_call``,
    ``missing_call``, ``event``, ``extra_event``, ``missing_event``), ``seq`` in the recorded run."""

    kind: str
    message: str
    seq: int | None = None


class RerunOutcome(msgspec.Struct, omit_defaults=True):
    """A rerun's verdict on the run ``of`` whose recording it replayed."""

    of: str
    matches: bool
    divergence: RerunDivergence | None = None


class FlowComplete(BaseEvent, tag="flow:complete"):
    """``rerun``: on a rerun's, whether it matched its recording and, if not, where it diverged."""

    status: str
    error: str | None = None
    rerun: RerunOutcome | None = None


class FlowUpdated(BaseEvent, tag="flow:updated"):
    """From here on the run follows another flow (``resume``/``retry --flow``), stored under ``toHash``.
    Every event after it is folded with that flow."""

    fromHash: str
    toHash: str


# --- nodes ---------------------------------------------------------------------------------

# ``attempt`` and ``durationMs`` are always written (DESIGN §4), though ``omit_defaults`` leaves out
# fields equal to their default: their defaults are values that never occur (0, -1), and
# ``__post_init__`` (which also runs on decoding) turns them into what an event that omits them
# meant before they were always written: attempt 1, 0 ms.

class NodeStart(BaseEvent, tag="node:start"):
    attempt: int = 0
    input: Any = None
    item: int | None = None
    resumedFrom: str | None = None

    def __post_init__(self) -> None:
        if self.attempt == 0:
            self.attempt = 1


class NodeComplete(BaseEvent, tag="node:complete"):
    output: Any = None
    durationMs: int = -1
    item: int | None = None

    def __post_init__(self) -> None:
        if self.durationMs < 0:
            self.durationMs = 0


class NodeError(BaseEvent, tag="node:error"):
    errorType: str
    message: str
    attempt: int = 1
    willRetry: bool = False
    item: int | None = None
    details: Any = None  # e.g. ``{"traceback": "..."}`` of an exception the node type did not expect


class NodeSkipped(BaseEvent, tag="node:skipped"):
    reason: str
    item: int | None = None


class NodeWaiting(BaseEvent, tag="node:waiting"):
    prompt: Any = None
    schema: dict[str, Any] | None = None


# --- edges, loops, state, commands ---------------------------------------------------------

class EdgeFire(BaseEvent, tag="edge:fire"):
    edgeId: str
    from_: str = msgspec.field(name="from")
    to: str
    items: list[Any] | None = None


class EdgeSkip(BaseEvent, tag="edge:skip"):
    edgeId: str
    from_: str = msgspec.field(name="from")
    to: str


class LoopIterate(BaseEvent, tag="loop:iterate"):
    edgeId: str
    iteration: int


class LoopExhausted(BaseEvent, tag="loop:exhausted"):
    edgeId: str
    iteration: int


class StatePatch(BaseEvent, tag="state:patch"):
    op: str
    path: str
    value: Any = None
    # True: the patch reaches the state when its node run completes (or waits), not before, and not
    # at all if it never does; the patches of node types that run again from the start are staged.
    staged: bool = False
    # Why the patch could not apply to the state as it was when it arrived (another node run changed
    # it meanwhile): recorded, and applied as a no-op.
    rejected: str | None = None


class CommandReceived(BaseEvent, tag="command:received"):
    """``content`` is what an accepted command delivers; a refused one keeps only ``contentPreview``
    (its first characters) and ``contentBytes`` (its size)."""

    command: str
    accepted: bool
    reason: str | None = None
    # Why a refused command was refused: ``invalid`` (the command is wrong) or ``conflict`` (the run's
    # state refuses it); the HTTP API answers 422 or 409.
    refusal: str | None = None
    target: str | None = None
    content: Any = None
    commandId: str | None = None  # the store's id of a command that came through its queue
    contentPreview: str | None = None
    contentBytes: int | None = None


class InboxConsumed(BaseEvent, tag="inbox:consumed"):
    """A node run took its inbox messages (up to ``count``), so they are never delivered twice."""

    count: int
    step: int | None = None  # an agent's: the step whose turn boundary took them (see flowkernel.history.lineage)


# --- agents --------------------------------------------------------------------------------

class AgentStart(BaseEvent, tag="agent:start"):
    sessionId: str
    model: str
    prompt: Any = None
    # The model the conversation's last answer came from, when it is another one (the flow changed the
    # node's model across a resume or an update): its thinking blocks are not sent to this model.
    previousModel: str | None = None


class AgentThinkingDelta(BaseEvent, tag="agent:thinking:delta"):
    content: str


class AgentTextDelta(BaseEvent, tag="agent:text:delta"):
    content: str


class AgentThinking(BaseEvent, tag="agent:thinking"):
    content: str


class AgentText(BaseEvent, tag="agent:text"):
    content: str


class AgentTool(BaseEvent, tag="agent:tool"):
    toolName: str
    toolUseId: str
    toolInput: Any = None
    toolOutput: Any = None
    durationMs: int = 0
    error: str | None = None


class AgentError(BaseEvent, tag="agent:error"):
    errorType: str
    message: str
    details: Any = None


# The keys of every ``usage`` object (agent:complete, agent:usage, run summaries), in this order.
USAGE_KEYS = ("inputTokens", "outputTokens", "cacheCreationInputTokens", "cacheReadInputTokens")


class AgentUsage(BaseEvent, tag="agent:usage"):
    """One model call's tokens and what they cost, priced when the call was made. The run's summed
    ``usage`` and ``totalCostUsd`` are a fold of these, so replay gives the same totals whatever the
    price table says later."""

    model: str
    usage: dict[str, int] = msgspec.field(default_factory=dict)
    costUsd: float = 0.0


class AgentCompaction(BaseEvent, tag="agent:compaction"):
    """The API compacted the context it was sent (context-management compaction): ``tokensBefore`` of
    input were summarized into a compaction block, the answer was made from ``tokensAfter``. From now on
    requests carry the ``messagesKept`` stored messages from that block on; the ``messagesSummarized``
    before it stay stored (history keeps every message) but are no longer sent."""

    tokensBefore: int = 0
    tokensAfter: int = 0
    messagesKept: int = 0
    messagesSummarized: int = 0


class AgentComplete(BaseEvent, tag="agent:complete"):
    result: Any = None
    structuredOutput: Any = None
    usage: dict[str, int] = msgspec.field(default_factory=dict)
    modelUsage: dict[str, Any] | None = None
    totalCostUsd: float = 0.0
    durationMs: int = 0
    numTurns: int = 0


Event = (
    FlowStart | FlowPaused | FlowResumed | FlowWaiting | FlowComplete | FlowUpdated
    | NodeStart | NodeComplete | NodeError | NodeSkipped | NodeWaiting
    | EdgeFire | EdgeSkip | LoopIterate | LoopExhausted | StatePatch | CommandReceived | InboxConsumed
    | AgentStart | AgentThinkingDelta | AgentTextDelta | AgentThinking | AgentText | AgentTool
    | AgentError | AgentUsage | AgentCompaction | AgentComplete
)

encoder = msgspec.json.Encoder()
decoder: msgspec.json.Decoder[Event] = msgspec.json.Decoder(Event)


def encode(event: BaseEvent) -> bytes:
    return encoder.encode(event)


def decode(data: bytes | str) -> Event:
    """The event stored as ``data``; a value in it nested deeper than the decoder goes is read clipped
    (``flowkernel.core.nesting``)."""
    return read_deep(decoder.decode, data)


def to_dict(event: BaseEvent) -> dict[str, Any]:
    """The event as the JSON object users see (``type`` included)."""
    out: dict[str, Any] = msgspec.json.decode(encoder.encode(event))
    return out


PACKED_PREFIX = b'{"$packed":1,'  # a stored event body whose payload refers to blobs (flowkernel.store.packing)
_TAG = b'"type":"'


def event_type(body: bytes) -> str | None:
    """The ``type`` of a stored event body (plain, or packed: ``{"$packed":1,"type":…``) from its first
    bytes, msgspec writing the tag first; None for a body that is not an event (a checkpoint skeleton)."""
    start = len(PACKED_PREFIX) if body.startswith(PACKED_PREFIX) else 1
    if body[:1] != b"{" or body[start:start + len(_TAG)] != _TAG:
        return None
    begin = start + len(_TAG)
    end = body.find(b'"', begin)
    return body[begin:end].decode() if end > begin else None
