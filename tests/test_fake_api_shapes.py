"""The fake Messages API speaks the wire the installed ``anthropic`` SDK's own types describe.

Each response the fake serves (an SSE stream and a JSON message) is read raw over HTTP and built into
the SDK's pydantic models: every stream event as ``BetaRawMessageStreamEvent`` (and, where no beta
block is in it, as ``RawMessageStreamEvent`` too), every body as ``BetaMessage`` (and ``Message``).
pydantic keeps a field a model does not declare in ``model_extra`` instead of failing, so those are
collected and must be none: a field the SDK does not know is a field the real API does not send.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.beta import BetaMessage, BetaRawMessageStreamEvent
from flowkernel.testing.fake_api import (
    Compaction,
    FakeAnthropic,
    Response,
    Structured,
    Text,
    Thinking,
    ToolUse,
    reply,
)
from pydantic import BaseModel, TypeAdapter

BETA_EVENT = TypeAdapter(BetaRawMessageStreamEvent)
EVENT = TypeAdapter(RawMessageStreamEvent)
BETA = {"anthropic-beta": "compact-2026-01-12"}
EDIT = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50_000}}]}
BIG = "word " * 42_000  # past the trigger by the fake's measure
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "when"],
          "properties": {"city": {"type": "string"}, "when": {"type": "string", "format": "date"}}}


def unknown_fields(model: object, path: str = "$") -> list[str]:
    """Paths of the fields the SDK's models do not declare."""
    found: list[str] = []
    if isinstance(model, BaseModel):
        found += [f"{path}.{key}" for key in model.model_extra or {}]
        for name in type(model).model_fields:
            found += unknown_fields(getattr(model, name), f"{path}.{name}")
    elif isinstance(model, list):
        for i, item in enumerate(model):
            found += unknown_fields(item, f"{path}[{i}]")
    return found


def post(fake: FakeAnthropic, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"{fake.base_url}/v1/messages", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in chunk.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def base(**extra: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-5-5", "max_tokens": 1024, "messages": [{"role": "user", "content": "hi"}],
            **extra}


# (name, scripted reply, request body, headers, whether only the beta types know the answer)
CASES: list[tuple[str, Response, dict[str, Any], dict[str, str], bool]] = [
    ("thinking, text and a tool call", reply(Thinking("Let me see.", signature="sig-1"), Text("Hello"),
                                             ToolUse("search", {"q": "x"})), base(), {}, False),
    ("omitted thinking", reply(Thinking("hidden", signature="sig-2"), Text("ok")),
     base(thinking={"type": "adaptive", "display": "omitted"}), {}, False),
    ("summarized thinking", reply(Thinking("shown", signature="sig-3"), Text("ok")),
     base(thinking={"type": "adaptive", "display": "summarized"}), {}, False),
    ("native structured output", reply(Structured()),
     base(output_config={"format": {"type": "json_schema", "schema": SCHEMA}}), {}, False),
    ("a compaction the trigger made", reply(Text("Continuing."), ToolUse("read", {"path": "c.txt"})),
     base(messages=[{"role": "user", "content": BIG}], context_management=EDIT), BETA, True),
    ("a scripted compaction with opaque content", reply(Compaction("Summary.", encrypted_content="EncOpaque=="),
                                                        Text("Done.")),
     base(context_management=EDIT), BETA, True),
]


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


@pytest.mark.parametrize(("name", "scripted", "body", "headers", "beta_only"), CASES, ids=[c[0] for c in CASES])
def test_every_stream_event_and_message_the_fake_serves_is_an_sdk_type_with_no_unknown_field(
        fake: FakeAnthropic, name: str, scripted: Response, body: dict[str, Any], headers: dict[str, str],
        beta_only: bool) -> None:
    fake.script(scripted, scripted)
    status, stream = post(fake, {**body, "stream": True}, headers)
    assert status == 200, stream
    events = sse_events(stream)
    assert [n for n, _ in events][-1] == "message_stop"
    for i, (event_name, data) in enumerate(events):
        assert event_name == data["type"], f"event {i}: SSE name {event_name!r}, data.type {data['type']!r}"
        if event_name == "ping":
            continue
        assert unknown_fields(BETA_EVENT.validate_python(data)) == [], (i, data)
        if not beta_only:
            assert unknown_fields(EVENT.validate_python(data)) == [], (i, data)
    status, message = post(fake, body, headers)
    assert status == 200, message
    parsed = BetaMessage.model_validate(json.loads(message))
    assert unknown_fields(parsed) == []
    if not beta_only:
        assert unknown_fields(Message.model_validate(json.loads(message))) == []
    if beta_only:
        assert parsed.content[0].type == "compaction" and parsed.stop_reason in ("tool_use", "end_turn")
        usage = parsed.usage.iterations or []
        assert [u.type for u in usage] == ["compaction", "message"]
        assert parsed.usage.input_tokens == usage[-1].input_tokens, "top-level usage is the message pass's"


def test_a_shape_the_sdk_does_not_know_is_caught() -> None:
    # The check above would catch a fake that sent the summary as a number, or a field of its own.
    with pytest.raises(ValueError):
        BETA_EVENT.validate_python({"type": "content_block_delta", "index": 0,
                                    "delta": {"type": "compaction_delta", "content": 5}})
    extra = BETA_EVENT.validate_python({"type": "content_block_start", "index": 0,
                                        "content_block": {"type": "text", "text": "", "colour": "red"}})
    assert unknown_fields(extra) == ["$.content_block.colour"]


async def test_the_fakes_compaction_errors_are_the_sdks_own_error_classes(fake: FakeAnthropic) -> None:
    from anthropic.types import CompactionBlockAmbiguousError, CompactionContentMismatchError

    fake.script(reply(Text("ok")))
    client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=0)
    first = await client.beta.messages.create(**base(messages=[{"role": "user", "content": BIG}]),
                                              betas=["compact-2026-01-12"], context_management=EDIT)
    block = first.content[0].model_dump(exclude_none=True)
    for content, error in (([{**block, "content": "changed"}], CompactionContentMismatchError),
                           ([block, block], CompactionBlockAmbiguousError)):
        with pytest.raises(error):
            await client.beta.messages.create(**base(messages=[{"role": "assistant", "content": content},
                                                               {"role": "user", "content": "go on"}]),
                                              betas=["compact-2026-01-12"], context_management=EDIT)
    await client.close()


def test_a_pause_after_compaction_is_the_block_alone_with_stop_reason_compaction(fake: FakeAnthropic) -> None:
    fake.script(reply(Text("Carrying on.")))
    paused = {"edits": [{**EDIT["edits"][0], "pause_after_compaction": True}]}
    body = base(messages=[{"role": "user", "content": BIG}], context_management=paused)
    status, stream = post(fake, {**body, "stream": True}, BETA)
    assert status == 200, stream
    for event_name, data in sse_events(stream):
        if event_name != "ping":
            assert unknown_fields(BETA_EVENT.validate_python(data)) == [], data
    assert fake.remaining == 1, "the pause takes no scripted answer"
    status, text = post(fake, body, BETA)
    message = BetaMessage.model_validate(json.loads(text))
    assert unknown_fields(message) == []
    assert message.stop_reason == "compaction" and [b.type for b in message.content] == ["compaction"]
    assert [u.type for u in message.usage.iterations or []] == ["compaction"]
    block = message.content[0].model_dump(exclude_none=True)
    status, text = post(fake, base(messages=[{"role": "assistant", "content": [block]}],
                                   context_management=paused), BETA)
    assert status == 200 and BetaMessage.model_validate(json.loads(text)).content[0].type == "text"
    assert fake.remaining == 0
