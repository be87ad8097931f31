"""Thinking the way each model wants it: adaptive with effort, or a budget, checked against the model.

The request bodies are the ones the real ``anthropic`` client sent to the loopback fake, which
refuses what the API refuses (a budget under 1024 or not below max_tokens, an unknown effort).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flowkernel.agents.tools import tool
from flowkernel.core.events import AgentThinkingDelta
from flowkernel.errors import FlowValidationError
from flowkernel.testing.fake_api import FakeAnthropic, Text, Thinking, ToolUse, reply

from tests.claude_support import agent_events, agent_flow, make_kernel, stored_conversation


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


def problems_of(**node_input: Any) -> str:
    """Every problem validation reports for a one-node flow with this input, one per line."""
    from flowkernel.run.kernel import Kernel
    from flowkernel.store.memory import MemoryStore

    try:
        Kernel(MemoryStore()).compile(agent_flow(**node_input))
    except FlowValidationError as exc:
        return str(exc)
    return ""


async def test_adaptive_thinking_sends_type_adaptive_with_the_effort_and_round_trips_signatures(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(
        reply(Thinking("Check the weather first", signature="sig-1"), ToolUse("weather", {"city": "Oslo"})),
        reply(Thinking("", signature="sig-2"), Text("Snow in Oslo.")),  # display "omitted": empty text, signed
    )
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("weather", tool(lambda city: f"snow in {city}"))
    snap = await kernel.run(kernel.compile(agent_flow(
        prompt="Weather in Oslo?", tools=["weather"], thinking={"type": "adaptive", "effort": "high"})), {})

    assert snap.status == "completed" and snap.outputs["agent"]["text"] == "Snow in Oslo."
    first, second = (r.body for r in fake.requests)
    for body in (first, second):
        assert body["model"] == "claude-sonnet-5-5"
        assert body["thinking"] == {"type": "adaptive"} and body["output_config"] == {"effort": "high"}
    assert second["messages"][1]["content"][0] == {"type": "thinking", "thinking": "Check the weather first",
                                                   "signature": "sig-1"}
    conversation = stored_conversation(kernel, snap.agentSessions["agent"])
    assert conversation[-1]["content"][0] == {"type": "thinking", "thinking": "", "signature": "sig-2"}
    deltas = [e.content for e in agent_events(kernel, snap.runId) if isinstance(e, AgentThinkingDelta)]
    assert "".join(deltas) == "Check the weather first"


async def test_adaptive_thinking_without_effort_leaves_it_to_the_model(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Text("ok")))
    kernel = make_kernel(tmp_path, fake)
    await kernel.run(kernel.compile(agent_flow(prompt="x", thinking={"type": "adaptive"})), {})
    body = fake.requests[0].body
    assert body["thinking"] == {"type": "adaptive"} and "output_config" not in body


async def test_budgeted_thinking_sends_budget_tokens_below_max_tokens(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Thinking("step by step", signature="s"), Text("42")))
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="6*7?", model="claude-haiku-4-5", maxTokens=3000,
                                                      thinking={"budgetTokens": 1024})), {})
    assert snap.outputs["agent"]["text"] == "42"
    body = fake.requests[0].body
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024} and body["max_tokens"] == 3000
    assert "output_config" not in body


def test_the_fake_refuses_what_the_api_refuses() -> None:
    from flowkernel.testing.fake_api import invalid_request

    base = {"model": "m", "max_tokens": 2000, "messages": [{"role": "user", "content": "x"}]}
    assert invalid_request({**base, "thinking": {"type": "enabled", "budget_tokens": 1023}}) is not None
    assert invalid_request({**base, "thinking": {"type": "enabled", "budget_tokens": 2000}}) is not None
    assert invalid_request({**base, "thinking": {"type": "adaptive"}, "output_config": {"effort": "huge"}}) is not None
    assert invalid_request({**base, "thinking": {"type": "adaptive", "budget_tokens": 1024}}) is not None
    assert invalid_request({**base, "thinking": {"type": "enabled", "budget_tokens": 1024}}) is None
    assert invalid_request({**base, "thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}) is None


@pytest.mark.parametrize(("node_input", "path", "fragment"), [
    ({"thinking": {"budgetTokens": 2048}}, "$.nodes[0].input.thinking",
     "model claude-sonnet-5-5 takes adaptive thinking only"),
    ({"model": "claude-opus-5-5", "thinking": {"budgetTokens": 2048}}, "$.nodes[0].input.thinking",
     "takes adaptive thinking only"),
    ({"model": "claude-haiku-4-5-20251001", "thinking": {"type": "adaptive"}}, "$.nodes[0].input.thinking",
     "model claude-haiku-4-5-20251001 does not take adaptive thinking"),
    ({"model": "claude-opus-4-5", "thinking": {"budgetTokens": 512}}, "$.nodes[0].input.thinking.budgetTokens",
     "at least 1024"),
    ({"model": "claude-opus-4-5", "thinking": {"budgetTokens": 8192}}, "$.nodes[0].input.maxTokens",
     "greater than thinking.budgetTokens (8192)"),
    ({"thinking": {"type": "adaptive", "effort": "extreme"}}, "$.nodes[0].input.thinking.effort",
     "low, medium, high, xhigh, max"),
    ({"thinking": {"type": "adaptive", "budgetTokens": 2048}}, "$.nodes[0].input.thinking", "must be"),
    ({"thinking": {"enabled": True}}, "$.nodes[0].input.thinking", "must be"),
    ({"temperature": 0.2}, "$.nodes[0].input.temperature", "model claude-sonnet-5-5 takes no temperature"),
    ({"model": "claude-opus-4-5", "temperature": 0.2, "thinking": {"budgetTokens": 2048}},
     "$.nodes[0].input.temperature", "thinking takes no temperature"),
])
def test_validation_names_the_json_path_and_the_form_the_model_wants(node_input: dict[str, Any], path: str,
                                                                      fragment: str) -> None:
    text = problems_of(prompt="x", **node_input)
    assert any(line.strip().startswith(path) and fragment in line for line in text.splitlines()), text


@pytest.mark.parametrize("node_input", [
    {"thinking": {"type": "adaptive", "effort": "max"}},
    {"model": "claude-opus-4-6", "thinking": {"budgetTokens": 1024}},  # both forms (budget deprecated)
    {"model": "claude-opus-4-6", "thinking": {"type": "adaptive", "effort": "low"}},
    {"model": "claude-opus-4-5-20251101", "thinking": {"budgetTokens": 4096}, "maxTokens": 8192},
    {"model": "claude-opus-4-5", "temperature": 0.2},
    {"model": "claude-next-7", "thinking": {"budgetTokens": 1024}},  # unknown ids: the API decides
    {"model": "claude-next-7", "thinking": {"type": "adaptive"}, "temperature": 1},
    {"model": "{{ flow.input.model }}", "thinking": {"budgetTokens": 1024}},  # known at run time
])
def test_forms_the_model_accepts_pass_validation(node_input: dict[str, Any]) -> None:
    assert problems_of(prompt="x", **node_input) == ""


async def test_a_model_chosen_by_a_binding_is_checked_when_the_node_runs(tmp_path: Path,
                                                                         fake: FakeAnthropic) -> None:
    kernel = make_kernel(tmp_path, fake)
    doc = agent_flow(prompt="x", model="{{ flow.input.model }}", thinking={"type": "adaptive"})
    snap = await kernel.run(kernel.compile(doc), {"model": "claude-haiku-4-5"})
    assert snap.status == "failed" and fake.request_count == 0
    assert "input.thinking: model claude-haiku-4-5 does not take adaptive thinking" in snap.faults["agent"].message
