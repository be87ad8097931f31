"""``flowkernel fixtures RUN`` writes ``claude.code`` fixture files from a stored run's session history.

WHEN a run's ``claude.code`` node ran a real Claude Code session (the SDK's bundled CLI against the fake
Messages API) THEN ``flowkernel fixtures RUN --output DIR`` writes ``DIR/<node>.json`` in the format the
session replay reads, and ``flowkernel run FLOW --fixtures DIR`` replays it without the CLI or the API:
the same output, the same stored conversation and tool calls, and the files the session wrote written
again. WHEN a session ended without a result (it waits for an approval) THEN the command refuses, saying
why the store cannot rebuild it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flowkernel.core.events import AgentTool
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, reply

from tests.claude_code_support import cli_env, code_flow, require_cli
from tests.crash_support import flowkernel

OFFLINE = {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9", "ANTHROPIC_API_KEY": "unused"}
# What differs between two runs by nature: how long things took, which session id was minted.
VOLATILE_OUTPUT = ("durationMs", "sessionId")


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        require_cli(f)
        yield f


def _run_of(db: Path) -> tuple[str, dict[str, Any], list[tuple[str, Any]], list[tuple[str, Any, str, Any]]]:
    """The only run in ``db``: its id, the node's output, its stored conversation and its tool events."""
    kernel = Kernel(SqliteStore(db))
    try:
        [run] = kernel.runs()
        snap = kernel.snapshot(run.runId)
        assert snap.status == "completed", snap.error
        output = {k: v for k, v in snap.outputs["code"].items() if k not in VOLATILE_OUTPUT}
        rows = kernel.store.list_agent_messages(flow_run_id=run.runId, limit=1000)
        tools = [(e.toolName, e.toolInput, e.toolOutput, e.error) for e in kernel.events(run.runId)
                 if isinstance(e, AgentTool)]
        return run.runId, output, [(r["role"], r["content"]) for r in rows], tools
    finally:
        kernel.close()


def test_fixtures_of_a_stored_session_replay_it_offline_with_the_same_output(tmp_path: Path,
                                                                               fake: FakeAnthropic) -> None:
    work = tmp_path / "work"
    work.mkdir()
    target = work / "out.txt"
    fake.script(reply(Text("Writing the file."), ToolUse("Write", {"file_path": str(target), "content": "hi\n"})),
                reply(ToolUse("Bash", {"command": "cat out.txt"})),
                reply(Text("The file says hi.")))
    flow = tmp_path / "flow.json"
    flow.write_text(json.dumps(code_flow(prompt="Write hi to out.txt and show it", cwd="work",
                                         allowedTools=["Write", "Bash"])))
    live = flowkernel(tmp_path / "live.db", "run", str(flow), extra_env=cli_env(fake), timeout=120)
    assert live.returncode == 0, live.stderr
    run_id, output, conversation, tools = _run_of(tmp_path / "live.db")
    assert output["text"] == "The file says hi." and target.read_text() == "hi\n"

    written = flowkernel(tmp_path / "live.db", "fixtures", run_id, "--output", str(tmp_path / "fx"))
    assert written.returncode == 0, written.stderr
    assert written.stdout.split() == [str(tmp_path / "fx" / "code.json")]
    document = json.loads((tmp_path / "fx" / "code.json").read_text())
    assert document["kind"] == "claude.code" and document["node"] == "code"
    [call] = document["calls"]
    assert call["input"]["prompt"] == "Write hi to out.txt and show it"
    assert call["input"]["options"]["allowedTools"] == ["Write", "Bash"]

    # Replay: no model (nothing listens at the base URL), no CLI; the session's file written again.
    target.unlink()
    requests = fake.request_count
    replayed = flowkernel(tmp_path / "replay.db", "run", str(flow), "--fixtures", str(tmp_path / "fx"),
                          extra_env=OFFLINE, timeout=120)
    assert replayed.returncode == 0, replayed.stderr
    assert fake.request_count == requests
    _, output_again, conversation_again, tools_again = _run_of(tmp_path / "replay.db")
    assert output_again == output
    assert conversation_again == conversation
    assert tools_again == tools and [t[0] for t in tools] == ["Write", "Bash"]
    assert target.read_text() == "hi\n"


def test_a_session_waiting_for_an_approval_cannot_be_written_and_the_command_says_why(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    work = tmp_path / "work"
    work.mkdir()
    fake.script(reply(ToolUse("Bash", {"command": f"echo approved > {work / 'out.txt'}"})))
    flow = tmp_path / "flow.json"
    flow.write_text(json.dumps(code_flow(prompt="Record the answer", cwd="work", ask=["Bash"])))
    started = flowkernel(tmp_path / "runs.db", "run", str(flow), extra_env=cli_env(fake), timeout=120)
    assert started.returncode == 3, started.stderr  # waiting
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"))
    [run] = kernel.runs()
    kernel.close()
    refused = flowkernel(tmp_path / "runs.db", "fixtures", run.runId, "--output", str(tmp_path / "fx"))
    assert refused.returncode == 1, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert "node 'code'" in line and "ended without a result" in line and "flowkernel record" in line
    assert not (tmp_path / "fx").exists()
