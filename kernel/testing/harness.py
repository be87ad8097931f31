"""Run a flow offline for a test and look at everything it did (used by the pytest plugin).

    result = run_flow("flows/review-loop.json", {"feature": "x"}, fixtures="fixtures/review-loop")
    assert result.status == "completed"
    assert_event_sequence(result.events, ["node:start planner", "agent:complete planner", "edge:fire"])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec
from flowkernel.core.events import Event, NodeComplete, NodeError
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.fixtures import MockQuery
from flowkernel.plugins.registry import Registry, default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.run.setup import services_of
from flowkernel.store.base import Store
from flowkernel.store.memory import MemoryStore


@dataclass(frozen=True, slots=True)
class Failure:
    """A node run that failed for good: its node, forEach item, error type and message, and for a
    fixture mismatch the differing request paths (``[{path, recorded, live}]``, values as JSON text)."""

    node: str
    item: int | None
    error_type: str
    message: str
    diff: list[dict[str, str]] | None = None

    def __str__(self) -> str:
        where = self.node if self.item is None else f"{self.node}[{self.item}]"
        return f"{where}: {self.error_type}: {self.message}"


@dataclass(repr=False, slots=True)
class FlowResult:
    """A finished (or stopped) run: its events, snapshot, outputs, agent messages and tool calls."""

    kernel: Kernel
    snapshot: RunSnapshot
    events: list[Event]
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.snapshot.runId

    @property
    def status(self) -> str:
        return self.snapshot.status

    @property
    def outputs(self) -> dict[str, Any]:
        return self.snapshot.outputs

    @property
    def error(self) -> str | None:
        """Why the run failed (or was aborted); None otherwise."""
        return self.snapshot.error

    @property
    def failures(self) -> list[Failure]:
        """The node runs that failed and were not done again since (a retry that succeeded, a loop
        pass that completed), in the order they failed."""
        last: dict[tuple[str, int | None], Failure] = {}
        for ev in self.events:
            if ev.nodeId is None:
                continue
            key = (ev.nodeId, getattr(ev, "item", None))
            if isinstance(ev, NodeError) and not ev.willRetry:
                last.pop(key, None)  # re-inserted: ordered by when it failed last
                diff = ev.details.get("diff") if isinstance(ev.details, dict) else None
                last[key] = Failure(ev.nodeId, key[1], ev.errorType, ev.message,
                                    diff if isinstance(diff, list) else None)
            elif isinstance(ev, NodeComplete):
                last.pop(key, None)
        return list(last.values())

    def assert_completed(self) -> FlowResult:
        """Raise AssertionError unless the run completed, saying why: each failure with its message
        (a fixture mismatch's shows the differing paths), what a waiting run waits for, a pause's reason."""
        if self.status == "completed":
            return self
        failures = self.failures
        # The run's error repeats its failed node's message: each failure is shown instead.
        why = f": {self.error}" if self.error and not failures else ""
        lines = [f"run {self.run_id} is {self.status}, not completed{why}"]
        lines += [f"  {failure}".replace("\n", "\n    ") for failure in failures]
        for node, waiting in sorted(self.snapshot.waiting.items()):
            lines.append(f"  {node} waits for a reply (node run {waiting.runId}): {waiting.prompt!r}")
        raise AssertionError("\n".join(lines))

    def __repr__(self) -> str:
        # What pytest prints beside a failed ``assert result.status == "completed"``: say why.
        why = f": {self.error}" if self.error else ""
        return f"<FlowResult {self.run_id} {self.status}{why}>"

    def types(self, node: str | None = None) -> list[str]:
        return event_types(self.events, node=node)

    def waiting_run(self, node: str) -> str:
        """The node run id a waiting node (or agent asking a human) must be replied to."""
        waiting = self.snapshot.waiting.get(node)
        if waiting is None:
            raise AssertionError(f"node {node!r} is not waiting (run status {self.status}; "
                                 f"waiting: {sorted(self.snapshot.waiting)})")
        return waiting.runId


def _rows(fetch: Any, run_id: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    after = 0
    while True:
        page = fetch(flow_run_id=run_id, after=after, limit=1000)
        rows += page
        if len(page) < 1000:
            return rows
        after = int(page[-1]["id"])


def _result(kernel: Kernel, snap: RunSnapshot) -> FlowResult:
    rid = snap.runId
    return FlowResult(kernel=kernel, snapshot=snap, events=kernel.events(rid),
                      messages=_rows(kernel.store.list_agent_messages, rid),
                      tool_calls=_rows(kernel.store.list_tool_calls, rid))


def make_kernel(fixtures: str | Path | None = None, *, store: Store | None = None, registry: Registry | None = None,
                volatile: Iterable[str] = (), services: dict[str, Any] | None = None) -> Kernel:
    """A kernel on ``store`` (default in memory) whose model calls come from ``fixtures``."""
    given, tuning = services_of(services)
    if fixtures is not None:
        given = msgspec.structs.replace(given, query_fn=MockQuery(fixtures, volatile=volatile))
    return Kernel(store if store is not None else MemoryStore(), registry=registry or default_registry().copy(),
                  services=given, tuning=tuning)


async def arun_flow(flow: str | Path | dict[str, Any], input: Any = None, *, fixtures: str | Path | None = None,
                    replies: Sequence[Any] = (), kernel: Kernel | None = None, check: bool = False,
                    **options: Any) -> FlowResult:
    """Run a flow file (or document) to its end; ``replies`` answer waiting nodes in order. ``check``:
    raise AssertionError saying why unless it completed (``FlowResult.assert_completed``)."""
    k = kernel or make_kernel(fixtures, **options)
    compiled = k.compile(flow) if isinstance(flow, dict) else k.load_flow(flow)
    snap = await k.run(compiled, input)
    pending = list(replies)
    while snap.status == "waiting" and pending:
        node = sorted(snap.waiting)[0]
        snap = await k.reply(snap.runId, snap.waiting[node].runId, pending.pop(0))
    result = _result(k, snap)
    return result.assert_completed() if check else result


def run_flow(flow: str | Path | dict[str, Any], input: Any = None, **options: Any) -> FlowResult:
    """Synchronous ``arun_flow`` (for tests that are not async)."""
    result: FlowResult = anyio.run(lambda: arun_flow(flow, input, **options))
    return result


async def areply(result: FlowResult, node: str, answer: Any) -> FlowResult:
    snap = await result.kernel.reply(result.run_id, result.waiting_run(node), answer)
    return _result(result.kernel, snap)


def reply(result: FlowResult, node: str, answer: Any) -> FlowResult:
    """Answer the node waiting in ``result`` and run on until the run stops again."""
    out: FlowResult = anyio.run(lambda: areply(result, node, answer))
    return out


def _label(ev: Event) -> str:
    item = getattr(ev, "item", None)
    node = f" {ev.nodeId}" if ev.nodeId else ""
    return f"{ev.type}{node}" + ("" if item is None else f"[{item}]")


def event_types(events: Sequence[Event], *, node: str | None = None, deltas: bool = False) -> list[str]:
    """``"type node"`` labels of the events (deltas left out unless asked), optionally of one node."""
    return [_label(e) for e in events if (node is None or e.nodeId == node)
            and (deltas or not e.type.endswith(":delta"))]


def _matches(pattern: str, ev: Event) -> bool:
    label = _label(ev)
    return label == pattern or label.startswith(pattern + " ") or label.startswith(pattern + "[") \
        or (pattern == ev.type)


def assert_event_sequence(events: Sequence[Event], expected: Sequence[str], *, exact: bool = False) -> None:
    """The ``expected`` patterns (``"edge:fire"``, ``"node:complete coder"``) occur in this order.

    Other events may come between them unless ``exact`` (then the labels, deltas aside, must be these).
    """
    if exact:
        got = event_types(events)
        if got != list(expected):
            raise AssertionError("event sequence differs:\n  expected " + repr(list(expected)) + "\n  got      " + repr(got))
        return
    i = 0
    for ev in events:
        if i < len(expected) and _matches(expected[i], ev):
            i += 1
    if i < len(expected):
        labels = event_types(events)
        raise AssertionError(f"event {expected[i]!r} (#{i} of {list(expected)}) not found in order after "
                             f"{list(expected[:i])}; the events were:\n  " + "\n  ".join(labels))
