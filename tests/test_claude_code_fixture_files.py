"""A claude.code fixture file that is not a regular file is refused at once, never opened and waited on."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from flowkernel.fixtures.files import FixtureError
from flowkernel.fixtures.sessions import FixtureSessionQuery


def _calls_in_a_thread(query: FixtureSessionQuery, node_id: str) -> BaseException | None:
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            query.calls(node_id)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive(), "reading the fixture blocked"
    return outcome[0]


def test_a_fifo_named_as_a_claude_code_fixture_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fix.json")
    error = _calls_in_a_thread(FixtureSessionQuery(tmp_path), "fix")
    assert isinstance(error, FixtureError) and "not a regular file (a FIFO)" in str(error), error


def test_a_missing_claude_code_fixture_says_how_to_record_one(tmp_path: Path) -> None:
    with pytest.raises(FixtureError, match=r"no fixture for claude\.code node 'fix'.*record"):
        FixtureSessionQuery(tmp_path).calls("fix")
