"""Changing the model safely: when a resume or a flow update gives a node another model, thinking blocks
made by the model before are not sent back (another model refuses them: a thinking block is bound to
the model that made it), their text stays in the stored history, and ``agent:start`` names the change.

The fake refuses a thinking block it served for one model when it is sent to another, as the API does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flowkernel.agents.tools import tool
from flowkernel.core.events import AgentStart
from flowkernel.nodes.claude.context_window import window
from flowkernel.testing.fake_api import FakeAnthropic, Structured, Text, Thinking, ToolUse, reply

from tests.claude_support import agent_events, make_kernel, stored_conversation

ANSWER = {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}


def weather_flow(model: str) -> dict[str, Any]:
    return {"name": "weather", "nodes": [{"id": "agent", "type": "claude.agent", "input": {
        "prompt": "Where does it snow?", "model": model, "thinking": {"type": "adaptive"}, "tools": ["weather"],
        "outputSchema": ANSWER, "outputRetries": 0}}], "edges": []}


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


def thinking_of(messages: list[dict[str, Any]]) -> list[str]:
    return [b["thinking"] for m in messages if isinstance(m["content"], list) for b in m["content"]
            if b.get("type") == "thinking"]


async def test_a_resume_on_another_model_sends_no_thinking_of_the_model_before_and_says_so(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Thinking("Ask the weather tool.", signature="sig-a1"), ToolUse("weather", {"city": "Oslo"})),
                reply(Thinking("Snow in Oslo.", signature="sig-a2"), Text("It snows in Oslo.")),  # not JSON: fails
                reply(Thinking("Answer as JSON.", signature="sig-b1"), Structured({"city": "Oslo"})))
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("weather", tool(lambda city: f"snow in {city}"))
    failed = await kernel.run(kernel.compile(weather_flow("claude-sonnet-4-6")), {})
    assert failed.status == "failed"
    assert thinking_of(fake.requests[1].body["messages"]) == ["Ask the weather tool."], "the same model: sent back"

    done = await kernel.resume(failed.runId, "Answer with the JSON.", flow=kernel.compile(
        weather_flow("claude-opus-4-7")))

    assert done.status == "completed", done.error
    assert done.outputs["agent"]["structuredOutput"] == {"city": "Oslo"}
    last = fake.requests[2]
    assert last.body["model"] == "claude-opus-4-7" and last.outcome == "reply:sse"
    assert thinking_of(last.body["messages"]) == [], "the other model's thinking is not sent to this one"
    assert [m["role"] for m in last.body["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    stored = stored_conversation(kernel, done.agentSessions["agent"])
    assert thinking_of(stored) == ["Ask the weather tool.", "Snow in Oslo.", "Answer as JSON."], \
        "every thinking block stays in the stored history"
    starts = [e for e in agent_events(kernel, done.runId) if isinstance(e, AgentStart)]
    assert [(s.model, s.previousModel) for s in starts] == [("claude-sonnet-4-6", None),
                                                            ("claude-opus-4-7", "claude-sonnet-4-6")]


async def test_the_fake_refuses_thinking_sent_to_another_model_than_the_one_that_made_it(
        fake: FakeAnthropic) -> None:
    import anthropic

    fake.script(reply(Thinking("mine", signature="sig-m"), Text("hi")))
    client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=0)
    first = await client.messages.create(model="claude-sonnet-4-6", max_tokens=100, thinking={"type": "adaptive"},
                                         messages=[{"role": "user", "content": "hi"}])
    again: Any = [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                  {"role": "user", "content": "and?"}]
    with pytest.raises(anthropic.BadRequestError, match="made by claude-sonnet-4-6 and cannot be sent to"):
        await client.messages.create(model="claude-opus-4-7", max_tokens=100, thinking={"type": "adaptive"},
                                     messages=again)
    await client.close()


def test_a_dated_id_and_its_alias_are_one_model_and_an_answer_asked_of_the_alias_keeps_its_thinking() -> None:
    thinking = {"type": "thinking", "thinking": "t", "signature": "s"}
    rows = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": [thinking, {"type": "text", "text": "a"}],
             "modelCall": {"model": "claude-sonnet-5-5-20260301"}},
            {"role": "user", "content": "more"},
            {"role": "assistant", "content": [thinking], "modelCall": {"model": "claude-fable-5",
                                                                       "requestModel": "claude-opus-5"}},
            {"role": "user", "content": "last"}]
    same = window(rows, "claude-sonnet-5-5")
    assert same.messages[1]["content"][0] == thinking and same.dropped_thinking == 1
    assert [m["role"] for m in same.messages] == ["user", "assistant", "user", "user"], \
        "an answer left with no block is left out"
    assert window(rows, "claude-opus-5").dropped_thinking == 1, "the model asked for counts, not the one named"


def test_the_live_view_says_which_model_an_agent_continues_from() -> None:
    import io

    from flowkernel.cli.live_view import LiveView

    out = io.StringIO()
    LiveView(out, started_ms=0)(AgentStart(sessionId="ses_1", model="claude-opus-4-7", nodeId="agent",
                                                runId="nr_1", previousModel="claude-sonnet-4-6", timestamp=0))
    assert "agent claude-opus-4-7 (was claude-sonnet-4-6) session ses_1" in out.getvalue()
