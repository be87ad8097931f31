"""claude.agent with MCP servers (``mcpServers``): real servers over stdio and streamable HTTP, the real
``anthropic`` client against the fake Messages API."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from flowkernel.core.commands import Command
from flowkernel.core.events import AgentError, AgentTool
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, held, reply

from tests.claude_support import agent_events, agent_flow, make_kernel, sent
from tests.mcp_support import alive, http_server, server_pids, stdio_server


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    out = tmp_path / "server"
    out.mkdir()
    return out


async def test_stdio_server_tools_join_the_node_and_their_calls_are_stored_and_evented(
        tmp_path: Path, fake: FakeAnthropic, folder: Path) -> None:
    fake.script(reply(ToolUse("mcp__files__read", {"path": "a.txt"}, id="tu_read"),
                      ToolUse("mcp__files__refuse", {"reason": "not today"}, id="tu_refuse")),
                reply(Text("alpha it is")))
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="Read a.txt",
                                                      mcpServers={"files": stdio_server(folder)})), {})

    assert snap.status == "completed", snap.faults
    assert snap.outputs["agent"]["text"] == "alpha it is"
    tools = {t["name"]: t for t in sent(fake.requests[0].body)["tools"]}
    assert set(tools) == {"mcp__files__read", "mcp__files__record", "mcp__files__refuse", "mcp__files__hang",
                          "mcp__files__crash"}
    assert tools["mcp__files__read"]["description"] == "Read a file of the test's fake file system."
    assert tools["mcp__files__read"]["input_schema"]["properties"]["path"]["type"] == "string"
    assert tools["mcp__files__read"]["input_schema"]["required"] == ["path"]
    results = sent(fake.requests[1].body)["messages"][-1]["content"]
    assert results[0] == {"type": "tool_result", "tool_use_id": "tu_read", "content": "alpha"}
    assert results[1]["tool_use_id"] == "tu_refuse" and results[1]["is_error"] is True
    assert "refused: not today" in results[1]["content"]
    rows = kernel.store.list_tool_calls(session_id=snap.agentSessions["agent"])
    calls = [e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentTool)]
    assert sorted((e.toolName, e.toolOutput, e.error is not None) for e in calls) == [
        ("mcp__files__read", "alpha", False),
        ("mcp__files__refuse", results[1]["content"], True)]
    assert all(e.durationMs >= 0 for e in calls)
    assert {(r["toolName"], r["status"]) for r in rows} == {("mcp__files__read", "completed"),
                                                            ("mcp__files__refuse", "error")}
    [pid] = server_pids(folder)
    assert not alive(pid), "the server stops with the node run"


async def test_http_server_tools_are_called_over_streamable_http(
        tmp_path: Path, fake: FakeAnthropic, folder: Path) -> None:
    fake.script(reply(ToolUse("mcp__search__read", {"path": "b.txt"}, id="tu_b")), reply(Text("bravo")))
    kernel = make_kernel(tmp_path, fake)
    with http_server(folder) as url:
        snap = await kernel.run(kernel.compile(agent_flow(
            prompt="Read b.txt", tools=["mcp__search__read"], mcpServers={"search": {"url": url}})), {})

    assert snap.status == "completed", snap.faults
    assert [t["name"] for t in sent(fake.requests[0].body)["tools"]] == ["mcp__search__read"]
    assert sent(fake.requests[1].body)["messages"][-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "tu_b", "content": "bravo"}]


async def test_naming_a_tool_the_server_does_not_offer_fails_the_node_saying_what_it_offers(
        tmp_path: Path, fake: FakeAnthropic, folder: Path) -> None:
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="x", tools=["mcp__files__write"],
                                                      mcpServers={"files": stdio_server(folder)})), {})

    assert snap.status == "failed" and fake.request_count == 0
    fault = snap.faults["agent"]
    assert fault.errorType == "invalid_input"
    assert "`tools` names 'mcp__files__write', but MCP server 'files' offers no such tool" in fault.message
    assert "mcp__files__read" in fault.message
    assert not any(alive(pid) for pid in server_pids(folder))


async def test_a_server_that_cannot_start_fails_the_node_naming_it_and_its_stderr(
        tmp_path: Path, fake: FakeAnthropic, folder: Path) -> None:
    kernel = make_kernel(tmp_path, fake)
    flow = {**agent_flow(prompt="x", mcpServers={"files": stdio_server(folder, MCP_TEST_FAIL_AT_START="1")})}
    flow["nodes"][0]["policy"] = {"retry": {"maxAttempts": 2, "backoffMs": 1}}
    snap = await kernel.run(kernel.compile(flow), {})

    assert snap.status == "failed" and fake.request_count == 0
    fault = snap.faults["agent"]
    assert fault.errorType == "error_mcp_server"
    assert "MCP server 'files' could not start" in fault.message
    assert "cannot open the database: permission denied" in fault.message
    errors = [e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentError)]
    assert [e.errorType for e in errors] == ["error_mcp_server"] * 2, "retry applies"
    assert errors[0].details["server"] == "files"
    assert len(server_pids(folder)) == 2


async def test_a_server_that_dies_mid_call_fails_the_node_with_its_stderr_tail(
        tmp_path: Path, fake: FakeAnthropic, folder: Path) -> None:
    fake.script(reply(ToolUse("mcp__files__crash", {}, id="tu_c")), reply(Text("unused")))
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="x", mcpServers={"files": stdio_server(folder)})), {})

    assert snap.status == "failed" and fake.request_count == 1
    fault = snap.faults["agent"]
    assert fault.errorType == "error_mcp_server"
    assert "MCP server 'files' failed during tools/call 'crash'" in fault.message
    assert "about to die: crash was called" in fault.message
    [error] = [e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentError)]
    assert error.details["toolUseId"] == "tu_c" and "about to die" in error.details["stderrTail"]


async def test_a_hanging_call_is_bounded_by_call_timeout(tmp_path: Path, fake: FakeAnthropic, folder: Path) -> None:
    fake.script(reply(ToolUse("mcp__files__hang", {}, id="tu_h")), reply(Text("unused")))
    kernel = make_kernel(tmp_path, fake)
    server = {**stdio_server(folder), "callTimeout": 0.5}
    with anyio.fail_after(30):
        snap = await kernel.run(kernel.compile(agent_flow(prompt="x", mcpServers={"files": server})), {})

    assert snap.status == "failed"
    assert "did not answer tools/call 'hang' within 0.5s (callTimeout)" in snap.faults["agent"].message
    assert not any(alive(pid) for pid in server_pids(folder))


@pytest.mark.parametrize("how", ["pause", "abort"])
async def test_servers_stop_when_the_node_run_is_paused_or_aborted(
        tmp_path: Path, fake: FakeAnthropic, folder: Path, how: str) -> None:
    gate = threading.Event()  # never set: the model call hangs until the command stops it
    fake.script(held(reply(Text("unused")), release=gate))
    kernel = make_kernel(tmp_path, fake)
    run_id = kernel.create_run(kernel.compile(agent_flow(prompt="x", mcpServers={"files": stdio_server(folder)})), {})
    result: list[object] = []
    async with anyio.create_task_group() as tg:
        async def execute() -> None:
            result.append(await kernel.execute(run_id))

        tg.start_soon(execute)
        await fake.wait_for_requests_async(1, timeout=30)
        [pid] = server_pids(folder)
        assert alive(pid)
        await kernel.command(run_id, Command(kind=how))
    assert getattr(result[0], "status", None) == ("paused" if how == "pause" else "aborted")
    assert not alive(pid)


async def test_servers_stop_when_the_node_times_out(tmp_path: Path, fake: FakeAnthropic, folder: Path) -> None:
    gate = threading.Event()
    fake.script(held(reply(Text("unused")), release=gate))
    kernel = make_kernel(tmp_path, fake)
    flow = agent_flow(prompt="x", mcpServers={"files": stdio_server(folder)})
    flow["nodes"][0]["policy"] = {"timeoutMs": 20_000}
    run_id = kernel.create_run(kernel.compile(flow), {})
    pids: list[int] = []
    async with anyio.create_task_group() as tg:
        result: list[object] = []

        async def execute() -> None:
            result.append(await kernel.execute(run_id))

        tg.start_soon(execute)
        await fake.wait_for_requests_async(1, timeout=30)
        pids += server_pids(folder)
    assert getattr(result[0], "status", None) == "failed"
    assert kernel.snapshot(run_id).faults["agent"].errorType == "timeout"
    assert pids and not any(alive(p) for p in pids)


CHILD = """
import sys, anyio
from flowkernel.agents.anthropic import AnthropicQuery
from flowkernel.run.kernel import Kernel
from flowkernel.plugins.registry import default_registry
from flowkernel.store.sql.sqlite import SqliteStore
from tests.mcp_support import stdio_server
from pathlib import Path

db, base_url, run_id, folder = sys.argv[1:5]
kernel = Kernel(SqliteStore(db), registry=default_registry().copy(),
                services={"query_fn": AnthropicQuery(base_url=base_url, api_key="test", backoff_s=0.01)})
flow = kernel.compile({"name": "agent-test", "nodes": [{"id": "agent", "type": "claude.agent", "input": {
    "prompt": "Read, then wait", "mcpServers": {"files": stdio_server(Path(folder))}}}], "edges": []})
anyio.run(lambda: kernel.run(flow, {}, run_id=run_id))
"""


@pytest.mark.slow
async def test_a_call_cut_short_by_a_crash_runs_again_with_its_key_and_no_server_is_left_behind(
        tmp_path: Path, fake: FakeAnthropic, folder: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    fake.script(reply(ToolUse("mcp__files__read", {"path": "a.txt"}, id="tu_a")),
                reply(ToolUse("mcp__files__hang", {}, id="tu_h")), reply(Text("Finished after the crash")))
    db, run_id = tmp_path / "runs.db", "run_mcpcrashtest000000001"
    root = str(Path(__file__).resolve().parents[1])
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(db), fake.base_url, run_id, str(folder)],
                             cwd=root, env={**os.environ, "PYTHONPATH": root},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with anyio.fail_after(60):
            while not (folder / "hanging").exists() and child.poll() is None:
                await anyio.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate(timeout=10)
    assert (folder / "hanging").exists(), err.decode()
    [first] = server_pids(folder)
    with anyio.fail_after(10):  # the server sees its stdin close with the process that started it
        while alive(first):
            await anyio.sleep(0.05)

    kernel = make_kernel(tmp_path, fake)
    final = await kernel.resume(run_id)

    assert final.status == "completed", final.faults
    before_crash = sent(fake.requests[1].body)["messages"]
    after_crash = sent(fake.requests[2].body)["messages"]
    [answer, results] = after_crash[len(before_crash):]
    assert answer["content"][0]["id"] == "tu_h"
    key = (folder / "hanging").read_text(encoding="utf-8")
    [node_run] = [r["runId"] for r in kernel.store.list_agent_messages(session_id=final.agentSessions["agent"])
                  if r["role"] == "assistant" and "tu_h" in str(r["content"])]
    assert key == f"{node_run}:tu_h" and node_run != final.nodeRuns["agent"], "the key of the first node run"
    assert results["content"] == [
        {"type": "tool_result", "tool_use_id": "tu_h", "content": f"answered the second time, key {key}"},
        {"type": "text", "text": "continue"}]
    stored = kernel.store.list_tool_calls(session_id=final.agentSessions["agent"])
    assert [(r["toolUseId"], r["status"]) for r in stored] == [("tu_a", "completed"), ("tu_h", "completed")]
    assert not any(alive(pid) for pid in server_pids(folder))
