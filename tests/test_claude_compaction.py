"""Conversations longer than the window: ``compaction: {"triggerTokens": N}`` sends the API's
context-management compaction edit (beta ``compact-2026-01-12``, so the SDK's beta client); a
compaction block in an answer is stored as it came, ``agent:compaction`` reports it, and later
requests start at the last compaction block; the stored history keeps every message, and a crash right
after a compaction resumes with exactly the context the model saw.

The fake compacts as the API does: when a request's input (counted from its last compaction block on)
reaches the trigger, the answer starts with a compaction block, ``usage.iterations`` holds the
summarizing pass and the message's, and a compaction block sent back other than as it was served, or
two summaries in one request, are refused with the API's error codes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from flowkernel.agents.tools import tool
from flowkernel.core.events import AgentCompaction, AgentUsage
from flowkernel.errors import FlowValidationError
from flowkernel.fixtures.compare import without_texts
from flowkernel.nodes.claude.context_window import window
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore
from flowkernel.testing.fake_api import Compaction, FakeAnthropic, Text, ToolUse, reply
from flowkernel.testing.fake_conversation import DEFAULT_SUMMARY, context_tokens

from tests.claude_support import agent_events, agent_flow, make_kernel, sent, stored_conversation
from tests.crash_support import KILLED, flowkernel, only_run, write_flow

TRIGGER = 50_000
BIG = "Background for the task. " * 8_400  # about 52,000 tokens by the fake's measure: past the trigger
COMPACTION = {"triggerTokens": TRIGGER, "instructions": "Keep the file names."}


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


def reader_kernel(tmp_path: Path, fake: FakeAnthropic, outputs: dict[str, str] | None = None) -> Kernel:
    kernel = make_kernel(tmp_path, fake)
    kernel.registry.add_tool("read", tool(lambda path: (outputs or {}).get(path, f"contents of {path}")))
    return kernel


async def test_compaction_sends_the_edit_with_its_beta_header_through_the_beta_client(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Text("short and done")))
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="hi", compaction=COMPACTION)), {})

    assert snap.status == "completed", snap.error
    request = fake.requests[0]
    assert request.headers["anthropic-beta"] == "compact-2026-01-12"
    assert request.body["context_management"] == {"edits": [{
        "type": "compact_20260112", "trigger": {"type": "input_tokens", "value": TRIGGER},
        "instructions": "Keep the file names."}]}
    assert not [e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentCompaction)]


async def test_without_compaction_no_edit_and_no_beta_is_sent(tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Text("done")))
    kernel = make_kernel(tmp_path, fake)
    await kernel.run(kernel.compile(agent_flow(prompt="hi")), {})
    assert "context_management" not in fake.requests[0].body
    assert "anthropic-beta" not in fake.requests[0].headers


async def test_a_compaction_is_stored_reported_and_later_requests_start_at_its_block(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("read", {"path": "a.txt"}, id="toolu_a")), reply(Text("a.txt read.")))
    kernel = reader_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt=BIG, tools=["read"], compaction=COMPACTION)), {})

    assert snap.status == "completed", snap.error
    first, second = fake.requests
    before = context_tokens(first.body)
    assert before >= TRIGGER
    block = {"type": "compaction", "signature": "fake-compaction-sig-0", "content": DEFAULT_SUMMARY}
    conversation = stored_conversation(kernel, snap.agentSessions["agent"])
    assert conversation == [
        {"role": "user", "content": BIG},
        {"role": "assistant", "content": [block, {"type": "tool_use", "id": "toolu_a", "name": "read",
                                                  "input": {"path": "a.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a",
                                      "content": "contents of a.txt"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a.txt read."}]},
    ], "the stored history keeps every message, the summarized prompt included"
    # The next request carries the context from the compaction block on, the block exactly as it came.
    assert [m["role"] for m in second.body["messages"]] == ["assistant", "user"]
    assert {k: v for k, v in second.body["messages"][0]["content"][0].items() if k != "cache_control"} == block
    assert BIG not in json.dumps(second.body)
    assert second.outcome == "reply:sse", "the fake accepted the block sent back"

    [event] = [e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentCompaction)]
    assert event.tokensBefore == before and 0 < event.tokensAfter < before
    assert (event.messagesKept, event.messagesSummarized) == (1, 1)
    # The summarizing pass is billed too: its tokens are in the call's usage, not only the message's.
    usage = next(e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentUsage)).usage
    assert usage["inputTokens"] == before + event.tokensAfter
    model_call = kernel.store.list_agent_messages(session_id=snap.agentSessions["agent"])[1]["modelCall"]
    assert [i["type"] for i in model_call["iterations"]] == ["compaction", "message"]


async def test_after_a_second_compaction_requests_carry_only_the_last_summary(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("read", {"path": "big.txt"}, id="toolu_1")),
                reply(Compaction("Second summary: big.txt is long.", encrypted_content="opaque-2"),
                      ToolUse("read", {"path": "c.txt"}, id="toolu_2")),
                reply(Text("done")))
    kernel = reader_kernel(tmp_path, fake, {"big.txt": BIG})
    snap = await kernel.run(kernel.compile(agent_flow(prompt=BIG, tools=["read"], compaction=COMPACTION,
                                                      toolResultMaxBytes=0)), {})

    assert snap.status == "completed", snap.error
    third = fake.requests[2].body["messages"]
    summaries = [b for m in third for b in m["content"] if isinstance(b, dict) and b.get("type") == "compaction"]
    assert [(b["content"], b.get("encrypted_content")) for b in summaries] == [
        ("Second summary: big.txt is long.", "opaque-2")]
    assert third[0]["role"] == "assistant" and third[0]["content"][0]["type"] == "compaction"
    assert fake.requests[2].outcome == "reply:sse"
    events = [e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentCompaction)]
    assert [(e.messagesKept, e.messagesSummarized) for e in events] == [(1, 1), (1, 3)]
    assert len(stored_conversation(kernel, snap.agentSessions["agent"])) == 6


def test_the_window_starts_at_the_last_summary_and_keeps_a_failed_compaction_in_place() -> None:
    def row(role: str, content: Any) -> dict[str, Any]:
        return {"role": role, "content": content, "modelCall": {"model": "m"} if role == "assistant" else None}

    first = {"type": "compaction", "content": "one", "signature": "s1"}
    failed = {"type": "compaction", "signature": "s2"}  # no summary: the API's no-op block
    second = {"type": "compaction", "content": "two", "signature": "s3"}
    rows = [row("system", "be brief"), row("user", "task"), row("assistant", [first, {"type": "text", "text": "a"}]),
            row("user", "more"), row("assistant", [failed, {"type": "text", "text": "b"}]), row("user", "again")]
    seen = window(rows, "m")
    assert seen.messages == [{"role": "assistant", "content": [first, {"type": "text", "text": "a"}]},
                             {"role": "user", "content": "more"},
                             {"role": "assistant", "content": [failed, {"type": "text", "text": "b"}]},
                             {"role": "user", "content": "again"}]
    assert seen.summarized == 1
    rows += [row("assistant", [{"type": "text", "text": "x"}, second]), row("user", "last")]
    later = window(rows, "m")
    assert later.messages == [{"role": "assistant", "content": [second]}, {"role": "user", "content": "last"}]
    assert later.summarized == 5  # the system prompt is not a message


async def test_the_fake_refuses_a_compaction_block_changed_or_repeated(fake: FakeAnthropic) -> None:
    fake.script(reply(ToolUse("read", {"path": "a"}, id="toolu_1")))
    client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=0)
    edit: Any = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": TRIGGER}}]}
    tools: Any = [{"name": "read", "description": "r", "input_schema": {"type": "object"}}]
    first = await client.beta.messages.create(model="claude-sonnet-5-5", max_tokens=100, tools=tools,
                                              messages=[{"role": "user", "content": BIG}],
                                              betas=["compact-2026-01-12"], context_management=edit)
    block = first.content[0].model_dump(exclude_none=True)
    assert block["type"] == "compaction" and first.usage.iterations is not None
    answer: Any = [block, first.content[1].model_dump(exclude_none=True)]
    result: Any = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "A"}]}

    async def send(content: Any, betas: list[str] | None = None) -> None:
        await client.beta.messages.create(model="claude-sonnet-5-5", max_tokens=100, tools=tools,
                                          messages=[{"role": "assistant", "content": content}, result],
                                          betas=betas or ["compact-2026-01-12"], context_management=edit)

    with pytest.raises(anthropic.BadRequestError) as changed:
        await send([{**block, "content": "a summary of my own"}, answer[1]])
    assert changed.value.body["error"]["details"]["error_code"] == "compaction_content_mismatch"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as twice:
        await send([block, block, answer[1]])
    assert twice.value.body["error"]["details"]["error_code"] == "compaction_block_ambiguous"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as forged:
        await send([{**block, "signature": "made-up"}, answer[1]])
    assert forged.value.body["error"]["details"]["error_code"] == "compaction_signature_invalid"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError, match="needs the anthropic-beta header"):
        await client.messages.create(model="claude-sonnet-5-5", max_tokens=100, messages=[
            {"role": "user", "content": "x"}], extra_body={"context_management": edit})
    await client.close()


@pytest.mark.parametrize(("node_input", "path", "fragment"), [
    ({"compaction": {"triggerTokens": 1000}}, "$.nodes[0].input.compaction.triggerTokens", "at least 50000"),
    ({"compaction": {"trigger": 60000}}, "$.nodes[0].input.compaction.trigger", "unknown key"),
    ({"compaction": True}, "$.nodes[0].input.compaction", "triggerTokens"),
    ({"compaction": {"instructions": ""}}, "$.nodes[0].input.compaction.instructions", "non-empty"),
    ({"compaction": {}, "model": "claude-haiku-4-5"}, "$.nodes[0].input.compaction",
     "does not take context-management compaction"),
])
def test_compaction_settings_are_validated_with_their_json_path(node_input: dict[str, Any], path: str,
                                                                fragment: str) -> None:
    with pytest.raises(FlowValidationError) as caught:
        Kernel(MemoryStore()).compile(agent_flow(prompt="x", **node_input))
    lines = [line.strip() for line in str(caught.value).splitlines()]
    assert any(line.startswith(path + ":") and fragment in line for line in lines), lines


# -- a crash right after a compaction ------------------------------------------------------------

TOOLS_PLUGIN = ("flowkernel.examples.research_tools",)


def compaction_flow(tmp_path: Path) -> Path:
    return write_flow(tmp_path, {"name": "long-talk", "nodes": [{"id": "agent", "type": "claude.agent", "input": {
        "prompt": BIG, "tools": ["lookup_fact"], "compaction": {"triggerTokens": TRIGGER}}}]})


def script(fake: FakeAnthropic) -> None:
    # The request reaches the trigger: the fake would compact on its own; a fixed signature makes both
    # runs' blocks alike.
    fake.script(reply(Compaction("The user wants a database for a desktop app.", signature="sig-summary"),
                      Text("Looking it up."), ToolUse("lookup_fact", {"topic": "sqlite"}, id="toolu_s")),
                reply(Text("SQLite it is.")))


# Where the process dies: right after the compaction answer is stored (its tool call not yet), and
# after its tool call is stored too but not the message with its result.
CRASHES = ("before-tool-call:1", "before-message:3")


def test_a_run_killed_right_after_a_compaction_resumes_with_exactly_that_context(tmp_path: Path) -> None:
    flow = compaction_flow(tmp_path)
    with FakeAnthropic() as fake:
        extra = {"ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "test"}
        script(fake)
        done = flowkernel(tmp_path / "reference.db", "run", str(flow), plugins=TOOLS_PLUGIN, extra_env=extra)
        assert done.returncode == 0, done.stderr
        assert "context compacted: " in done.stdout and "1 message summarized" in done.stdout, done.stdout
        expected = fake.requests[1].body
        for crash in CRASHES:
            script(fake)
            db = tmp_path / f"{crash.replace(':', '-')}.db"
            killed = flowkernel(db, "run", str(flow), plugins=TOOLS_PLUGIN, crash=crash, extra_env=extra)
            assert killed.returncode == KILLED, killed.stderr
            run_id = only_run(db)
            resumed = flowkernel(db, "resume", run_id, plugins=TOOLS_PLUGIN, extra_env=extra)
            assert resumed.returncode == 0, resumed.stderr
            after = fake.requests[-1]
            assert after.outcome == "reply:sse", "the fake accepted the compaction block sent back after the resume"
            assert after.body["messages"][0] == expected["messages"][0], "the compaction message, exactly as stored"
            assert BIG not in json.dumps(after.body)
            if crash == "before-message:3":  # the tool's stored result: exactly the uninterrupted run's request
                assert sent(without_texts(after.body, {"continue"})) == sent(expected)
            listed = flowkernel(db, "show", run_id, "--messages", "--json", "--limit", "100", extra_env=extra)
            rows = [json.loads(line) for line in listed.stdout.splitlines()]
            assert rows[0]["content"] == BIG and rows[0]["role"] == "user", "the summarized prompt stays in history"
            assert rows[1]["content"][0]["type"] == "compaction"
            assert rows[-1]["content"] == [{"type": "text", "text": "SQLite it is."}]
            kernel = Kernel(str(db))
            try:
                assert kernel.snapshot(run_id).outputs["agent"]["text"] == "SQLite it is."
                assert [e.type for e in kernel.events(run_id)].count("agent:compaction") == 1
            finally:
                kernel.close()


async def test_each_pass_of_a_compacting_call_is_priced_as_the_request_it_is(tmp_path: Path,
                                                                             fake: FakeAnthropic) -> None:
    # Long-prompt rates go by each pass's own prompt: the summarizing pass read the whole long context,
    # the message pass only the summary.
    fake.script(reply(Text("done"), output_tokens=10))
    prices = {"claude-sonnet-5-5": {"input": 1.0, "output": 2.0,
                                    "longPrompt": {"above": TRIGGER, "input": 10.0, "output": 20.0}}}
    kernel = make_kernel(tmp_path, fake, prices=prices)
    snap = await kernel.run(kernel.compile(agent_flow(prompt=BIG, compaction=COMPACTION)), {})

    assert snap.status == "completed", snap.error
    summarizing, message = kernel.store.list_agent_messages(
        session_id=snap.agentSessions["agent"])[1]["modelCall"]["iterations"]
    assert summarizing["inputTokens"] > TRIGGER > message["inputTokens"]
    expected = (summarizing["inputTokens"] * 10 + summarizing["outputTokens"] * 20
                + message["inputTokens"] * 1 + message["outputTokens"] * 2) / 1_000_000
    assert snap.outputs["agent"]["totalCostUsd"] == pytest.approx(expected)


async def test_fixtures_written_from_a_compacting_run_replay_it_and_refuse_it_without_compaction(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    from flowkernel.fixtures import MockQuery, fixtures_from_run, write_fixtures

    fake.script(reply(ToolUse("read", {"path": "a.txt"}, id="toolu_a")), reply(Text("a.txt read.")))
    kernel = reader_kernel(tmp_path, fake)
    flow = agent_flow(prompt=BIG, tools=["read"], compaction=COMPACTION)
    snap = await kernel.run(kernel.compile(flow), {})
    write_fixtures(fixtures_from_run(kernel.store, snap.runId, tools=dict(kernel.registry.tools),
                                    node_types=kernel.registry.node_types), tmp_path / "fx")

    replay = Kernel(MemoryStore(), registry=kernel.registry, services={"query_fn": MockQuery(tmp_path / "fx")})
    again = await replay.run(replay.compile(flow), {})
    assert again.status == "completed", again.error
    assert again.outputs["agent"]["text"] == "a.txt read."
    [event] = [e for e in replay.events(again.runId) if isinstance(e, AgentCompaction)]
    assert (event.messagesKept, event.messagesSummarized) == (1, 1)

    off = Kernel(MemoryStore(), registry=kernel.registry, services={"query_fn": MockQuery(tmp_path / "fx")})
    refused = await off.run(off.compile(agent_flow(prompt=BIG, tools=["read"])), {})
    assert refused.status == "failed" and refused.faults["agent"].errorType == "fixture_mismatch"
    assert "context_management" in {d["path"] for d in refused.faults["agent"].details["diff"]}


async def test_an_answer_that_stops_after_compacting_is_sent_back_as_it_is_and_the_turn_goes_on() -> None:
    # (At the query seam: the node asks for no pause, but an API that pauses after compacting is answered.)
    block = {"type": "compaction", "content": "Summary.", "signature": "sig-p"}
    sent_requests: list[dict[str, Any]] = []
    answers = [{"content": [block], "stopReason": "compaction"},
               {"content": [{"type": "text", "text": "Done."}], "stopReason": "end_turn"}]

    async def model(request: dict[str, Any], emit: Any, ctx: Any) -> dict[str, Any]:
        sent_requests.append(request)
        return {**answers[len(sent_requests) - 1], "model": request["model"], "id": f"msg_{len(sent_requests)}",
                "usage": {"inputTokens": 5, "outputTokens": 1}}

    kernel = Kernel(MemoryStore(), services={"query_fn": model})
    snap = await kernel.run(kernel.compile(agent_flow(prompt="long task", compaction=COMPACTION, cache=False)), {})

    assert snap.status == "completed", snap.error
    assert snap.outputs["agent"]["text"] == "Done."
    assert sent_requests[1]["messages"] == [{"role": "assistant", "content": [block]}]
    assert [m["role"] for m in stored_conversation(kernel, snap.agentSessions["agent"])] == [
        "user", "assistant", "assistant"]
