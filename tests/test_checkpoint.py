"""Checkpoints cost what changed: large values are content-addressed, long lists chunked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from flowkernel.core.node_context import NodeContext
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.run.kernel import Kernel
from flowkernel.store.checkpoint import LEAF, decode_checkpoint, encode_checkpoint, load_checkpoint
from flowkernel.store.packing import FANOUT
from flowkernel.store.sql.sqlite import SqliteStore
from msgspec.structs import replace

from tests.helpers import flow, py, registry


def snapshot(state: dict[str, Any], outputs: dict[str, Any] | None = None) -> RunSnapshot:
    return RunSnapshot(runId="run_x", status="running", seq=1, flowHash="h", input={}, outputs=outputs or {},
                       state=state, nodeStatus={}, edgeStatus={}, loopCounters={}, inbox={}, agentSessions={},
                       nodeRuns={})


def test_round_trip_keeps_every_value_including_ones_that_look_like_markers() -> None:
    snap = snapshot({"items": [f"item {i} " + "x" * 90 for i in range(500)], "n": 3,
                     "tricky": {"$blob": "not a reference"}, "nested": {"$chunks": ["a"] * 200, "$tail": []},
                     "lit": {"$lit": {"$blob": "x"}}},
                    {"big": {"text": "y" * 5000}, "small": 1, "list": [{"$lit": i} for i in range(100)]})
    skeleton, blobs = encode_checkpoint(snap)
    assert decode_checkpoint(skeleton, lambda keys: {k: blobs[k] for k in keys}) == snap


def test_appending_to_a_long_list_stores_a_block_only_when_one_fills_up() -> None:
    items = [f"entry {i} " + "z" * 90 for i in range(20 * LEAF * FANOUT + LEAF - 1)]
    _, before = encode_checkpoint(snapshot({"items": items}, {"out": "o" * 10_000}))
    skeleton, after = encode_checkpoint(snapshot({"items": [*items, "one more"]}, {"out": "o" * 10_000}))
    assert len(set(after) - set(before)) == 1  # exactly the leaf that filled
    _, later = encode_checkpoint(snapshot({"items": [*items, "one more", "and one"]}, {"out": "o" * 10_000}))
    assert set(later) == set(after)  # a partial tail lives in the skeleton: no new blob, none left behind
    assert len(skeleton) < 3_000
    assert sum(len(v) for v in after.values()) > 100_000  # what rewriting everything would have cost


def test_a_resumed_run_reads_its_chunked_state_back(tmp_path: Path) -> None:
    def grow(ctx: NodeContext, n: int) -> int:
        for i in range(n):
            ctx.patch_state("append", "log", f"line {i} " + "w" * 120)
        return n

    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), registry=registry(grow=grow))
    snap = anyio.run(kernel.run, kernel.compile(flow([py("g", "grow", {"n": 700})], state={"initial": {"log": []}})), {})
    stored = load_checkpoint(kernel.store, snap.runId)
    assert stored is not None and stored[1] == snap
    assert len(stored[1].state["log"]) == 700
    assert replace(stored[1], state={}) == replace(snap, state={})
