"""What the run loop says through ``logging`` (logger ``flowkernel.run``) rather than on stderr."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.events import BaseEvent, StatePatch
from flowkernel.core.reducer import fold
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore

from tests.helpers import flow, registry


def test_a_failing_listener_is_logged_and_removed_and_the_run_completes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), registry=registry())
    seen: list[BaseEvent] = []

    def listener(ev: BaseEvent) -> None:
        seen.append(ev)
        raise RuntimeError("the screen went away")

    try:
        doc = flow([{"id": "a", "type": "noop"}, {"id": "b", "type": "noop"}], [{"from": "a", "to": "b"}])
        run_id = kernel.create_run(kernel.compile(doc), {})
        with caplog.at_level(logging.WARNING, logger="flowkernel.run"):
            snap = anyio.run(functools.partial(kernel.execute, run_id, on_event=listener))
        assert snap.status == "completed"
        assert len(seen) == 1, "a listener that failed is told nothing more"
        assert [e.type for e in kernel.events(run_id)][-1] == "flow:complete"
        [record] = [r for r in caplog.records if r.name == "flowkernel.run"]
        assert record.levelno == logging.WARNING
        assert record.getMessage() == f"stopped showing events of run {run_id}: RuntimeError('the screen went away')"
        assert "stopped showing" not in capsys.readouterr().err, "library code does not print"
    finally:
        kernel.close()


class _Patcher:
    """A node type that continues from its own progress (its state patches apply at once) and patches
    twice without waiting: the second is checked against the state before the first applied."""

    name = "test.patcher"
    cooperative_pause = True

    async def run(self, ctx: Any) -> Any:
        ctx.patch_state("set", "x", [1])
        ctx.patch_state("set", "x.y", 2)  # fine on the state it saw; x is a list once the first applies
        return "done"


def test_a_state_patch_that_cannot_apply_is_recorded_rejected_and_replays(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    reg = registry()
    reg.add_node_type(_Patcher())
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), registry=reg)
    try:
        compiled = kernel.compile(flow([{"id": "p", "type": "test.patcher"}, {"id": "after", "type": "noop"}],
                                       [{"from": "p", "to": "after"}]))
        with caplog.at_level(logging.WARNING, logger="flowkernel.run"):
            snap = anyio.run(kernel.run, compiled, {})
        assert snap.status == "completed"
        assert snap.state == {"x": [1]}, "the patch that could not apply changed nothing"
        events = kernel.events(snap.runId)
        patches = [e for e in events if isinstance(e, StatePatch)]
        assert [(p.path, p.rejected) for p in patches] == [
            ("x", None), ("x.y", "state.x is a list, not an object: cannot set state.x.y through it")]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert fold(compiled, events) == snap, "replaying the log, the rejected patch is a no-op again"
        [record] = [r for r in caplog.records if r.name == "flowkernel.run"]
        assert record.getMessage() == (f"run {snap.runId}: rejected a state patch from node p "
                                       f"(seq {patches[1].seq}): state.x is a list, not an object: cannot set state.x.y through it")
        assert capsys.readouterr().err == ""
    finally:
        kernel.close()
