"""The live view of a run: one line per event as it happens, in the terminal (``run``, ``resume``, …);
what is stored is shown by ``flowkernel.cli.show``."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from flowkernel.cli.show import preview
from flowkernel.cli.wording import plural
from flowkernel.core.events import (
    AgentCompaction,
    AgentComplete,
    AgentError,
    AgentStart,
    AgentText,
    AgentTextDelta,
    AgentThinking,
    AgentThinkingDelta,
    AgentTool,
    AgentUsage,
    BaseEvent,
    CommandReceived,
    EdgeFire,
    EdgeSkip,
    FlowComplete,
    FlowPaused,
    FlowResumed,
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
    event_type,
)


def _color(stream: TextIO) -> bool:
    return stream.isatty() and os.environ.get("NO_COLOR") is None


_COUNTED = {"node:complete": "done", "node:skipped": "skipped"}


# Events whose lines need nothing of the run's history but when it started (``seed_later``).
_WITHOUT_HISTORY = frozenset({CommandReceived, FlowResumed})


class LiveView:
    """Prints one readable line per event as a run progresses; agent text streams inline.

    Lines are made from the event's fields as they are (no encoding of the event), and values are
    previewed, never written out whole: showing a run costs in proportion to what is shown. The
    stream is flushed once per call, or once per ``batch`` of events committed together.

    Times are since the run started (``started_ms``, else its first event), or the wall clock with
    ``wall``. Lines of a node run say which node run they are about (``describe[2]`` for a forEach
    item). One node run's text streams at a time; text of others arriving meanwhile is held and
    printed as a labelled block of its own, so concurrent items never run together.
    """

    def __init__(self, stream: TextIO | None = None, *, started_ms: int | None = None, wall: bool = False) -> None:
        self.out = stream or sys.stdout
        self.color = _color(self.out)
        self.t0 = started_ms
        self.wall = wall
        self.counts: Counter[str] = Counter()
        # Nodes (and forEach items) whose last outcome is a failure: one under continueOnError, a failed
        # item, a failed node; a later start (retry, loop pass) or completion of the same one clears it.
        self._failed: set[tuple[str, int | None]] = set()
        self._streaming: str | None = None  # "<node run id> <event type>" of the stream being printed
        self._streamed: set[str] = set()  # streams that printed text as it came
        self._held: dict[str, list[str]] = {}  # stream -> text that came while another one printed
        self._heads: dict[str, tuple[str, bool]] = {}  # stream -> (who, thinking)
        self._labels: dict[str, str] = {}  # node run id -> "node" or "node[item]"
        self._first: dict[str, str] = {}  # node run id -> the first node run of its chain of resumes
        self._calls: Counter[str] = Counter()  # model calls per chain
        self._tokens: dict[str, list[float]] = {}  # chain -> [in, out, cost]
        self._stamp = 0
        # A fork starts with events copied from the run it forks (seq 2 to ``forkedAt``): they keep their
        # own times, from before the fork's start, and are timed from the first of them instead.
        self._copied_until = 0
        self._copied_t0: int | None = None
        self._origin: int | None = started_ms  # what the current event is timed from
        self._when_of: tuple[int | None, int | None] = (None, None)  # (stamp, t0) of the time last formatted
        self._when_text = ""
        self._when_shown = ("", "")  # (a time, as a line shows it)
        self._history: Callable[[int], Iterable[BaseEvent | bytes]] | None = None  # see seed_later
        self._history_until: int | None = None

    def seed_later(self, history: Callable[[int], Iterable[BaseEvent | bytes]]) -> None:
        """``seed`` with ``history(until)`` (the run's stored events up to seq ``until``: those before the
        first one this view prints) when the first line that needs it comes. A run's history is as long
        as the run, and the first lines of a resume (its command, ``flow:resumed``) need only the time
        the run started: its first event, read now."""
        for ev in history(1):
            first = decode(ev) if isinstance(ev, bytes) else ev
            if self.t0 is None:
                self.t0 = first.timestamp
            if type(first) is FlowStart:
                self._copied_until = first.forkedAt or 0
        self._history = history

    def _seed_for(self, ev: BaseEvent) -> None:
        """Take in the history put off by ``seed_later`` unless ``ev``'s line can do without it."""
        if self._history_until is None:
            self._history_until = ev.seq - 1  # events are shown once stored: each has its seq
        if type(ev) not in _WITHOUT_HISTORY:
            history, self._history = self._history, None
            if history is not None and self._history_until > 0:
                self.seed(history(self._history_until))

    def seed(self, events: Iterable[BaseEvent | bytes]) -> None:
        """Take in a run's stored history without printing it, so what follows (a resumed run) is
        labelled and counted as part of the whole run. Events as stored (bytes) are decoded only when
        the view keeps more of them than their type: a resumed run of 10,000 nodes prints its first
        line without decoding every node's completion first."""
        last: bytes | None = None
        for ev in events:
            if isinstance(ev, bytes):
                counted = _COUNTED.get(event_type(ev) or "")
                if counted is not None and not self._failed:  # a completion may clear a failure
                    self.counts[counted] += 1
                    last = ev
                    continue
                ev = decode(ev)
            last = None
            self._note(ev)
        if last is not None:  # its time is the view's latest
            self._stamp = decode(last).timestamp or self._stamp

    def _note(self, ev: BaseEvent) -> None:
        """What the view keeps of an event: counts, labels, model calls."""
        cls = type(ev)
        if self.t0 is None:
            self.t0 = ev.timestamp
        self._stamp = ev.timestamp or self._stamp
        self._origin = self.t0
        if self._copied_until and 1 < ev.seq <= self._copied_until:
            if self._copied_t0 is None:
                self._copied_t0 = ev.timestamp
            self._origin = self._copied_t0
        if cls is NodeComplete:
            self.counts["done"] += 1
            if self._failed:
                self._failed.discard((ev.nodeId or "", ev.item))  # type: ignore[attr-defined]
        elif cls is NodeSkipped:
            self.counts["skipped"] += 1
        elif cls is NodeError:
            if not ev.willRetry:  # type: ignore[attr-defined]
                self._failed.add((ev.nodeId or "", ev.item))  # type: ignore[attr-defined]
        elif cls is NodeStart:
            if self._failed:
                self._failed.discard((ev.nodeId or "", ev.item))  # type: ignore[attr-defined]
            run = ev.runId
            if run:
                item = ev.item  # type: ignore[attr-defined]
                self._labels[run] = f"{ev.nodeId}" + ("" if item is None else f"[{item}]")
                before = ev.resumedFrom  # type: ignore[attr-defined]
                self._first[run] = self._first.get(before, before) if before else run
        elif cls is AgentUsage:
            run = ev.runId or ""
            chain = self._first.get(run, run)
            self._calls[chain] += 1
            usage = ev.usage  # type: ignore[attr-defined]
            tally = self._tokens.setdefault(chain, [0, 0, 0.0])
            tally[0] += usage.get("inputTokens", 0)
            tally[1] += usage.get("outputTokens", 0)
            tally[2] += ev.costUsd  # type: ignore[attr-defined]
        elif cls is FlowStart:
            self._copied_until = ev.forkedAt or 0  # type: ignore[attr-defined]

    def _c(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def _when(self) -> str:
        # Most lines share their millisecond with the line before: the time is formatted once for them.
        origin = self._origin
        if self._stamp == self._when_of[0] and origin == self._when_of[1]:
            return self._when_text
        if self.wall:
            seconds, ms = divmod(self._stamp, 1000)
            text = time.strftime("%H:%M:%S", time.localtime(seconds)) + f".{ms:03d}"
        else:
            text = f"{(self._stamp - (origin or self._stamp)) / 1000:7.2f}s"
        self._when_of, self._when_text = (self._stamp, origin), text
        return text

    def _line(self, mark: str, who: str, what: str) -> None:
        if self._streaming is not None:
            self._end_stream()
        when = self._when()
        if when is not self._when_shown[0]:  # dimmed once per time shown
            self._when_shown = (when, self._c("2", when))
        self.out.write(f"{self._when_shown[1]} {mark} {who:<22} {what}\n")

    def _end_stream(self) -> None:
        if self._streaming is not None:
            self.out.write("\n")
            self._streaming = None

    def _gutter(self) -> str:
        return " " * len(self._when()) + " " + self._c("34", "│")

    def _block(self, who: str, text: str, *, thinking: bool) -> None:
        """Agent text under the gutter: ``│ who says: …``, continuation lines indented."""
        self.out.write(f"{self._gutter()} {who} {'thinks' if thinking else 'says'}: ")
        self._text(text, thinking=thinking)

    def _text(self, text: str, *, thinking: bool) -> None:
        body = text.replace("\n", "\n" + self._gutter() + "   ")
        self.out.write(self._c("2", body) if thinking else body)

    def _delta(self, key: str, who: str, text: str, *, thinking: bool) -> None:
        if self._streaming is None:
            self._block(who, "".join(self._held.pop(key, [])), thinking=thinking)
            self._streaming = key
            self._streamed.add(key)
        if self._streaming == key:
            self._text(text, thinking=thinking)
        else:  # another node run's text is printing: hold this one's
            self._held.setdefault(key, []).append(text)
            self._heads[key] = (who, thinking)

    def _release(self, run: str | None) -> None:
        """Print the text held for node run ``run`` (every node run's when None) as blocks of their own."""
        for key in [k for k in self._held if run is None or k.startswith(run + " ")]:
            self._end_stream()
            who, thinking = self._heads.pop(key)
            self._block(who, "".join(self._held.pop(key)), thinking=thinking)
            self._streamed.add(key)
            self.out.write("\n")

    def __call__(self, ev: BaseEvent) -> None:
        self._show(ev)
        self.out.flush()

    def batch(self, events: Iterable[BaseEvent]) -> None:
        """Show events committed together, then flush the stream once (``__call__`` flushes per event):
        what a run shell hands its listeners after each commit."""
        for ev in events:
            self._show(ev)
        self.out.flush()

    def _show(self, ev: BaseEvent) -> None:
        if self._history is not None:
            self._seed_for(ev)
        self._note(ev)
        cls = type(ev)
        run = ev.runId or ""
        if self._held and cls not in _DELTAS:
            self._release(run or None)  # what a node run said comes before what it does next
        show = _SHOW.get(cls)
        if show is not None:
            show(self, ev, run)

    def _who(self, ev: BaseEvent, run: str) -> str:
        """The node run's label (``node`` or ``node[item]``), else the event's node and item."""
        label = self._labels.get(run)
        if label:
            return label
        item = getattr(ev, "item", None)
        return (ev.nodeId or "") + ("" if item is None else f"[{item}]")

    # One method per event type, each reading the struct's fields as they are.

    def _flow_start(self, ev: FlowStart, run: str) -> None:
        fork = ""
        if ev.forkedFrom:
            fork = f"  fork of {ev.forkedFrom} at seq {ev.forkedAt}"
            if ev.forkedAt is not None and ev.forkedAt > 1:  # the lines up to there are that run's
                copied = "event 2" if ev.forkedAt == 2 else f"events 2 to {ev.forkedAt}"
                fork += f" ({copied} copied, timed from that run's start)"
        self._line(self._c("1", "▶"), ev.flowName, f"run {ev.flowRunId}  input {preview(ev.input, 50)}{fork}")

    def _node_start(self, ev: NodeStart, run: str) -> None:
        attempt = f" (attempt {ev.attempt})" if ev.attempt is not None and ev.attempt > 1 else ""
        resumed = f" resumed from {ev.resumedFrom}" if ev.resumedFrom else ""
        self._line(self._c("36", "●"), self._who(ev, run), f"started {run}{attempt}{resumed}")

    def _node_complete(self, ev: NodeComplete, run: str) -> None:
        duration = 0 if ev.durationMs is None else ev.durationMs
        self._line(self._c("32", "✔"), self._who(ev, run), f"done in {duration} ms → {preview(ev.output)}")

    def _node_error(self, ev: NodeError, run: str) -> None:
        retry = ", will retry" if ev.willRetry else ""
        self._line(self._c("31", "✖"), self._who(ev, run), f"{ev.errorType}: {preview(ev.message, 70)}{retry}")

    def _node_skipped(self, ev: NodeSkipped, run: str) -> None:
        self._line(self._c("2", "○"), self._who(ev, run), f"skipped ({ev.reason})")

    def _node_waiting(self, ev: NodeWaiting, run: str) -> None:
        self._line(self._c("33", "…"), self._who(ev, run), f"waiting: {preview(ev.prompt, 70)}")

    def _edge_fire(self, ev: EdgeFire, run: str) -> None:
        extra = f" with {plural(len(ev.items), 'item')}" if ev.items is not None else ""
        self._line(self._c("2", "→"), f"{ev.from_} → {ev.to}", f"fired{extra}")

    def _edge_skip(self, ev: EdgeSkip, run: str) -> None:
        self._line(self._c("2", "↛"), f"{ev.from_} → {ev.to}", "skipped")

    def _loop_iterate(self, ev: LoopIterate, run: str) -> None:
        self._line(self._c("35", "↻"), ev.edgeId, f"loop iteration {ev.iteration}")

    def _loop_exhausted(self, ev: LoopExhausted, run: str) -> None:
        self._line(self._c("35", "↻"), ev.edgeId, f"loop exhausted after {plural(ev.iteration, 'iteration')}")

    def _state_patch(self, ev: StatePatch, run: str) -> None:
        self._line(self._c("2", "≡"), f"state.{ev.path}", f"{ev.op} {preview(ev.value, 50)}")

    def _agent_delta(self, ev: AgentTextDelta | AgentThinkingDelta, run: str) -> None:
        thinking = type(ev) is AgentThinkingDelta
        self._delta(f"{run} {ev.type}", self._who(ev, run), ev.content, thinking=thinking)

    def _agent_block(self, ev: AgentText | AgentThinking, run: str) -> None:
        key = f"{run} {ev.type}:delta"
        if key in self._streamed:  # shown as it streamed
            self._streamed.discard(key)
            self._end_stream()
            return
        self._end_stream()
        self._block(self._who(ev, run), ev.content, thinking=type(ev) is AgentThinking)
        self.out.write("\n")

    def _agent_start(self, ev: AgentStart, run: str) -> None:
        was = f" (was {ev.previousModel})" if ev.previousModel else ""
        self._line(self._c("34", "◆"), self._who(ev, run), f"agent {ev.model}{was} session {ev.sessionId}")

    def _agent_compaction(self, ev: AgentCompaction, run: str) -> None:
        self._line(self._c("34", "◆"), self._who(ev, run),
                   f"context compacted: {ev.tokensBefore} → {ev.tokensAfter} tokens, "
                   f"{plural(ev.messagesSummarized, 'message')} summarized")

    def _agent_tool(self, ev: AgentTool, run: str) -> None:
        err = f" error: {preview(ev.error, 40)}" if ev.error else ""
        duration = 0 if ev.durationMs is None else ev.durationMs
        self._line(self._c("34", "⚙"), self._who(ev, run), f"{ev.toolName}({preview(ev.toolInput, 30)}) → "
                                                          f"{preview(ev.toolOutput, 30)} {duration} ms{err}")

    def _agent_error(self, ev: AgentError, run: str) -> None:
        self._line(self._c("31", "!"), self._who(ev, run), f"{ev.errorType}: {preview(ev.message, 70)}")

    def _agent_complete(self, ev: AgentComplete, run: str) -> None:
        chain = self._first.get(run, run)
        calls = self._calls.get(chain, 0) or (ev.numTurns or 0)
        tokens_in, tokens_out, cost = self._tokens.get(chain, [0, 0, 0.0])
        if chain not in self._tokens:  # no agent:usage events (an older run): this execution's own
            u = {} if ev.usage is None else ev.usage
            tokens_in, tokens_out = u.get("inputTokens", 0), u.get("outputTokens", 0)
            cost = 0 if ev.totalCostUsd is None else ev.totalCostUsd
        self._line(self._c("34", "◆"), self._who(ev, run), f"agent done: {plural(calls, 'model call')}, "
                                                          f"{int(tokens_in)} in / {int(tokens_out)} out tokens, ${cost:.4f}")

    def _command(self, ev: CommandReceived, run: str) -> None:
        verdict = "accepted" if ev.accepted else f"refused: {ev.reason}"
        self._line(self._c("33", "⌘"), ev.command, verdict)

    def _flow_paused(self, ev: FlowPaused, run: str) -> None:
        why = ev.reason or ""
        if why == "budget":
            from flowkernel.core.budgets import money

            whose = f"node {ev.nodeId}'s" if ev.nodeId else "the run's"
            why = f"budget: {money(ev.costUsd or 0)} spent, {whose} limit is {money(ev.limitUsd or 0)}"
        self._line(self._c("33", "‖"), "paused", why)

    def _flow_resumed(self, ev: FlowResumed, run: str) -> None:
        why = ev.message or ""
        if ev.budgetUsd is not None:
            from flowkernel.core.budgets import money

            why = f"{why} (budget raised to {money(ev.budgetUsd)})".strip()
        self._line(self._c("33", "▶"), "resumed", why)

    def _flow_waiting(self, ev: FlowWaiting, run: str) -> None:
        self._line(self._c("33", "‖"), "waiting", ev.reason or "")

    def _flow_updated(self, ev: FlowUpdated, run: str) -> None:
        self._line(self._c("33", "✎"), "flow updated", f"{ev.fromHash[:19]}… → {ev.toHash[:19]}…")

    def _flow_complete(self, ev: FlowComplete, run: str) -> None:
        status = ev.status
        code = "32" if status == "completed" else "31"
        err = f": {ev.error}" if ev.error else ""
        # Counted over the whole run, the stored history of a resumed run included (``seed``).
        failed = f", {len(self._failed)} failed" if self._failed else ""
        self._line(self._c(code, "■"), status, f"{self.counts['done']} done{failed}, {self.counts['skipped']} skipped{err}")


# How each event type is shown (types not here print nothing: agent:usage, inbox:consumed).
_SHOW: dict[type[BaseEvent], Callable[[LiveView, Any, str], None]] = {
    FlowStart: LiveView._flow_start, NodeStart: LiveView._node_start, NodeComplete: LiveView._node_complete,
    NodeError: LiveView._node_error, NodeSkipped: LiveView._node_skipped, NodeWaiting: LiveView._node_waiting,
    EdgeFire: LiveView._edge_fire, EdgeSkip: LiveView._edge_skip, LoopIterate: LiveView._loop_iterate,
    LoopExhausted: LiveView._loop_exhausted, StatePatch: LiveView._state_patch,
    AgentTextDelta: LiveView._agent_delta, AgentThinkingDelta: LiveView._agent_delta,
    AgentText: LiveView._agent_block, AgentThinking: LiveView._agent_block, AgentStart: LiveView._agent_start,
    AgentTool: LiveView._agent_tool, AgentError: LiveView._agent_error, AgentComplete: LiveView._agent_complete,
    AgentCompaction: LiveView._agent_compaction,
    CommandReceived: LiveView._command, FlowPaused: LiveView._flow_paused, FlowResumed: LiveView._flow_resumed,
    FlowWaiting: LiveView._flow_waiting, FlowUpdated: LiveView._flow_updated, FlowComplete: LiveView._flow_complete,
}
_DELTAS = frozenset({AgentTextDelta, AgentThinkingDelta})
