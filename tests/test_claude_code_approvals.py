"""Durable approvals of a ``claude.code`` session's tool calls, with the real CLI and the fake API.

WHEN the session calls a tool named in ``ask`` THEN the run waits with a ``tool-permission`` prompt
(tool, input, tool use id) and no CLI process is left while it waits. WHEN ``flowkernel reply --to NR
'{"allow": true}'`` answers it from another process THEN the session resumes, the model's repeated call
runs. ``{"allow": false, "reason": …}`` denies it and the model is told why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from flowkernel.core.events import AgentTool
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, reply

from tests.claude_code_support import cli_env, code_flow, require_cli
from tests.crash_support import flowkernel


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        require_cli(f)
        yield f


def _user_texts(body: dict[str, object]) -> list[str]:
    out: list[str] = []
    for m in body["messages"]:  # type: ignore[attr-defined]
        content = m["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        out += [b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    return out


def _waiting_run(tmp_path: Path, fake: FakeAnthropic, command: str) -> tuple[Path, str, str]:
    work = tmp_path / "work"
    work.mkdir()
    flow = tmp_path / "flow.json"
    flow.write_text(json.dumps(code_flow(prompt="Record the answer", cwd=str(work), ask=["Bash"])))
    db = tmp_path / "runs.db"
    started = flowkernel(db, "run", str(flow), extra_env={**cli_env(fake), "FLOWKERNEL_ALLOW_DIRS": str(tmp_path)},
                         timeout=120)
    assert started.returncode == 3, started.stderr  # waiting
    kernel = Kernel(SqliteStore(db))
    [run] = kernel.runs()
    snap = kernel.snapshot(run.runId)
    assert snap.status == "waiting"
    waiting = snap.waiting["code"]
    assert waiting.prompt == {"kind": "tool-permission", "toolName": "Bash", "toolInput": {"command": command},
                              "toolUseId": "toolu_ask1"}
    assert not (work / "out.txt").exists()
    kernel.close()
    return db, run.runId, waiting.runId


async def test_an_asked_tool_waits_for_approval_and_runs_once_allowed(tmp_path: Path, fake: FakeAnthropic) -> None:
    command = f"echo approved > {tmp_path / 'work' / 'out.txt'}"
    fake.script(reply(ToolUse("Bash", {"command": command}, id="toolu_ask1")),
                reply(ToolUse("Bash", {"command": command}, id="toolu_ask2")),
                reply(Text("Recorded.")))
    db, run_id, node_run = _waiting_run(tmp_path, fake, command)
    answered = flowkernel(db, "reply", run_id, "--to", node_run, '{"allow": true}',
                          extra_env={**cli_env(fake), "FLOWKERNEL_ALLOW_DIRS": str(tmp_path)}, timeout=120)
    assert answered.returncode == 0, answered.stderr
    kernel = Kernel(SqliteStore(db))
    final = kernel.snapshot(run_id)
    assert final.status == "completed" and final.outputs["code"]["text"] == "Recorded."
    assert (tmp_path / "work" / "out.txt").read_text() == "approved\n"
    ran = [e for e in kernel.events(run_id) if isinstance(e, AgentTool) and e.error is None]
    assert [(e.toolName, e.toolUseId) for e in ran] == [("Bash", "toolu_ask2")]
    said = _user_texts(fake.requests[1].body)
    assert said.count("Record the answer") == 1 and "approved" in said[-1]
    kernel.close()


async def test_a_denied_tool_does_not_run_and_the_model_is_told_why(tmp_path: Path, fake: FakeAnthropic) -> None:
    command = f"echo approved > {tmp_path / 'work' / 'out.txt'}"
    fake.script(reply(ToolUse("Bash", {"command": command}, id="toolu_ask1")), reply(Text("Understood, skipped.")))
    db, run_id, node_run = _waiting_run(tmp_path, fake, command)
    bad = flowkernel(db, "reply", run_id, "--to", node_run, '{"allow": "maybe"}', extra_env=cli_env(fake))
    assert bad.returncode == 2 and "allow" in bad.stderr, bad.stderr
    answered = flowkernel(db, "reply", run_id, "--to", node_run, '{"allow": false, "reason": "not on Fridays"}',
                          extra_env={**cli_env(fake), "FLOWKERNEL_ALLOW_DIRS": str(tmp_path)}, timeout=120)
    assert answered.returncode == 0, answered.stderr
    kernel = Kernel(SqliteStore(db))
    assert kernel.snapshot(run_id).outputs["code"]["text"] == "Understood, skipped."
    assert not (tmp_path / "work" / "out.txt").exists()
    assert "not on Fridays" in _user_texts(fake.requests[1].body)[-1]
    kernel.close()
