"""A ``claude.code`` session's cost and budgets, with the real CLI against the fake Messages API.

WHEN a session's model calls cost more than the run's ``budget.maxCostUsd`` THEN the run pauses for its
budget (each call's cost counts as it is made) and ``resume --budget`` continues the same session.
WHEN a node's ``maxBudgetUsd`` (the SDK's own cap) is reached THEN the node fails with an ``agent:error``
whose ``errorType`` is the SDK's ``error_max_budget_usd``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flowkernel.core.events import AgentUsage, FlowPaused
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, reply

from tests.claude_code_support import cli_kernel, code_flow, require_cli


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        require_cli(f)
        yield f


async def test_a_session_over_the_run_budget_pauses_and_resume_budget_continues_it(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("Bash", {"command": "echo costly"}, id="toolu_1")), reply(Text("Done in budget.")))
    kernel = cli_kernel(tmp_path, fake)
    document = {**code_flow(prompt="Spend a little", allowedTools=["Bash"]), "budget": {"maxCostUsd": 0.0001}}
    paused = await kernel.run(kernel.compile(document), {})
    assert paused.status == "paused", [e for e in kernel.events(paused.runId) if e.type.endswith("error")]
    [pause] = [e for e in kernel.events(paused.runId) if isinstance(e, FlowPaused)]
    assert pause.reason == "budget" and pause.costUsd is not None and pause.costUsd > 0.0001
    session = paused.agentSessions["code"]

    final = await kernel.resume(paused.runId, "go on", budget=1.0)
    assert final.status == "completed" and final.outputs["code"]["text"] == "Done in budget."
    assert final.agentSessions["code"] == session
    assert {r.headers.get("x-claude-code-session-id") for r in fake.requests} == {session}
    usages = [e for e in kernel.events(final.runId) if isinstance(e, AgentUsage)]
    assert len(usages) == fake.request_count == 2
    assert final.totalCostUsd == pytest.approx(sum(u.costUsd for u in usages))


async def test_max_budget_usd_is_the_sdk_cap_and_its_result_an_agent_error(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("Bash", {"command": "echo never"}, id="toolu_1")), reply(Text("unreached")))
    kernel = cli_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(code_flow(prompt="Spend", allowedTools=["Bash"], maxBudgetUsd=0.00001)),
                            {})
    assert snap.status == "failed"
    events = kernel.events(snap.runId)
    assert [e.errorType for e in events if e.type == "agent:error"] == ["error_max_budget_usd"]
    [error] = [e for e in events if e.type == "node:error"]
    assert error.errorType == "error_max_budget_usd" and "budget" in error.message
    assert snap.totalCostUsd > 0  # what the capped call cost still counts
