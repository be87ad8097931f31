"""Prompt caching: a tool loop marks its stable prefix, reads it from the cache on every turn, and
pays cache reads, not full input, priced to the cent.

The fake Messages API's prompt cache (``FakeAnthropic(prompt_cache=True)``) counts each request's
input from the breakpoints the real ``anthropic`` client sent, as the API reports it.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from flowkernel.agents.tools import tool
from flowkernel.fixtures import MockQuery, RecordingQuery
from flowkernel.nodes.claude.caching import mark_cache_breakpoints
from flowkernel.testing.fake_api import FakeAnthropic, PromptCache, Text, Thinking, ToolUse, reply

from tests.claude_support import agent_flow, make_kernel

EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(prompt_cache=True) as f:
        yield f


def marked_paths(body: dict[str, Any]) -> list[str]:
    """Where a request carries cache_control, as JSON paths."""
    found: list[str] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            if "cache_control" in value:
                assert value["cache_control"] == EPHEMERAL
                found.append(path)
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else k)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")

    walk(body, "")
    return sorted(found)


def lookup_kernel(tmp_path: Path, fake: FakeAnthropic, **services: Any) -> Any:
    kernel = make_kernel(tmp_path, fake, **services)
    kernel.registry.add_tool("lookup", tool(lambda key: f"value of {key} " * 20))
    return kernel


SYSTEM = "You look things up, one key at a time, and then answer. " * 10


async def test_a_five_turn_tool_loop_marks_tools_system_and_the_conversation_and_reads_its_prefix(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(*[reply(Text(f"Looking up k{i}."), ToolUse("lookup", {"key": f"k{i}"})) for i in range(4)],
                reply(Text("All four keys found.")))
    kernel = lookup_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="Look up k0 to k3.", system=SYSTEM,
                                                      tools=["lookup"])), {})
    assert snap.status == "completed" and snap.outputs["agent"]["numTurns"] == 5

    bodies = [r.body for r in fake.requests]
    assert len(bodies) == 5
    assert marked_paths(bodies[0]) == ["messages[0].content[0]", "system[0]", "tools[0]"]
    for turn, body in enumerate(bodies[1:], start=1):
        last = len(body["messages"]) - 1
        # the whole conversation so far, and where the previous turn's breakpoint was (its last user message)
        assert marked_paths(body) == sorted(["tools[0]", "system[0]", f"messages[{last - 2}].content[0]",
                                             f"messages[{last}].content[0]"]), turn
        assert body["messages"][last]["content"][0]["type"] == "tool_result"
    # the stored conversation holds no markers: they are put on copies, per request
    rows = kernel.store.list_agent_messages(run_id=snap.nodeRuns["agent"], limit=100)
    assert not any(marked_paths({"content": r["content"]}) for r in rows)

    usage = [r.usage for r in fake.requests]
    assert usage[0] is not None and usage[0]["cache_read_input_tokens"] == 0
    assert usage[0]["cache_creation_input_tokens"] > 0
    for before, now in itertools.pairwise(usage):
        assert before is not None and now is not None
        # each turn reads everything the turns before it wrote, and writes only what is new
        assert now["cache_read_input_tokens"] == before["cache_read_input_tokens"] + before["cache_creation_input_tokens"]
        assert 0 < now["cache_creation_input_tokens"] < now["cache_read_input_tokens"]
    out = snap.outputs["agent"]
    assert out["usage"]["cacheReadInputTokens"] == sum(u["cache_read_input_tokens"] for u in usage if u)
    assert out["usage"]["cacheCreationInputTokens"] == sum(u["cache_creation_input_tokens"] for u in usage if u)


async def test_many_parallel_tool_calls_still_read_the_previous_turns_prefix(tmp_path: Path,
                                                                             fake: FakeAnthropic) -> None:
    # 12 tool_use blocks and 12 tool_result blocks put the new breakpoint 24 blocks past the old one,
    # beyond the 20 the API looks back; the marker on the previous user message still finds it.
    fake.script(reply(*[ToolUse("lookup", {"key": f"k{i}"}) for i in range(12)]), reply(Text("done")))
    kernel = lookup_kernel(tmp_path, fake)
    await kernel.run(kernel.compile(agent_flow(prompt="Look up twelve keys.", system=SYSTEM,
                                               tools=["lookup"])), {})
    first, second = (r.usage for r in fake.requests)
    assert first is not None and second is not None
    assert second["cache_read_input_tokens"] == first["cache_creation_input_tokens"] > 0
    # the same two requests with only the last message marked: the read stops at the system prompt
    cache = PromptCache()
    first_body, second_body = (copy.deepcopy(r.body) for r in fake.requests)
    cache.serve(first_body)
    for message in second_body["messages"][:-1]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            block.pop("cache_control", None)
    missed = cache.serve(second_body)
    assert 0 < missed["cache_read_input_tokens"] < second["cache_read_input_tokens"]


async def test_cache_false_sends_no_markers_and_reads_nothing(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("lookup", {"key": "a"})), reply(Text("a found")))
    kernel = lookup_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="Look up a.", system=SYSTEM, tools=["lookup"],
                                                      cache=False)), {})
    assert snap.status == "completed"
    assert [marked_paths(r.body) for r in fake.requests] == [[], []]
    assert fake.requests[0].body["system"] == SYSTEM  # as before: a string, not a marked block
    assert snap.outputs["agent"]["usage"]["cacheReadInputTokens"] == 0


def test_thinking_and_empty_blocks_are_never_marked() -> None:
    request = {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}, {"type": "thinking", "thinking": "t",
                                                                            "signature": "s"}]},
    ]}
    marked = mark_cache_breakpoints(request)
    assert marked["messages"][1]["content"][0]["cache_control"] == EPHEMERAL
    assert "cache_control" not in marked["messages"][1]["content"][1]
    assert marked["messages"][0]["content"] == [{"type": "text", "text": "q", "cache_control": EPHEMERAL}]
    assert request["messages"][0]["content"] == "q"  # the caller's request is left as it was
    empty = mark_cache_breakpoints({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]})
    assert marked_paths(empty) == []


async def test_usage_with_cache_reads_is_priced_per_call_to_the_cent(tmp_path: Path) -> None:
    # Haiku 5.5: the first call's 122k-token prompt pays the higher tier, the second's 91.5k the base one.
    with FakeAnthropic() as fake:
        fake.script(
            reply(ToolUse("lookup", {"key": "a"}), input_tokens=2_000, cache_creation_input_tokens=120_000,
                  output_tokens=1_000),
            reply(Text("a found"), input_tokens=1_000, cache_read_input_tokens=90_000,
                  cache_creation_input_tokens=500, output_tokens=1_000))
        kernel = lookup_kernel(tmp_path, fake)
        snap = await kernel.run(kernel.compile(agent_flow(prompt="Look up a.", model="claude-haiku-5-5",
                                                          tools=["lookup"])), {})
    out = snap.outputs["agent"]
    assert out["usage"] == {"inputTokens": 3_000, "outputTokens": 2_000, "cacheCreationInputTokens": 120_500,
                            "cacheReadInputTokens": 90_000}
    # 2k*0.50 + 120k*0.625 + 1k*2.50 = $0.0785; then 1k*0.10 + 90k*0.01 + 500*0.125 + 1k*0.50 = $0.0015625
    assert out["totalCostUsd"] == pytest.approx(0.0800625, abs=1e-10)
    assert round(out["totalCostUsd"] * 100) == 8  # summed usage priced at one tier would be 9 cents


async def test_recordings_with_markers_replay_with_caching_off_and_old_ones_still_match(tmp_path: Path,
                                                                                       fake: FakeAnthropic) -> None:
    fake.script(reply(Thinking("hm", signature="s"), ToolUse("lookup", {"key": "a"})), reply(Text("a found")))
    kernel = lookup_kernel(tmp_path / "rec", fake)
    recorder = RecordingQuery(kernel.services.query_fn)
    kernel.services = msgspec.structs.replace(kernel.services, query_fn=recorder)
    doc = agent_flow(prompt="Look up a.", system=SYSTEM, tools=["lookup"], thinking={"type": "adaptive"})
    await kernel.run(kernel.compile(doc), {})
    files = recorder.files()
    assert marked_paths(files["agent"]["calls"][1]["input"])  # recorded as sent, markers and all
    from flowkernel.fixtures import write_fixtures

    write_fixtures(files, tmp_path / "fx")
    for flag in (True, False):
        replay = lookup_kernel(tmp_path / f"replay-{flag}", fake, query_fn=MockQuery(tmp_path / "fx"))
        snap = await replay.run(replay.compile({**doc, "nodes": [{**doc["nodes"][0], "input": {
            **doc["nodes"][0]["input"], "cache": flag}}]}), {})
        assert snap.status == "completed", snap.faults
