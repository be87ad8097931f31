"""``toolChoice``: ``none`` on every call, a forced choice (``any``, a named tool) on the first call of a
pass only; never a forced choice with thinking on, which the API answers with 400 ("Thinking may not be
enabled when tool_choice forces tool use.") and the fake does too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flowkernel.agents.tools import tool
from flowkernel.errors import FlowValidationError
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore
from flowkernel.testing.fake_api import FakeAnthropic, Text, ToolUse, reply

from tests.claude_support import agent_flow, make_kernel


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


def weather_kernel(tmp_path: Path, fake: FakeAnthropic) -> Kernel:
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("weather", tool(lambda city: f"snow in {city}"))
    return kernel


async def test_a_forced_tool_choice_goes_with_the_first_call_of_the_pass_only(tmp_path: Path,
                                                                               fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("weather", {"city": "Oslo"})), reply(Text("Snow.")))
    kernel = weather_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="Oslo?", tools=["weather"],
                                                      toolChoice={"tool": "weather"})), {})

    assert snap.status == "completed", snap.error
    first, second = (r.body for r in fake.requests)
    assert first["tool_choice"] == {"type": "tool", "name": "weather"}
    assert "tool_choice" not in second, "later calls are free, so the loop can end"
    rows = kernel.store.list_agent_messages(session_id=snap.agentSessions["agent"])
    assert [r["modelCall"].get("toolChoice") for r in rows if r["role"] == "assistant"] == [
        {"type": "tool", "name": "weather"}, None]


async def test_tool_choice_none_goes_with_every_call(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Text("No tools needed.")))
    kernel = weather_kernel(tmp_path, fake)
    await kernel.run(kernel.compile(agent_flow(prompt="Hi", tools=["weather"], toolChoice="none")), {})
    assert fake.requests[0].body["tool_choice"] == {"type": "none"}


async def test_a_forced_choice_with_thinking_decided_at_run_time_is_never_sent(tmp_path: Path,
                                                                                fake: FakeAnthropic) -> None:
    kernel = weather_kernel(tmp_path, fake)
    flow = agent_flow(prompt="Oslo?", tools=["weather"], toolChoice="{{ flow.input.choice }}",
                      thinking={"type": "adaptive"})
    snap = await kernel.run(kernel.compile(flow), {"choice": "any"})

    assert snap.status == "failed"
    assert snap.faults["agent"].errorType == "invalid_input"
    assert "input.toolChoice" in snap.faults["agent"].message and "thinking" in snap.faults["agent"].message
    assert fake.request_count == 0


@pytest.mark.parametrize(("node_input", "path", "fragment"), [
    ({"toolChoice": "any", "tools": ["weather"], "thinking": {"type": "adaptive"}}, "$.nodes[0].input.toolChoice",
     "Thinking may not be enabled when tool_choice forces tool use"),
    ({"toolChoice": {"tool": "weather"}, "tools": ["weather"], "model": "claude-haiku-4-5", "maxTokens": 4096,
      "thinking": {"budgetTokens": 2048}}, "$.nodes[0].input.toolChoice", "cannot go with thinking"),
    ({"toolChoice": {"tool": "search"}, "tools": ["weather"]}, "$.nodes[0].input.toolChoice.tool",
     "names no tool of this node"),
    ({"toolChoice": "sometimes"}, "$.nodes[0].input.toolChoice", '"auto", "any", "none" or {"tool": NAME}'),
    ({"toolChoice": "any"}, "$.nodes[0].input.toolChoice", "no `tools`"),
])
def test_tool_choice_is_validated_with_its_json_path(node_input: dict[str, Any], path: str, fragment: str) -> None:
    kernel = Kernel(MemoryStore())
    kernel.registry.add_tool("weather", tool(lambda city: city))
    with pytest.raises(FlowValidationError) as caught:
        kernel.compile(agent_flow(prompt="x", **node_input))
    lines = [line.strip() for line in str(caught.value).splitlines()]
    assert any(line.startswith(path + ":") and fragment in line for line in lines), lines


async def test_the_fake_answers_a_forced_choice_with_thinking_with_the_apis_400(fake: FakeAnthropic) -> None:
    import anthropic

    client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=0)
    tools: Any = [{"name": "weather", "description": "w", "input_schema": {"type": "object"}}]
    for choice in ({"type": "any"}, {"type": "tool", "name": "weather"}):
        with pytest.raises(anthropic.BadRequestError, match="Thinking may not be enabled when tool_choice forces"):
            await client.messages.create(model="claude-sonnet-5-5", max_tokens=100, tools=tools, tool_choice=choice,
                                         thinking={"type": "adaptive"}, messages=[{"role": "user", "content": "x"}])
    assert fake.remaining == 0 and fake.request_count == 2
    await client.close()


def test_flowkernel_schema_takes_tool_choice_display_and_compaction_and_refuses_bad_values() -> None:
    import jsonschema
    from flowkernel.nodes.claude.config import INPUT_SCHEMA

    check = jsonschema.Draft202012Validator(INPUT_SCHEMA)
    good = {"prompt": "x", "tools": ["t"], "toolChoice": {"tool": "t"}, "compaction": {"triggerTokens": 60_000},
            "thinking": {"type": "adaptive", "display": "omitted"}}
    assert list(check.iter_errors(good)) == []
    assert list(check.iter_errors({**good, "toolChoice": "{{ flow.input.choice }}"})) == []
    for bad in ({"toolChoice": "sometimes"}, {"toolChoice": {"name": "t"}}, {"compaction": {"triggerTokens": 10}},
                {"compaction": {"trigger": 60_000}}, {"thinking": {"type": "adaptive", "display": "full"}},
                {"thinking": {"budgetTokens": 2048, "display": "all"}}):
        assert list(check.iter_errors({**good, **bad})), bad
