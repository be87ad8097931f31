"""The fake Messages API, driven by the real ``anthropic`` client.

These tests pin down both the fake's wire format (the SDK must parse it as it parses the real
API) and the SDK behaviours that the kernel's error handling relies on: which exception a
dropped stream raises, what an in-stream error looks like, what a truncated stream yields,
and when the SDK retries.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

# The project is not pip-installed in every environment; make the repo root importable.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import anthropic  # noqa: E402
import httpx2  # noqa: E402
import pytest  # noqa: E402
from flowkernel.testing.fake_api import (  # noqa: E402
    FakeAnthropic,
    Text,
    Thinking,
    ToolUse,
    clean_end,
    cut_off,
    event_names,
    held,
    http_error,
    reply,
    stream_error,
)

MODEL = "claude-test-model"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


@pytest.fixture
async def client(fake: FakeAnthropic) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=0) as c:
        yield c


async def stream_final(client: anthropic.AsyncAnthropic, **kwargs: Any) -> Any:
    async with client.messages.stream(model=MODEL, max_tokens=100, messages=MESSAGES, **kwargs) as stream:
        return await stream.get_final_message()


async def raw_events(client: anthropic.AsyncAnthropic, into: list[Any]) -> None:
    """Iterate a raw ``stream=True`` response, keeping every event even if the stream then fails."""
    stream = await client.messages.create(model=MODEL, max_tokens=100, messages=MESSAGES, stream=True)
    async for event in stream:
        into.append(event)


# --- successful messages --------------------------------------------------------------------


async def test_text_stream_final_message_and_usage(
    fake: FakeAnthropic, client: anthropic.AsyncAnthropic
) -> None:
    fake.script(
        reply(
            Text("Hello there, world!", deltas=4),
            input_tokens=42,
            output_tokens=7,
            cache_creation_input_tokens=3,
            cache_read_input_tokens=5,
        )
    )
    texts: list[str] = []
    async with client.messages.stream(model=MODEL, max_tokens=100, messages=MESSAGES) as stream:
        async for text in stream.text_stream:
            texts.append(text)
        message = await stream.get_final_message()

    assert texts == ["Hello", " ther", "e, wo", "rld!"]  # four deltas, arriving separately
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Hello there, world!"
    assert message.stop_reason == "end_turn"
    assert message.model == MODEL  # echoed from the request, as the real API does
    assert message.id == "msg_fake_0"
    assert message.usage.input_tokens == 42
    assert message.usage.output_tokens == 7  # from message_delta, overriding message_start's 1
    assert message.usage.cache_creation_input_tokens == 3
    assert message.usage.cache_read_input_tokens == 5
    assert stream.request_id == "req_fake_0"


async def test_raw_stream_events_follow_the_protocol(
    fake: FakeAnthropic, client: anthropic.AsyncAnthropic
) -> None:
    scripted = reply(Text("abcdef", deltas=3), output_tokens=9)
    fake.script(scripted)
    events: list[Any] = []
    await raw_events(client, events)

    # The SDK drops pings; everything else arrives in the fake's order.
    assert [e.type for e in events] == [n for n in event_names(scripted) if n != "ping"]
    assert "ping" in event_names(scripted)
    start = events[0].message
    assert (start.stop_reason, start.content, start.usage.output_tokens) == (None, [], 1)
    assert start.usage.input_tokens == 10
    assert events[1].content_block.type == "text"
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == "abcdef"
    assert events[-2].delta.stop_reason == "end_turn"
    assert events[-2].usage.output_tokens == 9


async def test_non_streaming_request_gets_json_message(
    fake: FakeAnthropic, client: anthropic.AsyncAnthropic
) -> None:
    fake.script(
        reply(Thinking("hmm", signature="sig-1"), Text("Hi"), ToolUse("lookup", {"k": 1}, id="toolu_1"))
    )
    message = await client.messages.create(model=MODEL, max_tokens=100, messages=MESSAGES)

    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].signature == "sig-1"
    assert message.content[2].input == {"k": 1}
    assert message.content[2].id == "toolu_1"
    assert message.stop_reason == "tool_use"  # defaulted because the reply calls a tool
    assert fake.requests[0].outcome == "reply:json"
    assert fake.requests[0].stream is False


async def test_thinking_with_signature_then_text(
    fake: FakeAnthropic, client: anthropic.AsyncAnthropic
) -> None:
    fake.script(
        reply(Thinking("Let me think about it.", signature="EqQBCgIYAhIM", deltas=3), Text("The answer."))
    )
    events: list[Any] = []
    await raw_events(client, events)
    deltas = [(e.index, e.delta.type) for e in events if e.type == "content_block_delta"]
    assert deltas == [
        (0, "thinking_delta"),
        (0, "thinking_delta"),
        (0, "thinking_delta"),
        (0, "signature_delta"),  # the signature comes whole, after the thinking text
        (1, "text_delta"),
        (1, "text_delta"),
    ]

    fake.script(
        reply(Thinking("Let me think about it.", signature="EqQBCgIYAhIM", deltas=3), Text("The answer."))
    )
    message = await stream_final(client)
    thinking, text = message.content
    assert (thinking.type, thinking.thinking, thinking.signature) == (
        "thinking",
        "Let me think about it.",
        "EqQBCgIYAhIM",
    )
    assert (text.type, text.text) == ("text", "The answer.")


async def test_two_tool_uses_reassembled_from_split_json(
    fake: FakeAnthropic, client: anthropic.AsyncAnthropic
) -> None:
    first = {"query": "weather in Paris", "options": {"units": "metric", "days": [1, 2, 3]}}
    second = {"path": "/tmp/x.txt", "unicode": "naïve ☃", "empty": {}}
    blocks = (
        Text("Calling tools."),
        ToolUse("search", first, deltas=4),
        ToolUse("read_file", second, deltas=5),
    )
    fake.script(reply(*blocks))
    events: list[Any] = []
    await raw_events(client, events)

    for index, expected_chunks in ((1, 4), (2, 5)):
        partials = [
            e.delta.partial_json for e in events if e.type == "content_block_delta" and e.index == index
        ]
        # An empty opening delta, as the real API sends, then JSON split mid-token.
        assert partials[0] == ""
        assert len(partials) == 1 + expected_chunks
        assert all(p for p in partials[1:])

    fake.script(reply(*blocks))
    message = await stream_final(client)
    assert message.stop_reason == "tool_use"
    tools = [b for b in message.content if b.type == "tool_use"]
    assert [(t.name, t.input) for t in tools] == [("search", first), ("read_file", second)]
    assert [t.id for t in tools] == ["toolu_fake_1_1", "toolu_fake_1_2"]  # distinct, stable per request


async def test_recorded_request_body_and_headers(
    fake: FakeAnthropic, client: anthropic.AsyncAnthropic
) -> None:
    fake.script(reply(Text("ok")))
    tools: list[Any] = [
        {"name": "search", "description": "Search.", "input_schema": {"type": "object", "properties": {}}}
    ]
    # (SDK 2.x's messages.stream() takes no `temperature`; stop_sequences and tool_choice stand in.)
    await stream_final(
        client, system="Be brief.", tools=tools, stop_sequences=["END"], tool_choice={"type": "auto"}
    )

    [request] = fake.requests
    assert request.body == {
        "model": MODEL,
        "max_tokens": 100,
        "messages": MESSAGES,
        "system": "Be brief.",
        "tools": tools,
        "stop_sequences": ["END"],
        "tool_choice": {"type": "auto"},
        "stream": True,
    }
    assert request.stream is True
    assert (request.method, request.path) == ("POST", "/v1/messages")
    # SDK 2.x sends the API key as a bearer token, not the x-api-key header of 0.x.
    assert request.headers["authorization"] == "Bearer test"
    assert "x-api-key" not in request.headers
    assert request.headers["anthropic-version"]
    assert request.headers["content-type"] == "application/json"
    assert request.outcome == "reply:sse"
    assert fake.request_count == 1
    assert fake.remaining == 0


def test_sync_client_works_too(fake: FakeAnthropic) -> None:
    # The server runs in its own thread, so a blocking client in the test thread is fine.
    fake.script(reply(Text("sync")))
    with anthropic.Anthropic(base_url=fake.base_url, api_key="test", max_retries=0) as client:
        message = client.messages.create(model=MODEL, max_tokens=10, messages=MESSAGES)
    assert message.content[0].type == "text"
    assert message.content[0].text == "sync"


# --- HTTP errors and retries ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_class", "error_type"),
    [
        (400, anthropic.BadRequestError, "invalid_request_error"),
        (401, anthropic.AuthenticationError, "authentication_error"),
        (429, anthropic.RateLimitError, "rate_limit_error"),
        (500, anthropic.InternalServerError, "api_error"),
        (529, anthropic.OverloadedError, "overloaded_error"),
    ],
)
async def test_http_errors_map_to_sdk_classes(
    fake: FakeAnthropic,
    client: anthropic.AsyncAnthropic,
    status: int,
    error_class: type[anthropic.APIStatusError],
    error_type: str,
) -> None:
    fake.script(http_error(status, "scripted failure"))
    with pytest.raises(error_class) as caught:
        await stream_final(client)
    assert caught.value.status_code == status
    assert caught.value.body == {
        "type": "error",
        "error": {"type": error_type, "message": "scripted failure"},
        "request_id": "req_fake_0",
    }
    assert caught.value.type == error_type
    assert caught.value.request_id == "req_fake_0"
    assert fake.requests[0].outcome == f"http_error:{status}"


async def test_429_retry_after_then_success(fake: FakeAnthropic) -> None:
    fake.script(http_error(429, retry_after=0.05), reply(Text("after the wait")))
    async with anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=2) as client:
        message = await stream_final(client)

    # The SDK retries 429 by itself, invisibly to the caller, and honours retry-after
    # (seconds, floats accepted): its own backoff would have waited at least 0.375 s.
    assert message.content[0].text == "after the wait"
    first, second = fake.requests
    assert [first.headers["x-stainless-retry-count"], second.headers["x-stainless-retry-count"]] == ["0", "1"]
    assert first.body == second.body
    assert 0.05 <= second.received_at - first.received_at < 0.35


async def test_429_without_retries_exposes_retry_after(
    fake: FakeAnthropic, client: anthropic.AsyncAnthropic
) -> None:
    fake.script(http_error(429, retry_after=30))
    with pytest.raises(anthropic.RateLimitError) as caught:
        await stream_final(client)
    assert caught.value.response.headers["retry-after"] == "30"
    assert fake.request_count == 1


async def test_529_then_success_uses_default_backoff(fake: FakeAnthropic) -> None:
    fake.script(http_error(529), reply(Text("recovered")))
    async with anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=1) as client:
        message = await stream_final(client)

    assert message.content[0].text == "recovered"
    first, second = fake.requests
    assert (first.outcome, second.outcome) == ("http_error:529", "reply:sse")
    # No retry-after, so the SDK's first backoff: 0.5 s less up to 25 % jitter.
    assert second.received_at - first.received_at >= 0.3


async def test_529_retries_run_out(fake: FakeAnthropic) -> None:
    fake.script(http_error(529, retry_after=0.01), http_error(529))
    async with anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=1) as client:
        with pytest.raises(anthropic.OverloadedError):
            await stream_final(client)
    assert fake.request_count == 2


async def test_should_retry_header_is_obeyed(fake: FakeAnthropic) -> None:
    fake.script(http_error(529, should_retry=False), reply(Text("never served")))
    async with anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=2) as client:
        with pytest.raises(anthropic.OverloadedError):
            await stream_final(client)
    assert fake.request_count == 1
    assert fake.remaining == 1


# --- broken streams -------------------------------------------------------------------------


async def test_in_stream_error_event_raises_api_status_error(
    fake: FakeAnthropic, client: anthropic.AsyncAnthropic
) -> None:
    scripted = reply(Text("partial answer that never finishes", deltas=4))
    at = event_names(scripted).index("content_block_delta") + 2  # stop after the first two deltas
    fake.script(stream_error(scripted, at, "overloaded_error", "Overloaded"))
    events: list[Any] = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        await raw_events(client, events)

    error = caught.value
    # The SDK builds the error from the 200 response it is streaming: the status stays 200, so
    # it is the bare APIStatusError rather than OverloadedError; the error type is in the body.
    assert type(error) is anthropic.APIStatusError
    assert error.status_code == 200
    assert error.type == "overloaded_error"
    assert error.body == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert error.request_id == "req_fake_0"
    assert [e.type for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
    ]
    assert fake.requests[0].outcome == "stream:error"


async def test_in_stream_error_is_not_retried(fake: FakeAnthropic) -> None:
    fake.script(stream_error(reply(Text("x")), "content_block_stop"), reply(Text("unused")))
    async with anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=2) as client:
        with pytest.raises(anthropic.APIStatusError):
            await stream_final(client)
    # The retry loop only covers getting the response; errors while reading the body surface as-is.
    assert fake.request_count == 1


async def test_cut_off_stream_raises_transport_error(fake: FakeAnthropic) -> None:
    scripted = reply(Text("this will be cut", deltas=4))
    fake.script(cut_off(scripted, "content_block_stop"), reply(Text("unused")))
    events: list[Any] = []
    async with anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=2) as client:
        with pytest.raises(httpx2.RemoteProtocolError, match="incomplete chunked read") as caught:
            await raw_events(client, events)

    # A connection dropped mid-body leaks out as httpx2's own error: not an APIError (not even
    # APIConnectionError), and not retried although retries were enabled.
    assert not isinstance(caught.value, anthropic.APIError)
    assert isinstance(caught.value, httpx2.TransportError)
    assert [e.type for e in events] == ["message_start", "content_block_start", *["content_block_delta"] * 4]
    assert fake.request_count == 1
    assert fake.requests[0].outcome == "stream:fin"


async def test_reset_stream_raises_read_error(fake: FakeAnthropic, client: anthropic.AsyncAnthropic) -> None:
    fake.script(cut_off(reply(Text("reset me")), "content_block_delta", reset=True))
    with pytest.raises(httpx2.ReadError) as caught:
        await stream_final(client)
    # A TCP reset surfaces as httpx2.ReadError, also outside anthropic's hierarchy.
    assert not isinstance(caught.value, anthropic.APIError)
    assert fake.requests[0].outcome == "stream:reset"


async def test_clean_end_before_message_delta_gives_null_stop_reason(
    fake: FakeAnthropic, client: anthropic.AsyncAnthropic
) -> None:
    scripted = reply(Text("Hello world", deltas=2), output_tokens=50)
    fake.script(clean_end(scripted, "message_delta"))
    message = await stream_final(client)

    # A body that ends cleanly without message_delta/message_stop raises nothing: the SDK hands
    # back its snapshot, whose stop_reason is still message_start's null and whose output_tokens
    # is still message_start's 1. Callers must treat stop_reason None as "truncated".
    assert message.stop_reason is None
    assert message.usage.output_tokens == 1
    assert message.content[0].text == "Hello world"


async def test_clean_end_mid_block_and_before_message_stop(
    fake: FakeAnthropic, client: anthropic.AsyncAnthropic
) -> None:
    scripted = reply(Text("Hello world", deltas=2), ToolUse("t", {"a": 1}))
    names = event_names(scripted)
    fake.script(
        clean_end(scripted, names.index("content_block_delta") + 1),  # after the first of two text deltas
        clean_end(scripted, "message_stop"),
    )

    partial = await stream_final(client)
    assert partial.stop_reason is None
    assert [b.type for b in partial.content] == ["text"]
    assert partial.content[0].text == "Hello "

    # Only message_stop missing: the message is complete, and the SDK does not notice the gap.
    nearly = await stream_final(client)
    assert nearly.stop_reason == "tool_use"
    assert nearly.content[1].input == {"a": 1}


def test_cut_points_are_validated_when_scripting() -> None:
    scripted = reply(Text("x"))
    with pytest.raises(ValueError, match="no 'error' event"):
        cut_off(scripted, "error")
    with pytest.raises(ValueError, match="outside"):
        clean_end(scripted, len(event_names(scripted)) + 1)


# --- the fake's own behaviour ---------------------------------------------------------------


async def test_script_exhausted_fails_fast_and_is_recorded(fake: FakeAnthropic) -> None:
    fake.script(reply(Text("only one")))
    async with anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=2) as client:
        await stream_final(client)
        with pytest.raises(anthropic.InternalServerError, match="script exhausted") as caught:
            await stream_final(client)
    assert caught.value.type == "api_error"
    # x-should-retry: false stops the SDK from retrying into an empty script.
    assert [r.outcome for r in fake.requests] == ["reply:sse", "script_exhausted"]


async def test_stream_only_script_answering_a_json_request_is_an_error(
    fake: FakeAnthropic, client: anthropic.AsyncAnthropic
) -> None:
    fake.script(clean_end(reply(Text("x")), "message_stop"))
    with pytest.raises(anthropic.InternalServerError, match="did not ask to stream"):
        await client.messages.create(model=MODEL, max_tokens=10, messages=MESSAGES)


async def test_unknown_route_is_404_and_keeps_the_script(
    fake: FakeAnthropic, client: anthropic.AsyncAnthropic
) -> None:
    fake.script(reply(Text("kept")))
    with pytest.raises(anthropic.NotFoundError):
        await client.models.list()
    assert fake.requests[0].outcome == "not_found"
    assert fake.remaining == 1


async def test_wait_for_requests_sees_a_held_request(
    fake: FakeAnthropic, client: anthropic.AsyncAnthropic
) -> None:
    release = threading.Event()
    fake.script(held(reply(Text("released")), release=release))
    task = asyncio.create_task(stream_final(client))

    [request] = await fake.wait_for_requests_async(1, timeout=5)
    assert request.outcome == "held:reply:sse"
    assert not task.done()  # recorded on arrival, before the response is sent
    release.set()
    message = await asyncio.wait_for(task, timeout=5)
    assert message.content[0].text == "released"


async def test_delayed_response(fake: FakeAnthropic, client: anthropic.AsyncAnthropic) -> None:
    fake.script(held(reply(Text("late")), delay=0.2))
    started = time.monotonic()
    await stream_final(client)
    assert time.monotonic() - started >= 0.2


def test_wait_for_requests_times_out(fake: FakeAnthropic) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="expected 1 requests"):
        fake.wait_for_requests(1, timeout=0.1)
    assert time.monotonic() - started < 2


def test_close_does_not_hang_on_open_connections_or_held_requests() -> None:
    fake = FakeAnthropic().start()
    release = threading.Event()
    fake.script(reply(Text("a")), held(reply(Text("b")), release=release))
    client = anthropic.Anthropic(base_url=fake.base_url, api_key="test", max_retries=0)
    client.messages.create(model=MODEL, max_tokens=10, messages=MESSAGES)  # leaves a keep-alive connection
    blocked = threading.Thread(target=_swallow, args=(client,), daemon=True)
    blocked.start()
    fake.wait_for_requests(2, timeout=5)

    closer = threading.Thread(target=fake.close, daemon=True)
    closer.start()
    closer.join(timeout=5)
    assert not closer.is_alive()
    assert release.is_set()  # close released the held handler so its thread could be joined
    blocked.join(timeout=5)
    client.close()
    with pytest.raises(RuntimeError, match="not started"):
        _ = fake.base_url


def _swallow(client: anthropic.Anthropic) -> None:
    try:
        client.messages.create(model=MODEL, max_tokens=10, messages=MESSAGES)
    except (anthropic.APIError, httpx2.HTTPError):
        pass  # the fake closed under it; the test only cares that close() returned
