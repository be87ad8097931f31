"""Thinking you can see: ``thinking.display`` is passed through; summarized thinking between tool calls
streams as ``agent:thinking:delta`` and is stored with the conversation; omitted thinking comes back
as empty blocks whose signatures still go back to the model.

The fake serves what the API serves for each display (an omitted block: no thinking_delta, empty
text, a signature) and refuses a thinking block sent back with other text than it served.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flowkernel.agents.tools import tool
from flowkernel.core.events import AgentThinkingDelta, AgentTool
from flowkernel.errors import FlowValidationError
from flowkernel.testing.fake_api import FakeAnthropic, Text, Thinking, ToolUse, reply

from tests.claude_support import agent_events, agent_flow, make_kernel, stored_conversation


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


def weather_kernel(tmp_path: Path, fake: FakeAnthropic) -> Any:
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("weather", tool(lambda city: f"snow in {city}"))
    return kernel


THREE_TURNS = (
    reply(Thinking("Oslo first.", signature="sig-1"), ToolUse("weather", {"city": "Oslo"})),
    reply(Thinking("Snow there; now Bergen.", signature="sig-2"), ToolUse("weather", {"city": "Bergen"})),
    reply(Thinking("Both snowy.", signature="sig-3"), Text("Snow in both.")),
)


async def test_summarized_thinking_between_tool_calls_streams_in_order_and_is_stored(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(*THREE_TURNS)
    kernel = weather_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(
        prompt="Weather in Oslo and Bergen?", tools=["weather"],
        thinking={"type": "adaptive", "effort": "high", "display": "summarized"})), {})

    assert snap.status == "completed", snap.error
    for request in fake.requests:
        assert request.body["thinking"] == {"type": "adaptive", "display": "summarized"}
    # Each turn's thinking streams before that turn's tool call: the reasoning between calls is visible.
    seen = [("thinking", e.content) if isinstance(e, AgentThinkingDelta) else ("tool", e.toolInput["city"])
            for e in agent_events(kernel, snap.runId) if isinstance(e, AgentThinkingDelta | AgentTool)]
    merged: list[tuple[str, str]] = []
    for kind, value in seen:
        if merged and kind == "thinking" == merged[-1][0]:
            merged[-1] = (kind, merged[-1][1] + value)
        else:
            merged.append((kind, value))
    assert merged == [("thinking", "Oslo first."), ("tool", "Oslo"), ("thinking", "Snow there; now Bergen."),
                      ("tool", "Bergen"), ("thinking", "Both snowy.")]
    stored = [b for m in stored_conversation(kernel, snap.agentSessions["agent"]) if m["role"] == "assistant"
              for b in m["content"] if b["type"] == "thinking"]
    assert [(b["thinking"], b["signature"]) for b in stored] == [
        ("Oslo first.", "sig-1"), ("Snow there; now Bergen.", "sig-2"), ("Both snowy.", "sig-3")]


async def test_omitted_thinking_is_empty_and_signed_and_goes_back_with_its_signature(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(*THREE_TURNS)
    kernel = weather_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(
        prompt="Weather in Oslo and Bergen?", tools=["weather"], model="claude-sonnet-4-6", maxTokens=4096,
        thinking={"budgetTokens": 2048, "display": "omitted"})), {})

    assert snap.status == "completed", snap.error
    assert fake.requests[0].body["thinking"] == {"type": "enabled", "budget_tokens": 2048, "display": "omitted"}
    assert not [e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentThinkingDelta)]
    assert fake.requests[2].body["messages"][1]["content"][0] == {"type": "thinking", "thinking": "",
                                                                  "signature": "sig-1"}
    assert fake.requests[2].body["messages"][3]["content"][0] == {"type": "thinking", "thinking": "",
                                                                  "signature": "sig-2"}
    stored = stored_conversation(kernel, snap.agentSessions["agent"])
    assert stored[-1]["content"][0] == {"type": "thinking", "thinking": "", "signature": "sig-3"}


async def test_the_fake_refuses_a_thinking_block_sent_back_with_other_text_than_it_served(
        fake: FakeAnthropic) -> None:
    import anthropic

    fake.script(reply(Thinking("the real reasoning", signature="sig-x"), ToolUse("weather", {"city": "Oslo"})))
    client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=0)
    tools: Any = [{"name": "weather", "description": "w", "input_schema": {"type": "object"}}]
    first = await client.messages.create(model="claude-sonnet-4-6", max_tokens=4096, tools=tools,
                                         thinking={"type": "enabled", "budget_tokens": 2048},
                                         messages=[{"role": "user", "content": "Oslo?"}])
    use = first.content[1]
    forged: Any = [{"role": "user", "content": "Oslo?"},
                   {"role": "assistant", "content": [{"type": "thinking", "thinking": "forged", "signature": "sig-x"},
                                                     use.model_dump()]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "snow"}]}]
    with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
        await client.messages.create(model="claude-sonnet-4-6", max_tokens=4096, tools=tools, messages=forged,
                                     thinking={"type": "enabled", "budget_tokens": 2048})
    await client.close()


@pytest.mark.parametrize(("thinking", "path"), [
    ({"type": "adaptive", "display": "full"}, "$.nodes[0].input.thinking.display"),
    ({"budgetTokens": 2048, "display": "verbose"}, "$.nodes[0].input.thinking.display"),
])
def test_a_display_other_than_summarized_or_omitted_is_refused_with_its_path(thinking: dict[str, Any],
                                                                             path: str) -> None:
    from flowkernel.run.kernel import Kernel
    from flowkernel.store.memory import MemoryStore

    with pytest.raises(FlowValidationError) as caught:
        Kernel(MemoryStore()).compile(agent_flow(prompt="x", model="claude-sonnet-4-6", maxTokens=4096,
                                                 thinking=thinking))
    lines = [line.strip() for line in str(caught.value).splitlines()]
    assert any(line.startswith(path) and "summarized, omitted" in line for line in lines), lines


def test_the_fake_refuses_a_display_the_api_does_not_take() -> None:
    from flowkernel.testing.fake_conversation import Conversations

    base = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
    rules = Conversations()
    assert rules.refuse({**base, "thinking": {"type": "adaptive", "display": "summarized"}}, {}) is None
    assert rules.refuse({**base, "thinking": {"type": "adaptive", "display": "full"}}, {}) is not None
    assert rules.refuse({**base, "thinking": {"type": "adaptive", "display": "updates"}}, {}) is not None
    assert rules.refuse({**base, "thinking": {"type": "disabled", "display": "omitted"}}, {}) is not None
