"""claude.agent against the real ``anthropic`` client and a loopback fake of the Messages API.

Each test scripts the fake's answers, runs a one-node flow on a SQLite file, and checks the events,
the stored conversation and the request bodies the SDK actually sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.agents.tools import tool
from flowkernel.core.events import (
    AgentComplete,
    AgentError,
    AgentStart,
    AgentTextDelta,
    AgentThinkingDelta,
    AgentTool,
)
from flowkernel.errors import FlowValidationError
from flowkernel.testing.fake_api import (
    FakeAnthropic,
    Text,
    Thinking,
    ToolUse,
    clean_end,
    cut_off,
    http_error,
    reply,
    stream_error,
)

from tests.claude_support import agent_events, agent_flow, make_kernel, sent, stored_conversation, types


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


async def run_agent(tmp_path: Path, fake: FakeAnthropic, **node_input: Any) -> tuple[Any, Any]:
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(**node_input)), {})
    return kernel, snap


# --- plain answers -------------------------------------------------------------------------


async def test_plain_text_streams_deltas_and_completes_with_the_text(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Text("Hello, Ada!", deltas=3), input_tokens=12, output_tokens=4))
    kernel, snap = await run_agent(tmp_path, fake, prompt="Greet Ada", system="Be brief.")

    assert snap.status == "completed"
    out = snap.outputs["agent"]
    assert out["text"] == "Hello, Ada!" and out["stopReason"] == "end_turn" and out["numTurns"] == 1
    assert out["sessionId"] == snap.agentSessions["agent"]
    body = sent(fake.requests[0].body)
    assert body["messages"] == [{"role": "user", "content": "Greet Ada"}]
    assert body["system"] == "Be brief." and body["stream"] is True and body["model"] == "claude-sonnet-5-5"
    assert fake.requests[0].headers.get("authorization") == "Bearer test"

    events = agent_events(kernel, snap.runId)
    assert types(events) == ["agent:start", "agent:text:delta", "agent:text:delta", "agent:text:delta",
                             "agent:usage", "agent:complete"]
    assert "".join(e.content for e in events if isinstance(e, AgentTextDelta)) == "Hello, Ada!"
    # every event carries the node and its node run; the stored order is gapless
    node_run = snap.nodeRuns["agent"]
    assert all(e.nodeId == "agent" and e.runId == node_run for e in events)
    seqs = [e.seq for e in kernel.events(snap.runId)]
    assert seqs == list(range(1, len(seqs) + 1))
    # agent:start is in the log (and the session in the snapshot) before the first model call ends
    start = events[0]
    assert isinstance(start, AgentStart) and start.prompt == "Greet Ada"
    # stored: the system prompt, the user prompt, the answer
    rows = kernel.store.list_agent_messages(run_id=node_run)
    assert [(r["role"], r["step"]) for r in rows] == [("system", 0), ("user", 1), ("assistant", 1)]


# Budgeted thinking is the behaviour of the older models; claude-opus-4-5 is one of them, deprecated by
# the SDK since 2.14 (end of life January 2027): the behaviour under test does not depend on it being served.
@pytest.mark.filterwarnings("ignore:The model 'claude-opus-4-5' is deprecated:DeprecationWarning")
async def test_thinking_blocks_are_sent_back_unchanged_with_their_signatures(tmp_path: Path,
                                                                             fake: FakeAnthropic) -> None:
    registry_tool = tool(lambda city: f"sunny in {city}")
    fake.script(
        reply(Thinking("I should check the weather", signature="sig-abc"), ToolUse("weather", {"city": "Paris"})),
        reply(Thinking("It is sunny", signature="sig-def"), Text("Sunny.")),
    )
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("weather", registry_tool)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="Weather?", tools=["weather"], maxTokens=4096,
                                                      model="claude-opus-4-5", thinking={"budgetTokens": 2048})), {})

    assert snap.outputs["agent"]["text"] == "Sunny."
    first, second = sent(fake.requests[0].body), sent(fake.requests[1].body)
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assistant = second["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"][0] == {"type": "thinking", "thinking": "I should check the weather",
                                       "signature": "sig-abc"}
    deltas = [e.content for e in agent_events(kernel, snap.runId) if isinstance(e, AgentThinkingDelta)]
    assert "".join(deltas) == "I should check the weatherIt is sunny"


async def test_max_tokens_stop_completes_with_the_partial_text(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Text("The answer is cut"), stop_reason="max_tokens"))
    _, snap = await run_agent(tmp_path, fake, prompt="Write a lot", maxTokens=5)
    assert snap.status == "completed"
    assert snap.outputs["agent"]["stopReason"] == "max_tokens"
    assert snap.outputs["agent"]["text"] == "The answer is cut"
    assert sent(fake.requests[0].body)["max_tokens"] == 5


# --- tools ---------------------------------------------------------------------------------


async def test_two_tool_calls_in_one_message_run_concurrently_and_results_match_ids(tmp_path: Path,
                                                                                    fake: FakeAnthropic) -> None:
    started = 0
    both = anyio.Event()

    async def lookup(key: str) -> str:
        """Look a key up."""
        nonlocal started
        started += 1
        if started == 2:
            both.set()
        with anyio.fail_after(5):  # run one after the other, this would never see the second start
            await both.wait()
        return f"value of {key}"

    fake.script(reply(ToolUse("lookup", {"key": "a"}, id="tu_a"), ToolUse("lookup", {"key": "b"}, id="tu_b")),
                reply(Text("done")))
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("lookup", lookup)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="look up a and b", tools=["lookup"])), {})

    assert snap.status == "completed", snap.faults
    results = sent(fake.requests[1].body)["messages"][2]
    assert results == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "tu_a", "content": "value of a"},
        {"type": "tool_result", "tool_use_id": "tu_b", "content": "value of b"}]}
    tools_seen = [e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentTool)]
    assert sorted(e.toolUseId for e in tools_seen) == ["tu_a", "tu_b"] and all(e.error is None for e in tools_seen)
    assert sent(fake.requests[0].body)["tools"][0]["input_schema"] == {
        "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
    calls = kernel.store.list_tool_calls(flow_run_id=snap.runId)
    assert {c["toolUseId"]: c["status"] for c in calls} == {"tu_a": "completed", "tu_b": "completed"}
    assistant_row = kernel.store.list_agent_messages(run_id=snap.nodeRuns["agent"])[1]
    assert assistant_row["role"] == "assistant" and all(c["messageId"] == assistant_row["id"] for c in calls)


async def test_a_tool_that_raises_becomes_an_error_result_and_the_loop_goes_on(tmp_path: Path,
                                                                               fake: FakeAnthropic) -> None:
    def explode() -> str:
        raise ValueError("disk on fire")

    fake.script(reply(ToolUse("explode", {}, id="tu_x")), reply(Text("sorry")))
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("explode", explode)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="go", tools=["explode"])), {})

    assert snap.status == "completed"
    result = sent(fake.requests[1].body)["messages"][2]["content"][0]
    assert result == {"type": "tool_result", "tool_use_id": "tu_x", "content": "ValueError: disk on fire",
                      "is_error": True}
    events = agent_events(kernel, snap.runId)
    tool_ev = next(e for e in events if isinstance(e, AgentTool))
    assert tool_ev.error == "ValueError: disk on fire"
    assert any(isinstance(e, AgentError) and e.errorType == "error_tool_use" for e in events)
    assert kernel.store.list_tool_calls(flow_run_id=snap.runId, status="error")[0]["toolName"] == "explode"


async def test_large_tool_results_are_truncated_with_a_marker_before_storing_and_sending(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("big", {}, id="tu_big")), reply(Text("ok")))
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("big", lambda: "x" * 300_000)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="go", tools=["big"])), {})

    result = sent(fake.requests[1].body)["messages"][2]["content"][0]["content"]
    assert result.startswith("x" * 100_000) and len(result) < 100_200
    assert "truncated: 100000 of 300000 bytes shown" in result
    assert kernel.store.list_tool_calls(flow_run_id=snap.runId)[0]["output"] == result


async def test_max_turns_exhausted_fails_the_node_with_error_max_turns(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("echo", {"text": "1"})), reply(ToolUse("echo", {"text": "2"})), reply(Text("never")))
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("echo", lambda text: text)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="loop", tools=["echo"], maxTurns=2)), {})

    assert snap.status == "failed"
    assert snap.faults["agent"].errorType == "error_max_turns"
    assert fake.request_count == 2  # the third call was never made
    assert any(isinstance(e, AgentError) and e.errorType == "error_max_turns" for e in agent_events(kernel, snap.runId))
    # the second round of tool results is stored, so a retry continues from a valid conversation
    conv = stored_conversation(kernel, snap.agentSessions["agent"])
    assert conv[-1]["role"] == "user" and conv[-1]["content"][0]["type"] == "tool_result"


async def test_structured_output_that_fails_validation_is_sent_back_and_corrected(tmp_path: Path,
                                                                                  fake: FakeAnthropic) -> None:
    # A model without native structured output: the schema is an instruction in the system prompt.
    schema = {"type": "object", "properties": {"passed": {"type": "boolean"}}, "required": ["passed"]}
    fake.script(reply(Text('{"passed": "yes"}')), reply(Text('```json\n{"passed": true}\n```')))
    kernel, snap = await run_agent(tmp_path, fake, prompt="Review it", outputSchema=schema, model="claude-opus-4-1")

    assert snap.status == "completed"
    assert snap.outputs["agent"]["structuredOutput"] == {"passed": True}
    assert "JSON Schema" in sent(fake.requests[0].body)["system"]
    feedback = sent(fake.requests[1].body)["messages"][-1]
    assert feedback["role"] == "user" and "passed: 'yes' is not of type 'boolean'" in feedback["content"]
    errors = [e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentError)]
    assert [e.errorType for e in errors] == ["error_output_schema"]


async def test_structured_output_that_never_validates_fails_with_the_last_error(tmp_path: Path,
                                                                                fake: FakeAnthropic) -> None:
    fake.script(reply(Text("no")), reply(Text("still no")))
    _, snap = await run_agent(tmp_path, fake, prompt="x", outputSchema={"type": "object"}, outputRetries=1)
    assert snap.status == "failed"
    assert snap.faults["agent"].errorType == "error_output_schema"
    assert "not JSON" in snap.faults["agent"].message


# --- usage and cost ------------------------------------------------------------------------


async def test_usage_is_summed_over_turns_and_priced_from_the_table(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("echo", {"text": "hi"}), input_tokens=100, output_tokens=10,
                      cache_creation_input_tokens=1000),
                reply(Text("bye"), input_tokens=200, output_tokens=20, cache_read_input_tokens=1000))
    kernel = make_kernel(tmp_path, fake, prices={"claude-test": {"input": 2.0, "output": 10.0}})
    kernel.registry.add_tool("echo", lambda text: text)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="x", tools=["echo"], model="claude-test-1")), {})

    out = snap.outputs["agent"]
    assert out["usage"] == {"inputTokens": 300, "outputTokens": 30, "cacheCreationInputTokens": 1000,
                            "cacheReadInputTokens": 1000}
    expected = (300 * 2.0 + 30 * 10.0 + 1000 * 2.5 + 1000 * 0.2) / 1_000_000
    assert out["totalCostUsd"] == pytest.approx(expected)
    complete = next(e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentComplete))
    assert complete.usage == out["usage"] and complete.numTurns == 2
    assert complete.modelUsage is not None and complete.modelUsage["claude-test-1"]["costUSD"] == pytest.approx(expected)


async def test_default_prices_apply_to_dated_model_ids(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Text("hi"), input_tokens=1_000_000, output_tokens=1_000_000))
    _, snap = await run_agent(tmp_path, fake, prompt="x", model="claude-haiku-4-5-20251001")
    assert snap.outputs["agent"]["totalCostUsd"] == pytest.approx(1.0 + 5.0)


# --- faults --------------------------------------------------------------------------------


async def test_429_is_retried_after_retry_after_and_reported(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(http_error(429, retry_after=0.3), reply(Text("ok")))
    kernel, snap = await run_agent(tmp_path, fake, prompt="x")

    assert snap.status == "completed"
    assert fake.requests[1].received_at - fake.requests[0].received_at >= 0.29  # backoff alone is 0.01
    errors = [e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentError)]
    assert [e.errorType for e in errors] == ["rate_limit"]
    assert errors[0].details["willRetry"] is True and errors[0].details["status"] == 429


async def test_529_overloaded_is_retried(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(http_error(529), http_error(503, error_type="api_error"), reply(Text("ok")))
    kernel, snap = await run_agent(tmp_path, fake, prompt="x")
    assert snap.outputs["agent"]["text"] == "ok"
    errors = [e.errorType for e in agent_events(kernel, snap.runId) if isinstance(e, AgentError)]
    assert errors == ["overloaded", "api_error"]


async def test_a_stream_cut_mid_way_is_retried_and_its_deltas_stay_in_the_log(tmp_path: Path,
                                                                              fake: FakeAnthropic) -> None:
    fake.script(cut_off(reply(Text("Hello there", deltas=4)), at=6), reply(Text("Fresh answer")))
    kernel, snap = await run_agent(tmp_path, fake, prompt="x")

    assert snap.outputs["agent"]["text"] == "Fresh answer"
    events = agent_events(kernel, snap.runId)
    assert [e.errorType for e in events if isinstance(e, AgentError)] == ["network_error"]
    deltas = [e.content for e in events if isinstance(e, AgentTextDelta)]
    first_attempt = "".join(deltas)[: -len("Fresh answer")]
    assert first_attempt and "Hello there".startswith(first_attempt)
    # the failed attempt's partial message is not part of the conversation
    conv = stored_conversation(kernel, snap.agentSessions["agent"])
    assert conv == [{"role": "user", "content": "x"},
                    {"role": "assistant", "content": [{"type": "text", "text": "Fresh answer"}]}]


async def test_an_error_event_in_the_stream_and_a_stream_without_message_stop_are_retried(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(stream_error(reply(Text("abc")), at="message_delta"),
                clean_end(reply(Text("abc")), at="message_stop"),
                reply(Text("ok")))
    kernel, snap = await run_agent(tmp_path, fake, prompt="x")
    assert snap.outputs["agent"]["text"] == "ok"
    errors = [e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentError)]
    assert [e.errorType for e in errors] == ["overloaded", "network_error"]
    assert "message_stop" in errors[1].message


async def test_a_bad_request_is_not_retried_and_fails_the_node(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(http_error(400, "messages: roles must alternate"), reply(Text("unused")))
    _, snap = await run_agent(tmp_path, fake, prompt="x")
    assert snap.status == "failed" and fake.request_count == 1
    assert snap.faults["agent"].errorType == "invalid_request"
    assert "roles must alternate" in snap.faults["agent"].message


async def test_retries_give_up_after_the_limit(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(*[http_error(529)] * 4)
    kernel, snap = await run_agent(tmp_path, fake, prompt="x")
    assert snap.status == "failed" and fake.request_count == 4  # first try + max_retries=3
    errors = [e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentError)]
    assert [e.details["willRetry"] for e in errors] == [True, True, True, False]
    assert snap.faults["agent"].errorType == "overloaded"


async def test_a_failed_observability_write_is_reported_and_the_agent_goes_on(
        tmp_path: Path, fake: FakeAnthropic, caplog: pytest.LogCaptureFixture) -> None:
    fake.script(reply(ToolUse("echo", {"text": "a"})), reply(Text("fine")))
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("echo", lambda text: text)

    def broken(row: dict[str, Any], **fencing: Any) -> int:  # the run's lease comes along as ``lease=``
        raise OSError("disk full")

    kernel.store.add_tool_call = broken  # type: ignore[method-assign]
    snap = await kernel.run(kernel.compile(agent_flow(prompt="x", tools=["echo"])), {})
    assert snap.status == "completed" and snap.outputs["agent"]["text"] == "fine"
    errors = [e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentError)]
    assert [e.errorType for e in errors] == ["store_error"] and "disk full" in errors[0].message
    [logged] = [r for r in caplog.records if r.name == "flowkernel.nodes"]
    assert "could not store the agent's tool call" in logged.getMessage() and "disk full" in logged.getMessage()


async def test_an_agent_whose_run_was_taken_over_adds_no_row_and_stops_quietly(
        tmp_path: Path, fake: FakeAnthropic, caplog: pytest.LogCaptureFixture) -> None:
    # WHEN another executor takes the run over while the agent runs a tool (this one froze past its
    # lease) THEN the agent stores no row of that tool call and makes no further model call: the new
    # executor rebuilds the conversation from the rows, which must hold nothing of the stale one.
    from flowkernel.errors import LeaseLostError
    from flowkernel.ids import now_ms

    fake.script(reply(ToolUse("take_over", {})), reply(Text("never asked")))
    kernel = make_kernel(tmp_path, fake)

    def take_over() -> str:
        run = kernel.store.list_runs()[0]
        kernel.store.acquire_lease(run.runId, "other-worker", now_ms(), 60_000, steal_from=run.leaseOwner)
        return "taken"

    kernel.registry.add_tool("take_over", take_over)
    with pytest.raises(LeaseLostError, match="other-worker"):
        await kernel.run(kernel.compile(agent_flow(prompt="x", tools=["take_over"])), {})
    run = kernel.store.list_runs()[0]
    assert (run.status, run.leaseOwner) == ("running", "other-worker")
    assert fake.request_count == 1
    assert kernel.store.list_tool_calls(flow_run_id=run.runId) == []
    assert [r["role"] for r in kernel.store.list_agent_messages(flow_run_id=run.runId)] == ["user", "assistant"]
    assert "could not store" not in caplog.text, "a lost lease is no observability failure"


# --- configuration -------------------------------------------------------------------------


async def test_unknown_tool_name_fails_with_the_known_tools_listed(tmp_path: Path, fake: FakeAnthropic) -> None:
    # A constant name is refused when the flow is loaded; one that a binding gives only when it runs.
    with pytest.raises(FlowValidationError, match=r"\$\.nodes\[0\]\.input\.tools\[0\]: unknown tool 'nope'"):
        await run_agent(tmp_path, fake, prompt="x", tools=["nope"])
    _, snap = await run_agent(tmp_path, fake, prompt="x", tools="{{ ['nope'] }}")
    assert snap.status == "failed" and snap.faults["agent"].errorType == "invalid_input"
    assert "no tool 'nope'" in snap.faults["agent"].message and "ask_human" in snap.faults["agent"].message
    assert fake.request_count == 0


def test_check_reports_every_problem_with_its_path() -> None:
    from flowkernel.errors import Problem
    from flowkernel.nodes.claude.node import ClaudeAgentNode

    problems: list[Problem] = []
    ClaudeAgentNode().check({"model": 3, "session": "sometimes", "thinking": {"budgetTokens": 5000},
                             "maxTokens": 1000, "outputSchema": {"type": "nonsense"}, "bogus": 1},
                            "$.nodes[0].input", problems)
    text = "\n".join(map(str, problems))
    for fragment in ("$.nodes[0].input.bogus", "needs a `prompt`", "$.nodes[0].input.model",
                     "$.nodes[0].input.session", "$.nodes[0].input.maxTokens", "$.nodes[0].input.outputSchema"):
        assert fragment in text
    ok: list[Problem] = []
    ClaudeAgentNode().check({"prompt": "{{ flow.input.x }}", "tools": "{{ state.tools }}"}, "$", ok)
    assert ok == []


async def test_a_temperature_reaches_the_api_though_the_sdk_has_no_parameter_for_it(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    # anthropic 2.14's messages.create() takes no `temperature`; older models still do.
    fake.script(reply(Text("ok")))
    _, snap = await run_agent(tmp_path, fake, prompt="x", model="claude-sonnet-4-6", temperature=0.3)

    assert snap.status == "completed", snap.faults
    assert sent(fake.requests[0].body)["temperature"] == 0.3
