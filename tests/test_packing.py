"""Large values cost their growth: packed into blocks and blobs once, in checkpoints and in the log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from flowkernel.core.events import NodeComplete, encode
from flowkernel.store.memory import MemoryStore
from flowkernel.store.packing import FANOUT, LEAF, PACKED_PREFIX, Packer, Resolver
from flowkernel.store.sql.sqlite import SqliteStore
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import flow, py, registry, run_flow

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**9, 10**9) | st.text(max_size=20)
    | st.sampled_from(["x" * 600, "$blob", "$chunks"]),
    lambda inner: st.lists(inner, max_size=80) | st.dictionaries(
        st.sampled_from(["$blob", "$chunks", "$tail", "$lit", "$keys", "a", "b"]), inner, max_size=4),
    max_leaves=200)


def round_trip(value: Any, packer: Packer | None = None) -> tuple[Any, dict[str, bytes]]:
    packer = packer or Packer()
    packed = msgspec.json.decode(msgspec.json.encode(packer.pack(value)))
    blobs = packer.take_blobs()
    resolver = Resolver(lambda keys: {k: blobs[k] for k in keys})
    return resolver.unpack(packed), blobs


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_any_json_value_comes_back_as_it_was_even_when_it_looks_like_a_marker(value: Any) -> None:
    assert round_trip(value)[0] == value


def test_a_list_built_from_the_last_one_costs_its_growth_and_a_logarithmic_skeleton() -> None:
    packer = Packer()
    messages: list[Any] = []
    seen: set[str] = set()
    for i in range(5 * LEAF * FANOUT * FANOUT):
        messages = [*messages, {"role": "assistant", "content": f"message {i} " + "m" * 100}]
        packed = packer.pack_inline(messages)
        new = packer.take_blobs()
        assert not seen & set(new)
        seen |= set(new)
        # Blocks of the same list never come back: at most a leaf and the blocks it completes.
        assert len(new) <= 3
        if isinstance(packed, dict):
            assert len(packed["$chunks"]) <= 3 * (FANOUT - 1) and len(packed["$tail"]) < LEAF
        rebuilt = packer.resolver().unpack(msgspec.json.decode(msgspec.json.encode(packed)))
        assert rebuilt == messages
        messages = rebuilt  # as a node gets it back from the run: the packer's own items
    assert len(seen) < len(messages) / LEAF * 1.2


def test_a_list_changed_in_place_after_it_was_packed_packs_as_it_is_now() -> None:
    packer = Packer()
    mine = [{"n": i} for i in range(3 * LEAF)]
    packer.pack_inline(mine)
    packer.take_blobs()
    mine[0]["n"] = "changed"  # a node keeps and edits what it returned: the packer kept copies
    mine.append({"n": "more"})
    value, _ = round_trip(mine, packer)
    assert value == mine


def _transcript_flow(iterations: int) -> dict[str, Any]:
    return flow(
        [py("agent", "agent", {"history": "{{ agent.transcript }}"}), py("review", "idle")],
        [{"from": "agent", "to": "review"},
         {"from": "review", "to": "agent", "maxIterations": iterations, "when": f"$iteration < {iterations - 1}"}])


def _agent(history: list[dict[str, str]] | None = None) -> dict[str, Any]:
    before = history or []
    message = {"role": "assistant", "content": f"turn {len(before)}: " + "t" * 100}
    return {"text": message["content"], "transcript": [*before, message]}


def _stored_bytes(store: Any, run_id: str) -> int:
    if isinstance(store, MemoryStore):
        return sum(len(b) for b in store._events[run_id]) + sum(len(b) for b in store._blobs.values())
    rows = store._query("SELECT SUM(LENGTH(body)) FROM events")[0][0] + store._query(
        "SELECT SUM(LENGTH(body)) FROM blobs")[0][0]
    return int(rows)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_an_output_that_grows_every_iteration_is_stored_in_proportion_to_its_growth(kind: str, tmp_path: Path) -> None:
    sizes = {}
    for iterations in (60, 180):
        store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / f"{iterations}.db")
        reg = registry(agent=_agent, idle=lambda: None)
        _kernel, snap, events = run_flow(_transcript_flow(iterations), store=store, reg=reg)
        assert snap.status == "completed" and len(snap.outputs["agent"]["transcript"]) == iterations
        sizes[iterations] = _stored_bytes(store, snap.runId)
        completes = [e for e in events if isinstance(e, NodeComplete) and e.nodeId == "agent"]
        assert [len(e.output["transcript"]) for e in completes] == list(range(1, iterations + 1))
        assert completes[-1].output == snap.outputs["agent"]
    # Whole transcripts in every event would be 9x the bytes for 3x the iterations.
    assert sizes[180] < 3.6 * sizes[60]


def test_stored_bodies_of_large_payloads_are_packed_and_read_back_whole() -> None:
    live: list[bytes] = []
    store = MemoryStore()
    reg = registry(agent=_agent, idle=lambda: None)
    kernel = run_flow(_transcript_flow(40), store=store, reg=reg)[0]
    [run] = kernel.runs()
    raw = store._events[run.runId]
    assert any(b.startswith(PACKED_PREFIX) for b in raw)
    assert max(len(b) for b in raw[-20:]) < 3_000  # 40 messages of 110 bytes: 4.4 KB if stored whole
    whole = store.read_events(run.runId)
    assert not any(b.startswith(PACKED_PREFIX) for b in whole)
    for ev in kernel.events(run.runId):
        live.append(encode(ev))
    assert live == whole


def test_a_node_that_returns_a_list_it_keeps_changing_is_recorded_as_it_was_each_time() -> None:
    kept: list[dict[str, int]] = []

    def grow() -> list[dict[str, int]]:
        kept.append({"n": len(kept)})
        if len(kept) > 1:
            kept[0]["n"] += 100  # changes what an earlier output held
        return kept

    document = flow([py("g", "grow"), py("r", "idle")],
                    [{"from": "g", "to": "r"}, {"from": "r", "to": "g", "maxIterations": 50, "when": "$iteration < 49"}])
    _kernel, snap, events = run_flow(document, reg=registry(grow=grow, idle=lambda: None))
    outputs = [e.output for e in events if isinstance(e, NodeComplete) and e.nodeId == "g"]
    assert outputs[10][0] == {"n": 100 * 10}
    assert outputs[-1] == snap.outputs["g"] and snap.outputs["g"][0] == {"n": 100 * 49}
