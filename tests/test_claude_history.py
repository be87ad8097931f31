"""Listing a Claude node's stored messages and tool calls: cursor pages, filters, rendering."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flowkernel.errors import InvalidInputError
from flowkernel.history.conversations import list_messages, list_tool_calls, render_conversation
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, reply

from tests.claude_support import agent_flow, make_kernel


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


async def test_messages_and_tool_calls_page_by_cursor_and_filter(tmp_path: Path, fake: FakeAnthropic) -> None:
    def fail(text: str) -> str:
        raise RuntimeError("nope")

    fake.script(reply(ToolUse("echo", {"text": "a"}, id="t1"), ToolUse("fail", {"text": "b"}, id="t2")),
                reply(ToolUse("echo", {"text": "c"}, id="t3")), reply(Text("all done")))
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("echo", lambda text: text)
    kernel.registry.add_tool("fail", fail)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="go", tools=["echo", "fail"])), {})
    node_run = snap.nodeRuns["agent"]

    seen, cursor, pages = [], 0, 0
    while True:
        page = list_messages(kernel.store, run_id=node_run, after=cursor, limit=2)
        seen += page["items"]
        pages += 1
        if page["nextCursor"] is None:
            break
        cursor = page["nextCursor"]
    assert [m["role"] for m in seen] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert pages == 3

    echo = list_tool_calls(kernel.store, flow_run_id=snap.runId, tool_name="echo")
    assert [c["toolUseId"] for c in echo["items"]] == ["t1", "t3"] and echo["nextCursor"] is None
    failed = list_tool_calls(kernel.store, run_id=node_run, status="error")
    assert [c["toolUseId"] for c in failed["items"]] == ["t2"]
    first = list_tool_calls(kernel.store, run_id=node_run, limit=1)
    assert first["nextCursor"] == first["items"][0]["id"]

    text = render_conversation(kernel.store, run_id=node_run)
    assert "[step 1] assistant" in text and '→ echo({"text": "a"}) [t1]' in text
    assert "← [t2] ERROR RuntimeError: nope" in text and "all done" in text

    with pytest.raises(InvalidInputError, match="status must be"):
        list_tool_calls(kernel.store, run_id=node_run, status="failed")
    with pytest.raises(InvalidInputError, match="whose conversation"):
        list_messages(kernel.store)
