"""The live view shows what it shows, made from the events themselves, without writing values out."""

from __future__ import annotations

import functools
import io
import json
from typing import Any

import anyio
import msgspec
from flowkernel.cli.live_view import LiveView
from flowkernel.cli.show import preview
from flowkernel.core.events import (
    AgentTextDelta,
    CommandReceived,
    EdgeFire,
    FlowComplete,
    FlowResumed,
    NodeComplete,
    NodeStart,
    StatePatch,
    decode,
    encode,
)
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import flow, py, registry, run_flow

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner, max_size=5),
    max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(5, 120))
def test_a_preview_is_the_compact_json_cut_to_its_width(value: Any, width: int) -> None:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("\n", " ")
    expected = text if len(text) <= width else text[: width - 1] + "…"
    assert preview(value, width) == expected


class Sealed(list[Any]):
    """A long list that may be looked at only near its start."""

    def __iter__(self) -> Any:
        for i, v in enumerate(list.__iter__(self)):
            if i > 50:
                raise AssertionError("the whole list was walked")
            yield v


def test_a_long_output_is_previewed_from_its_start_only() -> None:
    out = io.StringIO()
    view = LiveView(out)
    transcript = Sealed({"role": "assistant", "content": f"message {i}"} for i in range(100_000))
    view(NodeComplete(nodeId="agent", runId="nr_1", output={"transcript": transcript}, durationMs=3))
    view(StatePatch(nodeId="agent", runId="nr_1", op="set", path="log", value=transcript))
    line = out.getvalue().splitlines()[0]
    assert line.endswith('done in 3 ms → {"transcript":[{"role":"assistant","content":"message 0"},{…')


def test_the_live_view_of_a_run_reads_as_before() -> None:
    out = io.StringIO()
    view = LiveView(out)
    view(NodeStart(nodeId="a", runId="nr_1", attempt=2, input={}))
    view(EdgeFire(edgeId="a->b", from_="a", to="b", items=[1, 2, 3]))
    view(AgentTextDelta(nodeId="a", content="hel"))
    view(AgentTextDelta(nodeId="a", content="lo\nworld"))
    view(FlowComplete(status="completed"))
    text = out.getvalue()
    assert "● a                      started nr_1 (attempt 2)" in text
    assert "→ a → b                  fired with 3 items" in text
    assert "│ a says: hello" in text and "world" in text
    assert "■ completed              0 done, 0 skipped" in text


def test_a_run_shown_live_prints_every_event() -> None:
    out = io.StringIO()
    document = flow([py("a", "give"), py("b", "give")], [{"from": "a", "to": "b"}])
    events = run_flow(document, reg=registry(give=lambda: {"n": 1}))[2]
    view = LiveView(out)
    for ev in events:
        view(ev)
    assert len(out.getvalue().splitlines()) == len(events)
    assert 'done in 0 ms → {"n":1}' in out.getvalue()


def test_a_history_seeded_as_stored_counts_labels_and_times_as_one_seeded_decoded() -> None:
    document = flow([py("a", "give"), py("b", "give"), {"id": "c", "type": "noop", "input": {}, "when": "false"}],
                    [{"from": "a", "to": "b"}, {"from": "a", "to": "c"}])
    kernel, snap, events = run_flow(document, reg=registry(give=lambda: {"n": 1}))
    stored = kernel.stored_events(snap.runId)
    assert [decode(b) for b in stored] == events
    assert any(b.startswith(b'{"type":"node:skipped"') for b in stored)
    events = [msgspec.structs.replace(ev, timestamp=1000 + 10 * i) for i, ev in enumerate(events)]  # all apart
    bodies = [encode(ev) for ev in events]
    assert bodies[-2].startswith(b'{"type":"node:complete"')  # a history that ends with one only counted
    b_run = next(ev.runId for ev in events if isinstance(ev, NodeStart) and ev.nodeId == "b")
    later = [NodeComplete(nodeId="b", runId=b_run, output=1, durationMs=3, timestamp=events[-1].timestamp + 5),
             FlowComplete(status="completed", timestamp=events[-1].timestamp + 9)]

    def shown(history: list[Any]) -> tuple[Any, ...]:
        out = io.StringIO()
        view = LiveView(out)
        view.seed(history)
        seeded = (dict(view.counts), view.t0, view._stamp, dict(view._labels))
        for ev in later:
            view(ev)
        return seeded, out.getvalue()

    for cut in (len(events), len(events) - 1):
        assert shown(bodies[:cut]) == shown(events[:cut])
    assert shown(bodies)[0][0] == {"done": 2, "skipped": 1}


def test_a_resumed_run_prints_its_first_lines_before_reading_its_history() -> None:
    document = flow([py("a", "give"), py("b", "give")], [{"from": "a", "to": "b"}])
    kernel, snap, events = run_flow(document, reg=registry(give=lambda: {"n": 1}))
    stored = kernel.stored_events(snap.runId)[:-1]  # a run stopped before its end
    asked: list[int] = []

    def history(until: int) -> list[bytes]:
        asked.append(until)
        return stored[:until]

    out = io.StringIO()
    view = LiveView(out)
    view.seed_later(history)
    start = events[0].timestamp
    resumed = [CommandReceived(command="resume", accepted=True, seq=len(stored) + 1, timestamp=start + 2000),
               FlowResumed(message="continue", seq=len(stored) + 2, timestamp=start + 2000)]
    for ev in resumed:
        view(ev)
    assert asked == [1]  # the first event only: when the run started
    assert out.getvalue().splitlines()[0].startswith("   2.00s ⌘ resume")
    view(FlowComplete(status="completed", seq=len(stored) + 3, timestamp=start + 2001))
    assert asked == [1, len(stored)]  # the history before the first event shown, once
    assert out.getvalue().splitlines()[-1].endswith("■ completed              2 done, 0 skipped")


class CountedFlushes(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_a_batch_prints_what_its_events_print_one_by_one_and_flushes_once() -> None:
    document = flow([py("a", "give"), py("b", "give")], [{"from": "a", "to": "b"}])
    events = run_flow(document, reg=registry(give=lambda: {"n": 1}))[2]
    one_by_one, batched = CountedFlushes(), CountedFlushes()
    single = LiveView(one_by_one)
    for ev in events:
        single(ev)
    LiveView(batched).batch(events)
    assert batched.getvalue() == one_by_one.getvalue()
    assert (one_by_one.flushes, batched.flushes) == (len(events), 1)


class Recorder:
    """A listener that takes batches: what it was given, call by call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any]]] = []

    def __call__(self, ev: Any) -> None:
        self.calls.append(("one", [ev]))

    def batch(self, events: Any) -> None:
        self.calls.append(("batch", list(events)))


def test_a_listener_with_a_batch_method_gets_each_commit_in_one_call_and_every_event_once() -> None:
    document = flow([py("a", "give"), py("b", "give"), py("c", "give")],
                    [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}])
    kernel = Kernel(MemoryStore(), registry=registry(give=lambda: {"n": 1}))
    recorder = Recorder()
    snap = anyio.run(functools.partial(kernel.run, kernel.compile(document), None, on_event=recorder))
    assert snap.status == "completed"
    shown = [ev for _, evs in recorder.calls for ev in evs]
    assert shown == list(kernel.events(snap.runId))  # all of them, in order, once
    assert recorder.calls[0] == ("one", shown[:1])  # flow:start, shown as the run is created
    assert {kind for kind, _ in recorder.calls[1:]} == {"batch"}
    assert any(len(evs) > 1 for _, evs in recorder.calls[1:])  # a commit of several events: one call
