"""A ``claude.code`` node running a real Claude Code session (the SDK and its bundled CLI) against the
fake Messages API: the session id is committed before the CLI starts, the CLI's real Write, Read and
Bash tools run in a temporary folder, the SDK's messages become agent events and agent-run history
(``show --messages`` lists them), and an error result is an ``agent:error`` with the SDK's subtype.

Not skipped: if the CLI cannot start here the tests fail and say why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from flowkernel.agents.claude_sdk import SdkSessionQuery
from flowkernel.agents.sessions import SessionRequest
from flowkernel.core.events import AgentComplete, AgentStart, AgentTool, AgentUsage
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, reply

from tests.claude_code_support import cli_env, code_flow, require_cli


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        require_cli(f)
        yield f


class _Watched(SdkSessionQuery):
    """The real session query, noting what the store held when each session was opened."""

    def __init__(self, kernel_db: Path, env: dict[str, str]) -> None:
        super().__init__(env)
        self.db = kernel_db
        self.sessions_at_open: list[dict[str, str]] = []

    @asynccontextmanager
    async def open(self, request: SessionRequest, **kw: Any) -> AsyncIterator[Any]:
        reader = SqliteStore(self.db)
        [run] = reader.list_runs(limit=1)
        self.sessions_at_open.append(dict(Kernel(reader).snapshot(run.runId).agentSessions))
        reader.close()
        async with super().open(request, **kw) as live:
            yield live


async def test_a_session_runs_real_tools_and_is_stored_as_agent_run_history(
        tmp_path: Path, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWKERNEL_ALLOW_DIRS", str(tmp_path))
    work = tmp_path / "repo"
    work.mkdir()
    fake.script(reply(ToolUse("Write", {"file_path": str(work / "notes.txt"), "content": "alpha\n"}, id="toolu_w")),
                reply(ToolUse("Read", {"file_path": str(work / "notes.txt")}, id="toolu_r")),
                reply(ToolUse("Bash", {"command": "wc -l notes.txt && pwd"}, id="toolu_b")),
                reply(Text("Wrote, read and counted.")))
    sessions = _Watched(tmp_path / "runs.db", cli_env(fake))
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), services={"session_query": sessions})
    snap = await kernel.run(kernel.compile(code_flow(prompt="Make notes", cwd=str(work),
                                                     allowedTools=["Write", "Read", "Bash"])), {})
    events = kernel.events(snap.runId)
    assert snap.status == "completed", [e for e in events if e.type.endswith("error")]
    session_id = snap.agentSessions["code"]
    # minted by the kernel, committed before the CLI started, and the session the CLI ran
    assert sessions.sessions_at_open == [{"code": session_id}]
    assert {r.headers.get("x-claude-code-session-id") for r in fake.requests} == {session_id}
    assert (work / "notes.txt").read_text() == "alpha\n"

    out = snap.outputs["code"]
    assert set(out) == {"text", "structuredOutput", "usage", "modelUsage", "totalCostUsd", "numTurns",
                        "durationMs", "sessionId", "subtype"}
    assert out["text"] == "Wrote, read and counted." and out["sessionId"] == session_id
    assert out["subtype"] == "success" and out["numTurns"] >= 4 and out["totalCostUsd"] > 0
    kinds = [e.type for e in events if e.type.startswith("agent:")]
    assert kinds[0] == "agent:start" and kinds[-1] == "agent:complete"
    assert "agent:text:delta" in kinds and "agent:text" in kinds
    start = next(e for e in events if isinstance(e, AgentStart))
    assert start.prompt == "Make notes" and start.seq < min(e.seq for e in events if isinstance(e, AgentUsage))
    tools = [e for e in events if isinstance(e, AgentTool)]
    assert [(t.toolName, t.toolUseId, t.error) for t in tools] == [
        ("Write", "toolu_w", None), ("Read", "toolu_r", None), ("Bash", "toolu_b", None)]
    assert tools[0].toolInput == {"file_path": str(work / "notes.txt"), "content": "alpha\n"}
    assert "alpha" in tools[1].toolOutput and str(work) in tools[2].toolOutput
    usages = [e for e in events if isinstance(e, AgentUsage)]
    assert len(usages) == 4 and all(u.usage["inputTokens"] > 0 for u in usages)
    [done] = [e for e in events if isinstance(e, AgentComplete)]
    assert done.totalCostUsd == pytest.approx(sum(u.costUsd for u in usages))
    assert done.totalCostUsd == pytest.approx(sum(m["costUSD"] for m in (done.modelUsage or {}).values()))
    assert snap.totalCostUsd == pytest.approx(done.totalCostUsd)

    node_run = snap.nodeRuns["code"]
    rows = kernel.store.list_agent_messages(run_id=node_run, limit=100)
    assert [(r["role"], r["step"]) for r in rows] == [("user", 0), ("assistant", 1), ("user", 1), ("assistant", 2),
                                                      ("user", 2), ("assistant", 3), ("user", 3), ("assistant", 4)]
    assert rows[0]["content"] == "Make notes" and all(r["sessionId"] == session_id for r in rows)
    calls = kernel.store.list_tool_calls(run_id=node_run, limit=100)
    assert [(c["toolName"], c["status"], c["step"]) for c in calls] == [
        ("Write", "completed", 1), ("Read", "completed", 2), ("Bash", "completed", 3)]
    [(_, agent_run)] = kernel.store.list_agent_runs(limit=10)
    assert agent_run.agentId == "code" and agent_run.sessionId == session_id and agent_run.stepCount == 4
    assert agent_run.status == "completed"

    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWKERNEL_")}
    shown = subprocess.run([sys.executable, "-m", "flowkernel.cli", "show", snap.runId, "--tool-calls", "--json",
                            "--db", str(tmp_path / "runs.db")], capture_output=True, text=True, timeout=60, env=env)
    assert shown.returncode == 0, shown.stderr
    assert [json.loads(line)["toolName"] for line in shown.stdout.splitlines()] == ["Write", "Read", "Bash"]


async def test_an_error_result_is_an_agent_error_with_the_sdk_subtype(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("Bash", {"command": "echo one"}, id="toolu_1")),
                reply(ToolUse("Bash", {"command": "echo two"}, id="toolu_2")))
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), services={"session_query": SdkSessionQuery(cli_env(fake))})
    snap = await kernel.run(kernel.compile(code_flow(prompt="Loop", allowedTools=["Bash"], maxTurns=1)), {})
    assert snap.status == "failed"
    events = kernel.events(snap.runId)
    errors = [e for e in events if e.type == "agent:error"]
    assert [e.errorType for e in errors] == ["error_max_turns"], errors
    assert "maximum number of turns" in errors[0].message
    [node_error] = [e for e in events if e.type == "node:error"]
    assert node_error.errorType == "error_max_turns"
