"""The Kernel and the run loop append events the one same way (``flowkernel.run.append``).

Commands judged while no execution holds the run are appended and committed at once
(``append_now``); what they store is byte for byte what it was before that path was shared with the
run loop (timestamps aside), and the snapshot after them is the fold of the log. So is a run's first
event, its ``flow:start`` (``Appender.start``), when a run is created, started by a worker or forked,
and the ``flow:complete`` that ends a rerun cut short.
"""

from __future__ import annotations

import ast
import json
import re
import time
from pathlib import Path
from typing import Any, get_args

import anyio
from flowkernel.core.commands import Command
from flowkernel.core.events import Event, FlowComplete, FlowStart, RerunOutcome, encode
from flowkernel.core.reducer import fold
from flowkernel.errors import CommandRejectedError
from flowkernel.run.kernel import Kernel
from flowkernel.run.timetravel import create_fork, create_rerun, execute_rerun
from flowkernel.store.sql.sqlite import SqliteStore

from tests.helpers import flow, registry


def _masked(body: bytes, run_id: str) -> str:
    text = body.decode().replace(run_id, "RUN")
    return re.sub(r'"timestamp":\d+', '"timestamp":T', text)


def test_commands_append_the_same_bytes_through_the_one_path(tmp_path: Path) -> None:
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), registry=registry())
    try:
        compiled = kernel.compile(flow([{"id": "a", "type": "noop"}]))
        run_id = kernel.create_run(compiled, {"x": 1})
        anyio.run(kernel.command, run_id, Command(kind="pause", reason="for a look"))
        try:
            anyio.run(kernel.command, run_id, Command(kind="pause"))
        except CommandRejectedError:
            pass  # already paused: refused, and the refusal recorded
        anyio.run(kernel.command, run_id, Command(kind="abort", reason="enough"))
        stored = [_masked(b, run_id) for b in kernel.stored_events(run_id)]
        assert stored[1:] == [
            '{"type":"command:received","command":"pause","accepted":true,"seq":2,"timestamp":T,"flowRunId":"RUN"}',
            '{"type":"flow:paused","reason":"for a look","seq":3,"timestamp":T,"flowRunId":"RUN"}',
            '{"type":"command:received","command":"pause","accepted":false,"reason":"run RUN is paused; only a '
            'running run can pause","refusal":"conflict","seq":4,"timestamp":T,"flowRunId":"RUN"}',
            '{"type":"command:received","command":"abort","accepted":true,"seq":5,"timestamp":T,"flowRunId":"RUN"}',
            '{"type":"flow:complete","status":"aborted","error":"enough","seq":6,"timestamp":T,"flowRunId":"RUN"}',
        ]
        snap = kernel.snapshot(run_id)
        assert snap.status == "aborted" and snap.seq == 6
        assert fold(compiled, kernel.events(run_id)) == snap
    finally:
        kernel.close()


def _start_as_stored_before(kernel: Kernel, run_id: str, **fields: Any) -> bytes:
    """A ``flow:start`` encoded as run creation built it by hand before it went through the one path."""
    stored = kernel.stored_events(run_id)[0]
    timestamp = json.loads(stored)["timestamp"]
    return encode(FlowStart(seq=1, timestamp=timestamp, flowRunId=run_id, **fields))


def test_a_new_run_s_flow_start_is_stored_as_it_was_before_the_one_path(tmp_path: Path) -> None:
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), registry=registry())
    try:
        compiled = kernel.compile(flow([{"id": "a", "type": "noop"}], state={"initial": {"seen": [1]}}))
        parent = kernel.create_run(compiled, {"x": 1})
        child = kernel.create_run(compiled, {"y": [1, {"z": None}]}, parent_run_id=parent, parent_node_run_id="nr_1")
        assert kernel.stored_events(parent)[0] == _start_as_stored_before(
            kernel, parent, flowName="t", flowHash=compiled.hash, input={"x": 1})
        assert kernel.stored_events(child)[0] == _start_as_stored_before(
            kernel, child, flowName="t", flowHash=compiled.hash, input={"y": [1, {"z": None}]},
            parentRunId=parent, parentNodeRunId="nr_1")
        assert _masked(kernel.stored_events(child)[0], child).replace(parent, "PARENT") == (
            '{"type":"flow:start","flowName":"t","flowHash":"' + compiled.hash + '","input":{"y":[1,{"z":null}]},'
            '"parentRunId":"PARENT","parentNodeRunId":"nr_1","seq":1,"timestamp":T,"flowRunId":"RUN"}')
        # The snapshot stored with it is the fold of it, with a state of its own (not the flow's lists).
        snap = kernel.snapshot(child)
        assert snap == fold(compiled, kernel.events(child)) and snap.seq == 1 and snap.state == {"seen": [1]}
        assert snap.state["seen"] is not compiled.initial_state["seen"]
    finally:
        kernel.close()


def test_a_queued_run_s_flow_start_written_by_its_worker_is_stored_as_before(tmp_path: Path) -> None:
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), registry=registry())
    try:
        compiled = kernel.compile(flow([{"id": "a", "type": "noop"}]))
        run_id = kernel.enqueue(compiled, {"x": "é"})
        claim = kernel.store.claim_runs("elsewhere:1:x", int(time.time() * 1000), 100, 1)[0]
        created = kernel.creation.start_queued(compiled, kernel.store.get_run(run_id), claim.lease)
        assert kernel.stored_events(run_id) == [_start_as_stored_before(
            kernel, run_id, flowName="t", flowHash=compiled.hash, input={"x": "é"})]
        assert created.first == kernel.events(run_id)[0] and created.snapshot == kernel.snapshot(run_id)
    finally:
        kernel.close()


def test_a_fork_s_flow_start_is_new_and_its_copies_keep_the_original_s_seq_and_time(tmp_path: Path) -> None:
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), registry=registry())
    try:
        compiled = kernel.compile(flow([{"id": "a", "type": "noop"}, {"id": "b", "type": "noop"}],
                                       [{"from": "a", "to": "b"}]))
        run_id = anyio.run(kernel.run, compiled, {"x": 1}).runId
        fork_id = create_fork(kernel, run_id, 4)
        forked, source = kernel.stored_events(fork_id), kernel.stored_events(run_id)
        assert forked[0] == _start_as_stored_before(kernel, fork_id, flowName="t", flowHash=compiled.hash,
                                                    input={"x": 1}, forkedFrom=run_id, forkedAt=4)
        assert forked[1:] == [b.replace(run_id.encode(), fork_id.encode()) for b in source[1:4]]
    finally:
        kernel.close()


def test_a_rerun_cut_short_ends_with_a_flow_complete_stored_as_before(tmp_path: Path) -> None:
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), registry=registry())
    try:
        compiled = kernel.compile(flow([{"id": "q", "type": "human.input", "input": {"prompt": "Which?"}},
                                        {"id": "done", "type": "transform", "input": {"expr": "q"}}],
                                       [{"from": "q", "to": "done"}]))
        run_id = anyio.run(kernel.run, compiled, None).runId
        assert kernel.snapshot(run_id).status == "waiting"
        rerun_id = create_rerun(kernel, run_id)
        claim = kernel.store.claim_runs("elsewhere:1:x", int(time.time() * 1000), 100, 1)[0]
        snap = anyio.run(execute_rerun, kernel, rerun_id, claim.lease)
        assert snap.status == "aborted" and snap == kernel.snapshot(rerun_id)
        last = kernel.events(rerun_id)[-1]
        assert isinstance(last, FlowComplete) and last.seq == len(kernel.stored_events(rerun_id))
        assert kernel.stored_events(rerun_id)[-1] == encode(FlowComplete(
            seq=last.seq, timestamp=last.timestamp, flowRunId=rerun_id, status="aborted",
            error="a rerun ends where its recording does: the re-execution stopped waiting here",
            rerun=RerunOutcome(of=run_id, matches=True)))
        assert fold(compiled, kernel.events(rerun_id)) == snap
    finally:
        kernel.close()


ROOT = Path(__file__).resolve().parents[1]
EVENT_TYPES = frozenset(cls.__name__ for cls in get_args(Event))
# Where an event is given its seq or time other than by the append path, and why that is right there.
STAMPED_ELSEWHERE = {
    # A queued run has no event yet: the flow:start (seq 0) it reads as is never stored.
    "kernel/run/reads.py",
}


def stamping(sources: dict[str, str]) -> list[str]:
    """Where code other than ``run/append.py`` gives an event its ``seq`` or ``timestamp``."""
    found = []
    for path, source in sorted(sources.items()):
        if path == "kernel/run/append.py" or path in STAMPED_ELSEWHERE:
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in EVENT_TYPES:
                found += [f"{path}:{node.lineno} {node.func.id}({k.arg}=…)" for k in node.keywords
                          if k.arg in ("seq", "timestamp")]
            elif isinstance(node, ast.Assign) and path.startswith("kernel/run/"):
                found += [f"{path}:{node.lineno} .{t.attr} =" for t in node.targets
                          if isinstance(t, ast.Attribute) and t.attr in ("seq", "timestamp")]
    return sorted(found)


def _package_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
            for folder in ("kernel", "nodes") for p in (ROOT / folder).rglob("*.py")}


def test_only_the_append_path_stamps_an_event() -> None:
    assert stamping(_package_sources()) == []


def test_an_event_stamped_by_hand_is_reported() -> None:
    planted = ("def end(run_id, seq):\n    ev = FlowComplete(seq=seq + 1, timestamp=now_ms(), status='failed')\n"
               "    ev.seq = seq\n    return ev\n")
    assert stamping({**_package_sources(), "kernel/run/planted.py": planted}) == [
        "kernel/run/planted.py:2 FlowComplete(seq=…)", "kernel/run/planted.py:2 FlowComplete(timestamp=…)",
        "kernel/run/planted.py:3 .seq ="]
