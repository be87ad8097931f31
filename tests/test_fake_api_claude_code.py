"""What the fake Messages API does for the Claude Code CLI, driven by the real ``anthropic`` client
(and a raw socket where a client misbehaves): token counting, lanes of scripted replies chosen by
request content, the non-streaming retry after a mid-stream error, quiet disconnects, and requests
that carry ``role: "system"`` messages."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import pytest
from flowkernel.testing.fake_api import (
    FakeAnthropic,
    Text,
    first_user_text_contains,
    header_is,
    reply,
    stream_error,
    title_request,
)

MODEL = "claude-test-model"


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


@pytest.fixture
async def client(fake: FakeAnthropic) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=0) as c:
        yield c


async def ask(client: anthropic.AsyncAnthropic, text: str, **kwargs: Any) -> str:
    message = await client.messages.create(model=MODEL, max_tokens=100,
                                           messages=[{"role": "user", "content": text}], **kwargs)
    return "".join(b.text for b in message.content if b.type == "text")


async def test_count_tokens_answers_without_taking_a_scripted_reply(
        fake: FakeAnthropic, client: anthropic.AsyncAnthropic) -> None:
    fake.script(reply(Text("the reply")))
    short = await client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    long = await client.beta.messages.count_tokens(  # the CLI's form: ?beta=true
        model=MODEL, messages=[{"role": "user", "content": "a tool result " * 400}], tools=[])
    assert 0 < short.input_tokens < long.input_tokens
    assert long.input_tokens == (await client.beta.messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "a tool result " * 400}], tools=[])).input_tokens
    assert fake.remaining == 1 and fake.requests == []
    assert [r.path for r in fake.count_requests] == ["/v1/messages/count_tokens"] * 3
    assert fake.count_requests[1].body["tools"] == [] and fake.count_requests[1].outcome == "count_tokens:200"
    assert await ask(client, "go") == "the reply"


async def test_lanes_answer_the_requests_they_match_and_leave_the_main_script_in_order(
        fake: FakeAnthropic, client: anthropic.AsyncAnthropic) -> None:
    fake.script(reply(Text("main 1")), reply(Text("main 2")))
    titles = fake.script_for(title_request, reply(Text('{"title": "Fix the test"}')))
    sub = fake.script_for(first_user_text_contains("You are the subagent"), reply(Text("sub 1")), name="subagent")
    assert await ask(client, "the task") == "main 1"
    assert await ask(client, "<session>\nthe task\n</session>\n\nWrite the title", tools=[]) == \
        '{"title": "Fix the test"}'
    assert await ask(client, "You are the subagent: look around") == "sub 1"
    assert await ask(client, "the task, next turn") == "main 2"
    assert [r.lane for r in fake.requests] == [None, "title_request", "subagent", None]
    assert titles.remaining == sub.remaining == fake.remaining == 0
    assert [r.index for r in sub.requests] == [2]
    # A matched lane that ran out answers "exhausted" and takes nothing from the main script.
    fake.script(reply(Text("main 3")))
    with pytest.raises(anthropic.InternalServerError, match="lane 'subagent' exhausted: request 4"):
        await ask(client, "You are the subagent again")
    assert fake.remaining == 1


async def test_a_lane_can_route_by_header(fake: FakeAnthropic, client: anthropic.AsyncAnthropic) -> None:
    fake.script(reply(Text("other session")))
    fake.script_for(header_is("X-Claude-Code-Session-Id", "s-1"), reply(Text("session s-1")))
    assert await ask(client, "hi", extra_headers={"x-claude-code-session-id": "s-2"}) == "other session"
    assert await ask(client, "hi", extra_headers={"x-claude-code-session-id": "s-1"}) == "session s-1"


async def test_the_non_streaming_retry_after_a_mid_stream_error_gets_its_scripted_reply(
        fake: FakeAnthropic, client: anthropic.AsyncAnthropic) -> None:
    messages: Any = [{"role": "user", "content": "go"}]
    fake.script(stream_error(reply(Text("never whole")), "message_delta", then=reply(Text("after the fallback"))),
                reply(Text("the next turn")))
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
        async with client.messages.stream(model=MODEL, max_tokens=100, messages=messages) as stream:
            await stream.get_final_message()
    # Another request first: it is not the retry, so it takes the main script's next reply.
    assert await ask(client, "something else") == "the next turn"
    fake.script(reply(Text("spare")))
    retried = await client.messages.create(model=MODEL, max_tokens=100, messages=messages)
    assert [b.text for b in retried.content if b.type == "text"] == ["after the fallback"]
    assert [r.outcome for r in fake.requests] == ["stream:error", "reply:json", "fallback:reply:json"]
    assert fake.remaining == 1


def test_a_client_reset_on_an_idle_keep_alive_connection_prints_no_traceback(
        capfd: pytest.CaptureFixture[str]) -> None:
    with FakeAnthropic() as fake:
        fake.script(reply(Text("hi")))
        host, port = fake.base_url.removeprefix("http://").split(":")
        body = b'{"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}'
        conn = socket.create_connection((host, int(port)))
        conn.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        received = b""
        while b'"end_turn"' not in received:
            received += conn.recv(65536)
        # Killed while the connection idles: the server is waiting for its next request line.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
        deadline = time.monotonic() + 5
        while fake._connections and time.monotonic() < deadline:  # the handler saw the reset and ended
            time.sleep(0.01)
        assert not fake._connections
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err


@pytest.mark.parametrize("prompt_cache", [False, True])
def test_a_request_with_system_role_messages_is_answered(prompt_cache: bool) -> None:
    """The CLI sends its environment block as a ``role: "system"`` message (a list, later a string)."""
    with FakeAnthropic(prompt_cache=prompt_cache) as fake:
        fake.script(reply(Text("ok")), reply(Text("ok again")))
        for system in ([{"type": "text", "text": "# Environment\ncwd: /w"}], "# Environment\ncwd: /w"):
            body = {"model": MODEL, "max_tokens": 100, "messages": [
                {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                             {"type": "text", "text": "the task"}]},
                {"role": "system", "content": system}]}
            got = httpx.post(f"{fake.base_url}/v1/messages?beta=true", json=body,
                             headers={"x-api-key": "dummy", "anthropic-version": "2023-06-01"}, timeout=10)
            assert got.status_code == 200, got.text
            assert got.json()["content"] == [{"type": "text", "text": "ok" if isinstance(system, list) else "ok again"}]
        assert [r.outcome for r in fake.requests] == ["reply:json", "reply:json"]
        if prompt_cache:
            assert all(r.usage and r.usage["input_tokens"] > 10 for r in fake.requests)
