"""The pytest plugin's ``flowkernel`` fixture, used as the README shows."""

from __future__ import annotations

from pathlib import Path

from flowkernel.testing.pytest_plugin import FlowTester

ROOT = Path(__file__).resolve().parent.parent


def test_review_loop_loops_once_then_passes(flowkernel: FlowTester) -> None:
    result = flowkernel.run(ROOT / "flows/review-loop.json", {"feature": "CSV export"},
                            fixtures=ROOT / "fixtures/review-loop")
    assert result.status == "completed"
    assert result.outputs["reviewer"]["structuredOutput"]["passed"] is True
    flowkernel.assert_events(result, ["node:complete planner", "node:complete reviewer", "loop:iterate",
                                      "node:complete coder", "node:complete reviewer", "flow:complete"])
    assert [m["role"] for m in result.messages if m["nodeId"] == "coder"] == ["user", "assistant"] * 2


def test_approval_waits_then_completes_after_replies(flowkernel: FlowTester) -> None:
    result = flowkernel.run(ROOT / "flows/approval.json", {"topic": "dark mode in the settings page"},
                            fixtures=ROOT / "fixtures/approval", store="file")
    assert result.status == "waiting"
    result = flowkernel.reply(result, "review", "Mention that it ships on Friday.")
    result = flowkernel.reply(result, "review", "approve")
    assert result.status == "completed"
    assert "Friday" in result.outputs["publish"]["announcement"]
