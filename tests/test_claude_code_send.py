"""``send`` to a running ``claude.code`` node reaches the live session (the real CLI against the fake API)
as a user message at its next turn boundary: the model's next request carries it, and it is stored in
the session's history."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.commands import Command
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, reply

from tests.claude_code_support import cli_kernel, code_flow, require_cli


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        require_cli(f)
        yield f


async def until(check: Any, what: str, within_s: float = 60.0) -> Any:
    deadline = time.monotonic() + within_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what} never happened"
        await anyio.sleep(0.05)
    return found


async def test_a_send_reaches_the_live_session_at_its_next_turn_boundary(
        tmp_path: Path, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWKERNEL_ALLOW_DIRS", str(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    wait = "touch started; for i in $(seq 600); do [ -f release ] && break; sleep 0.1; done; echo tool done"
    fake.script(reply(ToolUse("Bash", {"command": wait}, id="toolu_wait")), reply(Text("Done, and goodbye.")))
    kernel = cli_kernel(tmp_path, fake)
    run_id = kernel.create_run(kernel.compile(code_flow(prompt="Wait for the release", cwd=str(work),
                                                        allowedTools=["Bash"])), {})
    result: list[Any] = []
    async with anyio.create_task_group() as tg:
        async def execute() -> None:
            result.append(await kernel.execute(run_id))

        tg.start_soon(execute)
        await until(lambda: (work / "started").exists(), "the tool starting")
        node_run = kernel.snapshot(run_id).nodeRuns["code"]
        await kernel.command(run_id, Command(kind="send", target=node_run, content="Also say goodbye"))
        stored = lambda: [r for r in kernel.store.list_agent_messages(run_id=node_run, limit=100)  # noqa: E731
                          if r["role"] == "user" and r["content"] == "Also say goodbye"]
        await until(stored, "the message reaching the session")
        (work / "release").touch()
    final = result[0]
    assert final.status == "completed" and final.outputs["code"]["text"] == "Done, and goodbye."
    second = json.dumps(fake.requests[1].body["messages"][-1])
    assert "Also say goodbye" in second and "toolu_wait" in second  # with the tool's result, in that turn
    assert fake.request_count == 2
    assert not kernel.snapshot(run_id).inbox.get(node_run)
