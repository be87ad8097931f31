"""Agent runs (DESIGN §10): one row per node run of a ``claude.agent`` node, kept by the run's commits.

Agents run through the real ``anthropic`` client against the loopback fake of the Messages API, on a
real SQLite file. Every row must equal the fold of its run's log (``fold_agent_runs``): the replay
audit (conftest) checks that after every test in the suite, and the last test here shows it notices.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.commands import Command
from flowkernel.core.events import AgentUsage
from flowkernel.history.agent_runs import fold_agent_runs
from flowkernel.run.kernel import Kernel
from flowkernel.run.timetravel import create_fork
from flowkernel.store.base import AgentRun
from flowkernel.testing.audit import audit_run
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, held, reply

from tests.claude_support import agent_flow, make_kernel

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


def agent_runs(kernel: Kernel, **filters: Any) -> list[AgentRun]:
    """Oldest first."""
    return [r for _, r in reversed(kernel.store.list_agent_runs(limit=10_000, **filters))]


def test_an_agent_run_carries_its_steps_usage_cost_and_final_text(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("echo", {"text": "a"}), input_tokens=100, output_tokens=20,
                      cache_creation_input_tokens=1000),
                reply(Text("all done"), input_tokens=30, output_tokens=5, cache_read_input_tokens=1000))
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("echo", lambda text: text)
    snap = anyio.run(kernel.run, kernel.compile(agent_flow(prompt="go", tools=["echo"], maxTurns=7,
                                                           model="claude-sonnet-4-6")), {})
    assert snap.status == "completed"
    [row] = agent_runs(kernel)
    calls = [e for e in kernel.events(snap.runId) if isinstance(e, AgentUsage)]
    assert row.agentRunId == snap.nodeRuns["agent"] and row.runId == snap.runId and row.agentId == "agent"
    assert (row.status, row.stepCount, row.maxSteps, row.attempt) == ("completed", 2, 7, 1)
    assert row.sessionId == snap.agentSessions["agent"] and row.model == "claude-sonnet-4-6"
    assert row.usage == {"inputTokens": 130, "outputTokens": 25, "cacheCreationInputTokens": 1000,
                         "cacheReadInputTokens": 1000}
    assert row.totalCostUsd == calls[0].costUsd + calls[1].costUsd == snap.totalCostUsd
    assert row.summary == "all done" and row.errorMessage is None and row.resumedFrom is None
    assert row.completedAt is not None and row.durationMs == row.completedAt - row.createdAt >= 0
    assert row.parentRunId is None
    # The messages of the agent run are those stored under its id.
    messages = kernel.store.list_agent_messages(run_id=row.agentRunId)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]


def test_a_failed_attempt_and_its_retry_are_two_agent_runs(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Text("not json"), input_tokens=10, output_tokens=1),
                reply(Text('{"ok": true}'), input_tokens=20, output_tokens=2))
    kernel = make_kernel(tmp_path, fake)
    flow = {"name": "retrying", "nodes": [{"id": "agent", "type": "claude.agent",
                                           "input": {"prompt": "JSON please", "outputSchema": {"type": "object"},
                                                     "outputRetries": 0, "session": "fresh"},
                                           "policy": {"retry": {"maxAttempts": 2, "backoffMs": 1}}}]}
    snap = anyio.run(kernel.run, kernel.compile(flow), {})
    assert snap.status == "completed"
    first, second = agent_runs(kernel, run_id=snap.runId)
    assert (first.status, first.attempt, first.stepCount) == ("failed", 1, 1)
    assert first.errorMessage and "outputSchema" in first.errorMessage
    assert first.usage["inputTokens"] == 10 and first.completedAt is not None
    assert (second.status, second.attempt, second.stepCount) == ("completed", 2, 1)
    assert second.agentRunId == snap.nodeRuns["agent"] and second.usage["inputTokens"] == 20
    assert first.totalCostUsd + second.totalCostUsd == snap.totalCostUsd
    assert [r.agentRunId for r in agent_runs(kernel, status="failed")] == [first.agentRunId]


async def test_a_paused_agent_run_is_interrupted_and_the_resume_continues_it_in_a_new_one(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    gate = threading.Event()  # never set: the second call hangs until the pause cancels it
    fake.script(reply(ToolUse("echo", {"text": "one"}, id="tu_1"), input_tokens=5, output_tokens=1),
                held(reply(Text("unused")), release=gate), reply(Text("Resumed answer"), input_tokens=7))
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("echo", lambda text: text)
    run_id = kernel.create_run(kernel.compile(agent_flow(prompt="Echo one", tools=["echo"])), {})
    async with anyio.create_task_group() as tg:
        tg.start_soon(kernel.execute, run_id)
        await fake.wait_for_requests_async(2)
        # The first step's rows are committed with the run's next commit (observability commits are
        # grouped), which may come just after the second call went out: wait for it, with a deadline.
        with anyio.fail_after(30):
            while (running := agent_runs(kernel)[0]).stepCount < 1:
                await anyio.sleep(0.01)
        assert (running.status, running.stepCount, running.completedAt) == ("running", 1, None)
        await kernel.command(run_id, Command(kind="pause"))
    [interrupted] = agent_runs(kernel)
    assert interrupted.status == "interrupted" and interrupted.completedAt is not None

    final = await kernel.resume(run_id, "please go on")
    assert final.status == "completed"
    old, new = agent_runs(kernel)
    assert old == interrupted
    assert (new.status, new.resumedFrom, new.stepCount, new.summary) == ("completed", old.agentRunId, 1,
                                                                          "Resumed answer")
    assert new.sessionId == old.sessionId and new.usage["inputTokens"] == 7


async def test_an_agent_waiting_for_a_human_waits_until_the_reply_continues_it(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("ask_human", {"question": "Which colour?"}, id="tu_ask")), reply(Text("Blue.")))
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="Paint it", tools=["ask_human"])), {})
    [waiting] = agent_runs(kernel)
    assert waiting.status == "waiting" and waiting.completedAt is None
    await kernel.reply(snap.runId, snap.waiting["agent"].runId, "blue")
    old, new = agent_runs(kernel)
    assert old.agentRunId == waiting.agentRunId and old.status == "interrupted"
    assert (new.status, new.resumedFrom) == ("completed", old.agentRunId)


def test_foreach_items_are_agent_runs_and_child_runs_name_their_parent(tmp_path: Path,
                                                                      fake: FakeAnthropic) -> None:
    child = {"name": "child", "nodes": [{"id": "inner", "type": "claude.agent", "input": {"prompt": "inner"}}]}
    (tmp_path / "child.json").write_text(json.dumps(child))
    parent = {"name": "parent", "nodes": [
        {"id": "list", "type": "transform", "input": {"expr": "[1, 2, 3]"}},
        {"id": "each", "type": "claude.agent", "input": {"prompt": "item {{ n }}"}},
        {"id": "call", "type": "flow.call", "input": {"flow": "child.json"}}],
        "edges": [{"from": "list", "to": "each", "forEach": {"in": "list", "as": "n"}},
                  {"from": "each", "to": "call"}]}
    (tmp_path / "parent.json").write_text(json.dumps(parent))
    fake.script(*(reply(Text(f"r{i}")) for i in range(4)))
    kernel = make_kernel(tmp_path, fake)
    snap = anyio.run(kernel.run, kernel.load_flow(tmp_path / "parent.json"), {})
    assert snap.status == "completed"
    items = agent_runs(kernel, run_id=snap.runId)
    assert sorted(r.item for r in items if r.item is not None) == [0, 1, 2] and len(items) == 3
    assert all(r.agentId == "each" and r.status == "completed" and r.stepCount == 1 for r in items)
    [kid] = kernel.runs(parent=snap.runId)
    [inner] = agent_runs(kernel, parent_run_id=snap.runId)
    assert (inner.runId, inner.agentId, inner.parentRunId) == (kid.runId, "inner", snap.runId)
    assert [r.agentRunId for r in agent_runs(kernel, agent_id="inner")] == [inner.agentRunId]


async def test_aborting_a_waiting_run_interrupts_its_agent_and_a_fork_keeps_its_own_copy(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("ask_human", {"question": "Which colour?"}, id="tu_ask")))
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="Paint it", tools=["ask_human"])), {})
    fork = create_fork(kernel, snap.runId, snap.seq)
    await kernel.command(snap.runId, Command(kind="abort", reason="enough"))
    [original] = agent_runs(kernel, run_id=snap.runId)
    [copy] = agent_runs(kernel, run_id=fork)
    assert original.status == "interrupted" and original.completedAt is not None
    # The fork replays the node run it copied (same node run id), still waiting there.
    assert copy.agentRunId == original.agentRunId and copy.status == "waiting"


def test_the_audit_notices_an_agent_run_that_disagrees_with_the_log(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Text("hi"), input_tokens=3))
    kernel = make_kernel(tmp_path, fake)
    snap = anyio.run(kernel.run, kernel.compile(agent_flow(prompt="hi")), {})
    flow = kernel.flow_of(snap.runId)
    assert [r.agentRunId for r in fold_agent_runs(flow, kernel.events(snap.runId), agent_types=kernel.registry)] == \
        [snap.nodeRuns["agent"]]
    audit_run(kernel.store, snap.runId)
    raw = sqlite3.connect(tmp_path / "runs.db")
    raw.execute("UPDATE agent_runs SET input_tokens = 4")
    raw.commit()
    with pytest.raises(AssertionError, match="agent run"):
        audit_run(kernel.store, snap.runId)
    raw.execute("DELETE FROM agent_runs")
    raw.commit()
    with pytest.raises(AssertionError, match="agent run"):
        audit_run(kernel.store, snap.runId)
    raw.execute("DELETE FROM runs")  # keep the conftest audit away from the damage
    raw.commit()
    raw.close()
