"""The Kernel and the run loop append events the one same way (``flowkernel.run.append``).

Commands judged while no execution holds the run are appended and committed at once
(``append_now``); what they store is byte for byte what it was before that path was shared with the
run loop (timestamps aside), and the snapshot after them is the fold of the log.
"""

from __future__ import annotations

import re
from pathlib import Path

import anyio
from flowkernel.core.commands import Command
from flowkernel.core.reducer import fold
from flowkernel.errors import CommandRejectedError
from flowkernel.run.kernel import Kernel
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
