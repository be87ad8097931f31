"""Tool calls of claude.agent: a stable idempotency key per call, at most ``maxParallelTools`` at a time,
and across a crash every stored result kept, none run again, the calls cut short run once more."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from flowkernel.agents.tools import ToolContext, make_tool
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, held, reply

from tests.claude_support import agent_flow, make_kernel, sent
from tests.idempotent_tools import calls, register
from tests.mcp_support import http_server, recorded_calls

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


def test_a_tool_context_parameter_is_not_part_of_the_input_schema() -> None:
    def pay(invoice: str, ctx: ToolContext) -> str:
        """Pay an invoice."""
        return ctx.idempotency_key

    made = make_tool(pay)
    assert made.input_schema["properties"] == {"invoice": {"type": "string"}}
    assert made.input_schema["required"] == ["invoice"]


async def test_python_and_mcp_tools_get_the_node_run_and_tool_use_as_their_key(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    folder, server = tmp_path / "calls", tmp_path / "server"
    folder.mkdir()
    server.mkdir()
    fake.script(reply(ToolUse("fast", {"text": "x"}, id="tu_py"), ToolUse("mcp__s__record", {"text": "y"}, id="tu_mcp")),
                reply(Text("done")))
    kernel = make_kernel(tmp_path, fake)
    register(kernel.registry, folder)
    with http_server(server) as url:
        snap = await kernel.run(kernel.compile(agent_flow(prompt="go", tools=["fast", "mcp__s__record"],
                                                          mcpServers={"s": {"url": url}})), {})

    assert snap.status == "completed", snap.faults
    node_run = snap.nodeRuns["agent"]
    assert [(c["tool"], c["key"]) for c in calls(folder)] == [("fast", f"{node_run}:tu_py")]
    assert recorded_calls(server) == [{"text": "y", "key": f"{node_run}:tu_mcp"}], "in the request's _meta"
    assert "fast" in [t["name"] for t in sent(fake.requests[0].body)["tools"]]


async def test_max_parallel_tools_bounds_the_calls_of_a_turn_and_results_keep_their_order(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    running, most = 0, 0

    async def work(n: int) -> str:
        """Works on n."""
        nonlocal running, most
        running += 1
        most = max(most, running)
        await anyio.sleep(0.05 * (4 - n))  # the later ones finish first
        running -= 1
        return f"done {n}"

    fake.script(reply(*(ToolUse("work", {"n": n}, id=f"tu_{n}") for n in range(4))), reply(Text("all done")))
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("work", work)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="go", tools=["work"], maxParallelTools=2)), {})

    assert snap.status == "completed", snap.faults
    assert most == 2
    assert sent(fake.requests[1].body)["messages"][-1]["content"] == [
        {"type": "tool_result", "tool_use_id": f"tu_{n}", "content": f"done {n}"} for n in range(4)]


CHILD = """
import sys, anyio
from pathlib import Path
from flowkernel.agents.anthropic import AnthropicQuery
from flowkernel.run.kernel import Kernel
from flowkernel.plugins.registry import default_registry
from flowkernel.store.sql.sqlite import SqliteStore
from tests.idempotent_tools import register

db, base_url, run_id, folder = sys.argv[1:5]
registry = default_registry().copy()
register(registry, Path(folder))
kernel = Kernel(SqliteStore(db), registry=registry,
                services={"query_fn": AnthropicQuery(base_url=base_url, api_key="test", backoff_s=0.01)})
flow = kernel.compile({"name": "agent-test", "nodes": [{"id": "agent", "type": "claude.agent",
                       "input": {"prompt": "Do both", "tools": ["fast", "slow"]}}], "edges": []})
anyio.run(lambda: kernel.run(flow, {}, run_id=run_id))
"""


async def _killed(tmp_path: Path, fake: FakeAnthropic, folder: Path, run_id: str, ready: object) -> None:
    """Run the flow in a child process and SIGKILL it once ``ready()`` says so."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "runs.db"), fake.base_url, run_id,
                              str(folder)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with anyio.fail_after(60):
            while not ready() and child.poll() is None:  # type: ignore[operator]
                await anyio.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate(timeout=10)
    assert child.returncode == -signal.SIGKILL, err.decode()


@pytest.mark.slow
async def test_a_kill_during_parallel_tool_calls_keeps_stored_results_and_runs_the_rest_once_with_their_keys(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    folder = tmp_path / "calls"
    folder.mkdir()
    run_id = "run_parallelkill000000001"
    fake.script(reply(ToolUse("fast", {"text": "a"}, id="tu_f"), ToolUse("slow", {"text": "b"}, id="tu_s")),
                reply(Text("both done")))

    def fast_stored_and_slow_running() -> bool:
        if not any(c["tool"] == "slow" for c in calls(folder)) or not (tmp_path / "runs.db").exists():
            return False
        store = SqliteStore(tmp_path / "runs.db")
        try:
            return [r["toolUseId"] for r in store.list_tool_calls(flow_run_id=run_id)] == ["tu_f"]
        finally:
            store.close()

    await _killed(tmp_path, fake, folder, run_id, fast_stored_and_slow_running)
    (folder / "release").touch()
    kernel = make_kernel(tmp_path, fake)
    register(kernel.registry, folder)
    final = await kernel.resume(run_id)

    assert final.status == "completed", final.faults
    logged = calls(folder)
    assert [c["tool"] for c in logged].count("fast") == 1, "a stored result is never run again"
    slow = [c["key"] for c in logged if c["tool"] == "slow"]
    assert len(slow) == 2 and slow[0] == slow[1] and slow[0].endswith(":tu_s"), "run again, with the same key"
    assert not slow[0].startswith(final.nodeRuns["agent"])
    assert sent(fake.requests[1].body)["messages"][-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "tu_f", "content": "fast a"},
        {"type": "tool_result", "tool_use_id": "tu_s", "content": "slow b"},
        {"type": "text", "text": "continue"}]
    rows = kernel.store.list_tool_calls(flow_run_id=run_id)
    assert [(r["toolUseId"], r["status"]) for r in rows] == [("tu_f", "completed"), ("tu_s", "completed")]


@pytest.mark.slow
async def test_a_kill_between_rounds_runs_no_stored_tool_call_again(tmp_path: Path, fake: FakeAnthropic) -> None:
    folder = tmp_path / "calls"
    folder.mkdir()
    (folder / "release").touch()
    run_id = "run_betweenrounds00000001"
    gate = threading.Event()  # never set: the child is frozen in its second model call when it is killed
    fake.script(reply(ToolUse("fast", {"text": "a"}, id="tu_1"), ToolUse("slow", {"text": "b"}, id="tu_2")),
                held(reply(Text("unused")), release=gate), reply(Text("finished")))

    await _killed(tmp_path, fake, folder, run_id, lambda: fake.request_count >= 2)
    kernel = make_kernel(tmp_path, fake)
    register(kernel.registry, folder)
    final = await kernel.resume(run_id)

    assert final.status == "completed", final.faults
    assert sorted(c["tool"] for c in calls(folder)) == ["fast", "slow"], "each ran once"
    before, after = (sent(fake.requests[i].body)["messages"] for i in (1, 2))
    assert after == [*before, {"role": "user", "content": "continue"}]
