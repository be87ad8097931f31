"""pytest plugin (entry point ``pytest11``): run flows offline from recorded fixtures.

``flowkernel`` fixture::

    def test_review_loop(flowkernel):
        result = flowkernel.run("flows/review-loop.json", {"feature": "csv export"},
                                fixtures="fixtures/review-loop")
        assert result.status == "completed"
        flowkernel.assert_events(result, ["node:complete planner", "loop:iterate", "flow:complete"])

Imports of the kernel happen when the fixture is used, so loading the plugin costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from flowkernel.testing.harness import FlowResult


class FlowTester:
    """What the ``flowkernel`` fixture gives a test: run flows, answer waits, assert on events.

    Runs use an in-memory store unless ``store`` is ``"file"`` (a SQLite file in the test's tmp dir).
    """

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path

    def _store(self, store: Any) -> Any:
        if store == "file":
            from flowkernel.store.sqlite import SqliteStore

            return SqliteStore(self.tmp_path / "flowkernel.db")
        return store

    def run(self, flow: str | Path | dict[str, Any], input: Any = None, *, fixtures: str | Path | None = None,
            replies: Sequence[Any] = (), store: Any = None, **options: Any) -> FlowResult:
        from flowkernel.testing.harness import run_flow

        return run_flow(flow, input, fixtures=fixtures, replies=replies, store=self._store(store), **options)

    async def arun(self, flow: str | Path | dict[str, Any], input: Any = None, *, fixtures: str | Path | None = None,
                   replies: Sequence[Any] = (), store: Any = None, **options: Any) -> FlowResult:
        from flowkernel.testing.harness import arun_flow

        return await arun_flow(flow, input, fixtures=fixtures, replies=replies, store=self._store(store), **options)

    def reply(self, result: FlowResult, node: str, answer: Any) -> FlowResult:
        from flowkernel.testing.harness import reply

        return reply(result, node, answer)

    def assert_events(self, result: FlowResult, expected: Sequence[str], *, exact: bool = False) -> None:
        from flowkernel.testing.harness import assert_event_sequence

        assert_event_sequence(result.events, expected, exact=exact)

    def types(self, result: FlowResult, node: str | None = None) -> list[str]:
        return result.types(node)


@pytest.fixture
def flowkernel(tmp_path: Path) -> FlowTester:
    """Run flows against fixture directories and inspect events, snapshot, outputs, messages, tool calls."""
    return FlowTester(tmp_path)
