"""claude.agent across interruptions: a human wait, a pause, a SIGKILL, and a send mid-run.

In each, the next request's ``messages`` must equal the stored conversation plus what was delivered.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from flowkernel.core.commands import Command
from flowkernel.core.events import AgentTool, BaseEvent, NodeStart
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, held, reply

from tests.claude_support import agent_events, agent_flow, make_kernel, sent, stored_conversation


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


async def test_ask_human_waits_and_the_reply_becomes_the_tool_result(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("ask_human", {"question": "Which colour?"}, id="tu_ask")), reply(Text("Blue it is.")))
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="Paint it", tools=["ask_human"])), {})

    assert snap.status == "waiting"
    waiting = snap.waiting["agent"]
    assert waiting.prompt == "Which colour?"
    assert fake.request_count == 1

    # a new process (a new Kernel on the same file) answers and resumes
    other = make_kernel(tmp_path, fake)
    await other.command(snap.runId, Command(kind="reply", target=waiting.runId, content="blue"))
    final = await other.resume(snap.runId)

    assert final.status == "completed" and final.outputs["agent"]["text"] == "Blue it is."
    assert final.nodeRuns["agent"] != waiting.runId
    assert final.outputs["agent"]["sessionId"] == snap.agentSessions["agent"]
    second = sent(fake.requests[1].body)["messages"]
    assert second[:2] == sent(fake.requests[0].body)["messages"] + [second[1]]
    assert second[-1] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "tu_ask", "content": "blue"}]}
    assert second == stored_conversation(other, final.agentSessions["agent"])[:3]
    starts = [e for e in other.events(snap.runId) if isinstance(e, NodeStart)]
    assert starts[-1].resumedFrom == waiting.runId
    asked = [e for e in agent_events(other, snap.runId) if isinstance(e, AgentTool)]
    assert [(e.toolName, e.toolOutput) for e in asked] == [("ask_human", "blue")]


async def test_pause_mid_conversation_then_resume_sends_the_stored_conversation_plus_the_message(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    gate = threading.Event()  # never set: the second call hangs until the pause cancels it
    fake.script(reply(ToolUse("echo", {"text": "one"}, id="tu_1")), held(reply(Text("unused")), release=gate),
                reply(Text("Resumed answer")))
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("echo", lambda text: text)
    flow = kernel.compile(agent_flow(prompt="Echo one", tools=["echo"]))
    run_id = kernel.create_run(flow, {})

    async with anyio.create_task_group() as tg:
        result: list[object] = []

        async def execute() -> None:
            result.append(await kernel.execute(run_id))

        tg.start_soon(execute)
        await fake.wait_for_requests_async(2)
        await kernel.command(run_id, Command(kind="pause"))
    paused = result[0]
    assert getattr(paused, "status", None) == "paused"

    final = await kernel.resume(run_id, "please go on")
    assert final.status == "completed" and final.outputs["agent"]["text"] == "Resumed answer"
    interrupted = sent(fake.requests[1].body)["messages"]
    resumed = sent(fake.requests[2].body)["messages"]
    assert resumed == [*interrupted, {"role": "user", "content": "please go on"}]
    session = final.agentSessions["agent"]
    assert resumed == stored_conversation(kernel, session)[:-1]  # everything stored, minus the new answer
    # steps count across the two node runs
    rows = kernel.store.list_agent_messages(session_id=session)
    assert [r["step"] for r in rows if r["role"] == "assistant"] == [1, 2]


async def test_send_to_a_running_agent_arrives_at_the_next_turn_boundary(tmp_path: Path,
                                                                         fake: FakeAnthropic) -> None:
    tool_started = anyio.Event()
    tool_release = anyio.Event()

    async def slow(job: str) -> str:
        """Does a slow job."""
        tool_started.set()
        await tool_release.wait()
        return f"{job} done"

    fake.script(reply(ToolUse("slow", {"job": "build"}, id="tu_s")), reply(Text("Built, and noted.")))
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("slow", slow)
    node_runs: list[str] = []

    def on_event(ev: BaseEvent) -> None:
        if isinstance(ev, NodeStart) and ev.runId:
            node_runs.append(ev.runId)

    async with anyio.create_task_group() as tg:
        result: list[object] = []

        async def execute() -> None:
            result.append(await kernel.run(kernel.compile(agent_flow(prompt="Build", tools=["slow"])), {},
                                           on_event=on_event))

        tg.start_soon(execute)
        with anyio.fail_after(5):
            await tool_started.wait()
        run_id = kernel.runs()[0].runId
        await kernel.command(run_id, Command(kind="send", target=node_runs[0], content="Also update the docs"))
        tool_release.set()

    final = result[0]
    assert getattr(final, "status", None) == "completed"
    last = sent(fake.requests[1].body)["messages"][-1]
    assert last == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "tu_s", "content": "build done"},
        {"type": "text", "text": "Also update the docs"}]}
    assert kernel.snapshot(run_id).inbox == {}


CHILD = """
import sys, anyio
from flowkernel.agents.anthropic import AnthropicQuery
from flowkernel.run.kernel import Kernel
from flowkernel.plugins.registry import default_registry
from flowkernel.store.sql.sqlite import SqliteStore

db, base_url, run_id = sys.argv[1:4]
registry = default_registry().copy()
registry.add_tool("echo", lambda text: text)
kernel = Kernel(SqliteStore(db), registry=registry,
                services={"query_fn": AnthropicQuery(base_url=base_url, api_key="test", backoff_s=0.01)})
flow = kernel.compile({"name": "agent-test", "nodes": [{"id": "agent", "type": "claude.agent",
                       "input": {"prompt": "Echo twice", "tools": ["echo"]}}], "edges": []})
anyio.run(lambda: kernel.run(flow, {}, run_id=run_id))
"""


@pytest.mark.slow
async def test_sigkill_mid_conversation_and_resume_from_a_new_process(tmp_path: Path, fake: FakeAnthropic) -> None:
    gate = threading.Event()  # never set: the child is frozen in its third call when it is killed
    fake.script(reply(ToolUse("echo", {"text": "a"}, id="tu_a")), reply(ToolUse("echo", {"text": "b"}, id="tu_b")),
                held(reply(Text("unused")), release=gate), reply(Text("Finished after the crash")))
    db = tmp_path / "runs.db"
    run_id = "run_sigkilltest0000000001"
    root = str(Path(__file__).resolve().parents[1])
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(db), fake.base_url, run_id],
                             cwd=root, env={**os.environ, "PYTHONPATH": root},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        await fake.wait_for_requests_async(3, timeout=30)
    finally:
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate(timeout=10)
    assert child.returncode == -signal.SIGKILL, err.decode()

    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("echo", lambda text: text)
    assert kernel.snapshot(run_id).status == "running"  # it never stopped: it died
    final = await kernel.resume(run_id)

    assert final.status == "completed", final.faults
    assert final.outputs["agent"]["text"] == "Finished after the crash"
    before_crash = sent(fake.requests[2].body)["messages"]
    after_crash = sent(fake.requests[3].body)["messages"]
    assert after_crash == [*before_crash, {"role": "user", "content": "continue"}]
    assert json.dumps(after_crash) == json.dumps(stored_conversation(kernel, final.agentSessions["agent"])[:-1])


async def test_resume_past_the_cumulative_step_limit_is_refused_with_a_clear_error(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("ask_human", {"question": "Go on?"}, id="tu_q")), reply(Text("unused")))
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="x", tools=["ask_human"], maxTotalTurns=1)), {})
    await kernel.command(snap.runId, Command(kind="reply", target=snap.waiting["agent"].runId, content="yes"))
    final = await kernel.resume(snap.runId)

    assert final.status == "failed" and fake.request_count == 1
    fault = final.faults["agent"]
    assert fault.errorType == "error_max_turns"
    assert "cumulative limit is 1" in fault.message and "maxTotalTurns" in fault.message


async def test_the_default_query_honours_anthropic_base_url_and_api_key(
        tmp_path: Path, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowkernel.plugins.registry import default_registry
    from flowkernel.run.kernel import Kernel
    from flowkernel.store.sql.sqlite import SqliteStore

    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "from-env")
    fake.script(reply(Text("hi from env")))
    kernel = Kernel(SqliteStore(tmp_path / "env.db"), registry=default_registry().copy())  # no query_fn given
    snap = await kernel.run(kernel.compile(agent_flow(prompt="x")), {})
    assert snap.outputs["agent"]["text"] == "hi from env"
    headers = fake.requests[0].headers
    assert "from-env" in (headers.get("x-api-key", "") + headers.get("authorization", ""))
