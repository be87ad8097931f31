"""The RunSnapshot (DESIGN §5): everything needed to continue a run, and nothing else."""

# No `from __future__ import annotations`: msgspec reads these structs' field types when it first
# encodes or decodes them (a checkpoint is converted to a RunSnapshot when a run resumes), and evaluating
# annotations kept as strings costs several times more.
from itertools import islice
from typing import Any

import msgspec


class InboxMessage(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    kind: str  # send | reply | resume
    content: Any
    seq: int  # the command:received event that accepted it


class ItemResult(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """A finished forEach item, as the group's output lists it: ``{"item", "output"}``, ``{"item",
    "error"}`` or ``{"item", "skipped": true}``. A struct the cyclic collector does not track (a dict
    holding an output is tracked): a group of 20,000 items keeps as many for as long as it runs, and
    tracked they would make every full collection meanwhile longer and the next one sooner."""

    item: Any
    output: Any = msgspec.UNSET
    error: str | msgspec.UnsetType = msgspec.UNSET
    skipped: bool | msgspec.UnsetType = msgspec.UNSET

    def as_json(self) -> dict[str, Any]:
        """The entry of the group's ``iterations`` output."""
        if self.output is not msgspec.UNSET:
            return {"item": self.item, "output": self.output}
        if self.error is not msgspec.UNSET:
            return {"item": self.item, "error": self.error}
        return {"item": self.item, "skipped": True}


class ForEachState(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    items: list[Any]
    results: list[ItemResult | None]  # one slot per item: None until it finishes
    running: dict[str, str] = msgspec.field(default_factory=dict)  # str(item index) -> node run id
    # str(item index) -> the node run a new run of that item continues (it was interrupted or failed)
    resumedFrom: dict[str, str] = msgspec.field(default_factory=dict)


class NodeFault(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    errorType: str
    message: str
    runId: str | None = None
    details: Any = None  # the node:error's (a traceback, for an unexpected exception)


class Waiting(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    runId: str
    prompt: Any = None
    schema: dict[str, Any] | None = None
    since: int = 0  # inbox messages up to this seq were there when the node run started: they do not wake it


class BudgetPause(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """What paused the run for its budget: the node whose limit it was (None: the run's), and the figures."""

    nodeId: str | None = None
    costUsd: float = 0.0
    limitUsd: float = 0.0


class StagedPatch(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """A ``state:patch`` of a node run that has not finished: it reaches ``state`` when the run does."""

    op: str
    path: str
    value: Any = None


class RunSnapshot(msgspec.Struct, kw_only=True, gc=False):
    runId: str
    status: str  # running | paused | waiting | completed | failed | aborted
    seq: int
    flowHash: str
    input: Any
    outputs: dict[str, Any]
    state: dict[str, Any]
    nodeStatus: dict[str, str]  # pending | running | waiting | done | failed | skipped
    edgeStatus: dict[str, str]  # pending | fired | skipped
    loopCounters: dict[str, int]
    inbox: dict[str, list[InboxMessage]]  # node run id -> undelivered messages
    agentSessions: dict[str, str]  # node id -> session id
    nodeRuns: dict[str, str]  # node id -> current node run id
    attempts: dict[str, int] = msgspec.field(default_factory=dict)
    faults: dict[str, NodeFault] = msgspec.field(default_factory=dict)
    waiting: dict[str, Waiting] = msgspec.field(default_factory=dict)  # node id -> what it waits for
    forEach: dict[str, ForEachState] = msgspec.field(default_factory=dict)
    resumedFrom: dict[str, str] = msgspec.field(default_factory=dict)  # node id -> interrupted run
    staged: dict[str, list[StagedPatch]] = msgspec.field(default_factory=dict)  # node run id -> its patches
    error: str | None = None
    parentRunId: str | None = None
    parentNodeRunId: str | None = None
    # What the run's own model calls used and cost (a fold of its ``agent:usage`` events); child
    # runs keep their own, and ``flowkernel.history.summaries`` adds them up for the parent.
    usage: dict[str, int] = msgspec.field(default_factory=dict)
    totalCostUsd: float = 0.0
    # Budgets (DESIGN §12): each node's own cost in this run (its agent:usage events), the limits that
    # `resume --budget` set (key ``flow``, which no node id can be, for the run's; node ids for nodes'),
    # and, while the run is paused for a budget, which one.
    nodeCostUsd: dict[str, float] = msgspec.field(default_factory=dict)
    costLimits: dict[str, float] = msgspec.field(default_factory=dict)
    budgetPause: BudgetPause | None = None

    def __repr__(self) -> str:
        # A run of a thousand nodes has maps of a thousand entries: show the first few of each, the
        # way numpy abbreviates a large array. (asyncio takes this repr of whatever ``anyio.run``
        # returns when the loop closes, so it is paid at the end of every run, too.)
        fields = ", ".join(f"{name}={_brief(getattr(self, name))}" for name in self.__struct_fields__)
        return f"RunSnapshot({fields})"


def undelivered_answer(snap: RunSnapshot, node: str) -> InboxMessage | None:
    """The reply (or message) accepted for ``node``'s waiting node run and not yet delivered to it, if
    any: its process stopped between accepting it and continuing the run, so ``resume`` delivers it."""
    waiting = snap.waiting.get(node)
    if waiting is None:
        return None
    return next((m for m in snap.inbox.get(waiting.runId, ()) if m.kind in ("reply", "send")
                 and m.seq > waiting.since), None)


_SHOWN = 10  # entries shown per map or list in a snapshot's repr


def _brief(value: Any) -> str:
    if isinstance(value, dict):
        shown = ", ".join(f"{k!r}: {_brief(v)}" for k, v in islice(value.items(), _SHOWN))
        more = len(value) - _SHOWN
        return "{" + shown + (f", …{more} more" if more > 0 else "") + "}"
    if isinstance(value, list):
        shown = ", ".join(_brief(v) for v in value[:_SHOWN])
        more = len(value) - _SHOWN
        return "[" + shown + (f", …{more} more" if more > 0 else "") + "]"
    return repr(value)
