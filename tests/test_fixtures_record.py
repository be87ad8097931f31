"""Recording round trip: record against the fake Messages API, re-run from the fixtures, same events and outputs."""

from __future__ import annotations

from pathlib import Path

import anyio
from flowkernel.agents.anthropic import AnthropicQuery
from flowkernel.agents.tools import tool
from flowkernel.fixtures import MockQuery, RecordingQuery, fixtures_from_run, write_fixtures
from flowkernel.run.kernel import Kernel
from flowkernel.run.timetravel import comparable
from flowkernel.store.memory import MemoryStore
from flowkernel.testing.fake_api import FakeAnthropic, Text, Thinking, ToolUse, reply

FLOW = {"name": "rt", "nodes": [
    {"id": "ask", "type": "claude.agent", "input": {"prompt": "Add 2 and 3, then explain.", "tools": ["add"],
                                                    "thinking": {"type": "adaptive", "effort": "medium"}}},
    {"id": "say", "type": "claude.agent", "input": {"prompt": "Repeat: {{ ask.text }}", "system": "Be brief."}},
], "edges": [{"from": "ask", "to": "say"}]}


@tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def kernel_with(query: object) -> Kernel:
    from flowkernel.plugins.registry import default_registry

    reg = default_registry().copy()
    reg.add_tool("add", add)
    return Kernel(MemoryStore(), registry=reg, services={"query_fn": query})


def test_recorded_fixtures_reproduce_the_same_events_and_outputs(tmp_path: Path) -> None:
    with FakeAnthropic() as fake:
        fake.script(reply(Thinking("2+3 needs the tool"), ToolUse("add", {"a": 2, "b": 3}), input_tokens=31,
                          cache_creation_input_tokens=700, output_tokens=12),
                    reply(Text("2 + 3 = 5, because adding counts on.", deltas=4), input_tokens=17,
                          cache_read_input_tokens=700, output_tokens=9),
                    reply(Text("2 + 3 = 5."), stop_reason="max_tokens", input_tokens=5, output_tokens=4))
        recorder = RecordingQuery(AnthropicQuery(base_url=fake.base_url, api_key="test", max_retries=0))
        live = kernel_with(recorder)
        first = anyio.run(live.run, live.compile(FLOW), {})
    assert first.status == "completed"
    write_fixtures(recorder.files(), tmp_path / "recorded")

    replayed = kernel_with(MockQuery(tmp_path / "recorded"))
    second = anyio.run(replayed.run, replayed.compile(FLOW), {})
    assert [comparable(e) for e in replayed.events(second.runId)] == [comparable(e) for e in live.events(first.runId)]

    def strip(outputs: dict[str, dict[str, object]]) -> dict[str, dict[str, object]]:
        return {k: {**v, "sessionId": None} for k, v in outputs.items()}
    assert strip(second.outputs) == strip(first.outputs)

    # the stored run alone (conversation + events) gives the same requests and streams
    from_store = fixtures_from_run(live.store, first.runId, node_types=live.registry.node_types,
                                   tools=live.registry.tools)
    for node, doc in recorder.files().items():
        assert [c["input"] for c in from_store[node]["calls"]] == [c["input"] for c in doc["calls"]]
        assert [c["events"] for c in from_store[node]["calls"]] == [c["events"] for c in doc["calls"]]
        # each assistant message keeps its own call: model, id, stop reason and usage, as answered
        assert [c["output"] for c in from_store[node]["calls"]] == [c["output"] for c in doc["calls"]]
    assert from_store["ask"]["calls"][1]["output"]["usage"]["cacheReadInputTokens"] == 700
    assert from_store["say"]["calls"][0]["output"]["stopReason"] == "max_tokens"
    write_fixtures(from_store, tmp_path / "from-store")
    third_kernel = kernel_with(MockQuery(tmp_path / "from-store"))
    third = anyio.run(third_kernel.run, third_kernel.compile(FLOW), {})
    assert strip(third.outputs) == strip(first.outputs)


def test_assistant_messages_keep_their_calls_usage_in_sqlite(tmp_path: Path) -> None:
    from flowkernel.store.sql.sqlite import SqliteStore

    with FakeAnthropic() as fake:
        fake.script(reply(ToolUse("add", {"a": 1, "b": 1}), input_tokens=40, output_tokens=7, id="msg_a"),
                    reply(Text("2"), input_tokens=3, cache_read_input_tokens=40, output_tokens=2, id="msg_b"))
        from flowkernel.plugins.registry import default_registry

        reg = default_registry().copy()
        reg.add_tool("add", add)
        kernel = Kernel(SqliteStore(tmp_path / "runs.db"), registry=reg, services={
            "query_fn": AnthropicQuery(base_url=fake.base_url, api_key="test", max_retries=0)})
        doc = {"name": "one", "nodes": [FLOW["nodes"][0]], "edges": []}
        snap = anyio.run(kernel.run, kernel.compile(doc), {})
    rows = [r for r in kernel.store.list_agent_messages(flow_run_id=snap.runId) if r["role"] == "assistant"]
    assert [r["modelCall"] for r in rows] == [
        {"model": "claude-sonnet-5-5", "id": "msg_a", "stopReason": "tool_use",
         "usage": {"inputTokens": 40, "outputTokens": 7, "cacheCreationInputTokens": 0, "cacheReadInputTokens": 0}},
        {"model": "claude-sonnet-5-5", "id": "msg_b", "stopReason": "end_turn",
         "usage": {"inputTokens": 3, "outputTokens": 2, "cacheCreationInputTokens": 0, "cacheReadInputTokens": 40}},
    ]
    users = [r for r in kernel.store.list_agent_messages(flow_run_id=snap.runId) if r["role"] != "assistant"]
    assert users and all(r["modelCall"] is None for r in users)
