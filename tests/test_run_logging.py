"""What the run loop says through ``logging`` (logger ``flowkernel.run``) rather than on stderr."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import anyio
import pytest
from flowkernel.core.events import BaseEvent
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

