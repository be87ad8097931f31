"""An event's type is read from its stored body in one place (``flowkernel.core.events.event_type``), for
bodies stored whole and bodies stored packed alike, without decoding them."""

from __future__ import annotations

import typing
from typing import Any

import msgspec
from flowkernel.core.events import PACKED_PREFIX, BaseEvent, Event, encode, event_type
from flowkernel.store.checkpoint import encode_checkpoint
from flowkernel.store.memory import MemoryStore
from flowkernel.store.packing import Packer

from tests.helpers import flow, py, registry, run_flow

SAMPLES: dict[Any, Any] = {str: "x", int: 1, float: 1.0, bool: True}


def every_event() -> list[BaseEvent]:
    """One event of each type of the union, its required fields filled with values of their types."""
    out = []
    for cls in typing.get_args(Event):
        required = {f.name: SAMPLES.get(f.type) for f in msgspec.structs.fields(cls) if f.required}
        out.append(cls(seq=3, flowRunId="r", **required))
    return out


def test_event_type_reads_every_event_type_plain_and_packed() -> None:
    events = every_event()
    assert len({ev.type for ev in events}) == len(typing.get_args(Event)) > 20
    for ev in events:
        plain = encode(ev)
        packed = PACKED_PREFIX + plain[1:]  # how a body whose payload refers to blobs is stored
        assert event_type(plain) == ev.type
        assert event_type(packed) == ev.type


def test_event_type_reads_the_bodies_a_run_stored_packed() -> None:
    def agent(history: list[dict[str, str]] | None = None) -> dict[str, Any]:
        before = history or []
        return {"transcript": [*before, {"role": "assistant", "content": f"turn {len(before)}: " + "t" * 100}]}

    store = MemoryStore()
    doc = flow([py("agent", "agent", {"history": "{{ agent.transcript }}"}), py("review", "idle")],
               [{"from": "agent", "to": "review"},
                {"from": "review", "to": "agent", "maxIterations": 30, "when": "$iteration < 29"}])
    kernel = run_flow(doc, store=store, reg=registry(agent=agent, idle=lambda: None))[0]
    [run] = kernel.runs()
    stored = store._events[run.runId]
    packed = [b for b in stored if b.startswith(PACKED_PREFIX)]
    assert packed
    assert [event_type(b) for b in stored] == [ev.type for ev in kernel.events(run.runId)]


def test_a_body_that_is_not_an_event_has_no_type() -> None:
    snap = run_flow(flow([py("a", "idle")], []), reg=registry(idle=lambda: None))[1]
    skeleton = encode_checkpoint(snap, Packer())[0]
    assert event_type(skeleton) is None
    assert event_type(b"") is None
    assert event_type(b'{"type":') is None
    assert event_type(b'["type"]') is None
