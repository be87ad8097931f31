"""``claude.code`` sessions across interruptions, with the real CLI against the fake Messages API.

WHEN a run is paused, aborted or timed out while a session's Bash tool runs THEN the CLI and every
process it started are gone. WHEN the paused run is resumed with a message THEN the stored session
continues with that message: the prompt is not sent again. WHEN the worker running a session is
SIGKILLed THEN another worker, with another HOME and temporary folder, resumes the session from the
run's store. A session that finished is not run again."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.commands import Command
from flowkernel.core.events import AgentStart
from flowkernel.run.kernel import Kernel
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.testing.fake_api import FakeAnthropic, RecordedRequest, Text, ToolUse, reply

from tests.claude_code_support import cli_env, cli_kernel, code_flow, require_cli

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Run the slow job"


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        require_cli(f)
        yield f


def processes_with(token: str) -> list[str]:
    """The command lines of live processes that mention ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        line = raw.replace(b"\0", b" ").decode(errors="replace")
        if token in line and state[state.rindex(")") + 2] != "Z":
            found.append(f"{entry}: {line}")
    return found


async def gone(token: str, within_s: float = 10.0) -> list[str]:
    """Wait until no process mentions ``token`` (the supervisor has a grace period); what is left."""
    deadline = time.monotonic() + within_s
    while (left := processes_with(token)) and time.monotonic() < deadline:
        await anyio.sleep(0.1)
    return left


async def until_exists(path: Path, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        await anyio.sleep(0.05)


def slow_tool(work: Path) -> tuple[str, Any]:
    """A Bash tool_use that notes it ran and then sleeps; its unique token finds its processes."""
    token = f"{1000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"
    command = f"echo ran >> {work}/ran.txt; touch {work}/started; sleep {token}"
    return token, ToolUse("Bash", {"command": command}, id="toolu_slow")


def user_texts(request: RecordedRequest) -> list[str]:
    out = []
    for m in request.body["messages"]:
        if m["role"] != "user":
            continue
        content = m["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        out += [b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    return out


@pytest.mark.parametrize("how", ["pause", "abort", "timeout"])
async def test_stopping_a_run_mid_tool_leaves_no_process_behind(
        tmp_path: Path, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setenv("FLOWKERNEL_ALLOW_DIRS", str(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    token, tool = slow_tool(work)
    fake.script(reply(tool), reply(Text("Resumed and done.")))
    kernel = cli_kernel(tmp_path, fake)
    document = code_flow(prompt=PROMPT, cwd=str(work), allowedTools=["Bash"])
    if how == "timeout":
        document["nodes"][0]["policy"] = {"timeoutMs": 20_000}
    run_id = kernel.create_run(kernel.compile(document), {})
    result: list[Any] = []
    async with anyio.create_task_group() as tg:
        async def execute() -> None:
            result.append(await kernel.execute(run_id))

        tg.start_soon(execute)
        await until_exists(work / "started")
        assert processes_with(token), "the tool's process runs"
        if how != "timeout":
            await kernel.command(run_id, Command(kind=how))
    assert await gone(token) == []
    assert result[0].status == {"pause": "paused", "abort": "aborted", "timeout": "failed"}[how]
    if how != "pause":
        return

    final = await kernel.resume(run_id, "please go on")
    assert final.status == "completed", [e for e in kernel.events(run_id) if e.type.endswith("error")]
    assert final.outputs["code"]["text"] == "Resumed and done."
    _, resumed = fake.requests
    said = user_texts(resumed)
    assert sum(PROMPT in t for t in said) == 1 and said[-1] == "please go on"
    assert {r.headers.get("x-claude-code-session-id") for r in fake.requests} == {final.agentSessions["code"]}
    starts = [e for e in kernel.events(run_id) if isinstance(e, AgentStart)]
    assert [s.prompt for s in starts] == [PROMPT, None]  # the resumed process is not given the prompt
    assert (work / "ran.txt").read_text() == "ran\n"  # the tool cut short was not run again


def _worker(db: Path, tmp: Path, name: str, fake: FakeAnthropic, *args: str) -> subprocess.Popen[str]:
    home = tmp / name
    (home / "tmp").mkdir(parents=True)
    env = {**os.environ, **cli_env(fake), "HOME": str(home), "TMPDIR": str(home / "tmp"),
           "PYTHONPATH": str(ROOT), "FLOWKERNEL_ALLOW_DIRS": str(tmp)}
    env.pop("FLOWKERNEL_DB", None)
    return subprocess.Popen([sys.executable, "-m", "flowkernel.cli", *args, "--db", str(db)], cwd=tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def test_a_session_whose_worker_is_killed_is_resumed_by_another_worker_from_the_store(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    work = tmp_path / "work"
    work.mkdir()
    token, tool = slow_tool(work)
    fake.script(reply(tool), reply(Text("Finished on the second worker.")))
    flow = tmp_path / "flow.json"
    flow.write_text(json.dumps(code_flow(prompt=PROMPT, cwd=str(work), allowedTools=["Bash"])))
    db = tmp_path / "runs.db"
    first = _worker(db, tmp_path, "home1", fake, "run", str(flow))
    try:
        await until_exists(work / "started")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert await gone(token) == [], "the killed worker's CLI and its tool were stopped with it"
    shutil.rmtree(tmp_path / "home1")  # the first worker's machine is gone: only the store is left
    reader = Kernel(SqliteStore(db))
    [run] = reader.runs()
    session_id = reader.snapshot(run.runId).agentSessions["code"]
    assert reader.store.load_session_entries(_project_key(work), session_id), "the store holds the transcript"
    reader.close()

    second = _worker(db, tmp_path, "home2", fake, "resume", run.runId, "--message", "carry on")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, (out, err)
    kernel = Kernel(SqliteStore(db))
    final = kernel.snapshot(run.runId)
    assert final.status == "completed" and final.outputs["code"]["text"] == "Finished on the second worker."
    assert final.outputs["code"]["sessionId"] == session_id
    _, resumed = fake.requests
    said = user_texts(resumed)
    assert sum(PROMPT in t for t in said) == 1 and said[-1] == "carry on"
    assert "toolu_slow" in json.dumps(resumed.body["messages"])  # the history the first worker made
    assert (work / "ran.txt").read_text() == "ran\n"
    kernel.close()


async def test_a_session_that_finished_before_a_crash_is_not_run_again(tmp_path: Path, fake: FakeAnthropic) -> None:
    from tests.crash_support import KILLED, flowkernel, only_run

    fake.script(reply(Text("Done once.")))
    flow = tmp_path / "flow.json"
    flow.write_text(json.dumps(code_flow(prompt=PROMPT)))
    db = tmp_path / "runs.db"
    # killed right after agent:complete is stored, before node:complete is
    crashed = flowkernel(db, "run", str(flow), crash="after-event:agent:complete:1", extra_env=cli_env(fake),
                         timeout=120)
    assert crashed.returncode == KILLED, crashed.stderr
    run_id = only_run(db)
    assert fake.request_count == 1
    resumed = flowkernel(db, "resume", run_id, extra_env=cli_env(fake), timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    kernel = Kernel(SqliteStore(db))
    final = kernel.snapshot(run_id)
    assert final.status == "completed" and final.outputs["code"]["text"] == "Done once."
    assert fake.request_count == 1, "the finished session was not run again"
    kernel.close()


def _project_key(folder: Path) -> str:
    from claude_agent_sdk import project_key_for_directory

    return str(project_key_for_directory(str(folder)))
