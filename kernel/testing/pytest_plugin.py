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
        self.results: dict[str, FlowResult] = {}  # run id -> its latest result, for a failed test's report

    def _seen(self, result: FlowResult) -> FlowResult:
        self.results[result.run_id] = result
        return result

    def why_stopped(self) -> str:
        """Why each run of this test that did not complete stopped (the failed test's report section)."""
        out = []
        for result in self.results.values():
            try:
                result.assert_completed()
            except AssertionError as exc:
                out.append(str(exc))
        return "\n".join(out)

    def _store(self, store: Any) -> Any:
        if store == "file":
            from flowkernel.store.sql.sqlite import SqliteStore

            return SqliteStore(self.tmp_path / "flowkernel.db")
        return store

    def run(self, flow: str | Path | dict[str, Any], input: Any = None, *, fixtures: str | Path | None = None,
            replies: Sequence[Any] = (), store: Any = None, **options: Any) -> FlowResult:
        from flowkernel.testing.harness import run_flow

        return self._seen(run_flow(flow, input, fixtures=fixtures, replies=replies, store=self._store(store),
                                   **options))

    async def arun(self, flow: str | Path | dict[str, Any], input: Any = None, *, fixtures: str | Path | None = None,
                   replies: Sequence[Any] = (), store: Any = None, **options: Any) -> FlowResult:
        from flowkernel.testing.harness import arun_flow

        return self._seen(await arun_flow(flow, input, fixtures=fixtures, replies=replies, store=self._store(store),
                                          **options))

    def reply(self, result: FlowResult, node: str, answer: Any) -> FlowResult:
        from flowkernel.testing.harness import reply

        return self._seen(reply(result, node, answer))

    def assert_events(self, result: FlowResult, expected: Sequence[str], *, exact: bool = False) -> None:
        from flowkernel.testing.harness import assert_event_sequence

        assert_event_sequence(result.events, expected, exact=exact)

    def types(self, result: FlowResult, node: str | None = None) -> list[str]:
        return result.types(node)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test that ran flows gets a report section saying why each run that did not complete
    stopped (a fixture mismatch's differing paths, what a waiting run waits for): a bare ``assert
    result.status == "completed"`` shows no more than ``'failed' == 'completed'``."""
    outcome = yield
    report = outcome.get_result()
    tester = getattr(item, "funcargs", {}).get("flowkernel")
    if report.when == "call" and report.failed and isinstance(tester, FlowTester):
        why = tester.why_stopped()
        if why:
            report.sections.append(("flowkernel: runs that did not complete", why))


@pytest.fixture
def flowkernel(tmp_path: Path) -> FlowTester:
    """Run flows against fixture directories and inspect events, snapshot, outputs, messages, tool calls."""
    return FlowTester(tmp_path)
