"""The fake Messages API's script and wire format: what a test scripts (blocks, replies, errors, broken
streams) and how each is written on the wire, as JSON or as the SSE stream the real API sends.

Script API (each ``POST /v1/messages`` pops the next response, in order):

- ``reply(*blocks, stop_reason=None, input_tokens=..., output_tokens=None, ...)``: a message of
  ``Text``, ``Thinking`` and ``ToolUse`` blocks. Served as a faithful SSE stream when the
  request has ``"stream": true`` and as a JSON message otherwise. Each block's ``deltas``
  sets how many ``*_delta`` events its content is split into.
- ``http_error(status, message=None, *, error_type=None, retry_after=None, should_retry=None,
  echo_headers=False)``: a non-2xx response with the real ``{"type": "error", "error": {...}}`` body;
  with ``echo_headers`` its message ends with the request's headers, credentials included, as some
  proxies' error pages do.
- ``stream_error(reply, at, error_type="overloaded_error", then=None)``: a 200 stream that sends an
  ``event: error`` at ``at`` and then ends. ``then``: the reply to the client's non-streaming retry
  of that same request (the Claude Code CLI falls back to ``stream: false``), served to it without
  taking a scripted response.
- ``cut_off(reply, at, reset=False)``: a 200 stream whose TCP connection is dropped at ``at``
  without finishing the chunked body (FIN, or RST when ``reset``).
- ``clean_end(reply, at)``: a 200 stream whose HTTP body ends properly at ``at``, before
  ``message_stop``.
- ``held(response, delay=0.0, release=None)``: serve ``response`` only after ``delay`` seconds
  and once ``release`` (a ``threading.Event``) is set.

``at`` is either an ``int`` (how many events of the full stream are sent) or an event name
(the stream stops just before the first event of that name); ``event_names(reply)`` lists
the full stream's event names, pings included.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from flowkernel.testing.fake_conversation import (
    GENERATED,
    Compaction,
    Structured,
    compaction_json,
    compaction_stream,
)

JSONObject = dict[str, Any]
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal", "compaction",
                     "model_context_window_exceeded"]

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
DEFAULT_INPUT_TOKENS = 10  # a reply's input_tokens when it gives none and the prompt cache is off

# The error `type` the real API pairs with each status, used when a test gives none.
DEFAULT_ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


# --- content blocks -------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    text: str
    deltas: int = 2


@dataclass(frozen=True)
class Thinking:
    thinking: str
    signature: str = "fake-signature"
    deltas: int = 2


@dataclass(frozen=True)
class ToolUse:
    name: str
    input: JSONObject
    id: str | None = None  # None: "toolu_fake_<request>_<block>", stable per run
    deltas: int = 3


Block = Text | Thinking | ToolUse | Compaction | Structured


# --- responses ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """A complete message; served as SSE or JSON depending on the request's ``stream``."""

    content: tuple[Block, ...]
    stop_reason: StopReason
    input_tokens: int | None  # None: counted from the request (see FakeAnthropic's prompt_cache), else 10
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    model: str | None  # None echoes the request's model, as the real API does
    id: str | None  # None: "msg_fake_<request>"
    ping_every: int  # an extra ping after every N deltas; 0 for only the usual first one
    iterations: tuple[JSONObject, ...] = ()  # usage.iterations (a compaction's pass, then the message's)


@dataclass(frozen=True)
class ErrorReply:
    status: int
    error_type: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)
    echo_headers: bool = False  # the message ends with the request's headers
    error_code: str | None = None  # error.details.error_code, as the API's compaction errors carry


@dataclass(frozen=True)
class StreamReply:
    """A 200 SSE stream of ``reply`` that stops after ``stop`` events, then ends as ``ending``."""

    reply: Reply
    stop: int
    ending: Literal["error", "clean", "fin", "reset"]
    error_type: str = "overloaded_error"
    error_message: str = "Overloaded"
    then: Reply | None = None  # the reply to the client's non-streaming retry of the same request


@dataclass(frozen=True)
class Held:
    response: Response
    delay: float = 0.0
    release: threading.Event | None = None


Response = Reply | ErrorReply | StreamReply | Held


def reply(
    *content: Block,
    stop_reason: StopReason | None = None,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    cache_creation_input_tokens: int = 0,
    cache_read_input_tokens: int = 0,
    model: str | None = None,
    id: str | None = None,
    ping_every: int = 3,
) -> Reply:
    """A message; ``stop_reason`` defaults to ``tool_use`` if it calls a tool, else ``end_turn``."""
    if stop_reason is None:
        stop_reason = "tool_use" if any(isinstance(b, ToolUse) for b in content) else "end_turn"
    if output_tokens is None:
        # Roughly four characters a token: only needs to be stable and non-zero.
        chars = sum(len(_block_payload(b)) for b in content)
        output_tokens = max(1, chars // 4)
    return Reply(
        content=content,
        stop_reason=stop_reason,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_creation_input_tokens=cache_creation_input_tokens,
        cache_read_input_tokens=cache_read_input_tokens,
        model=model,
        id=id,
        ping_every=ping_every,
    )


def http_error(
    status: int,
    message: str | None = None,
    *,
    error_type: str | None = None,
    retry_after: float | None = None,
    should_retry: bool | None = None,
    echo_headers: bool = False,
) -> ErrorReply:
    """An error response; ``should_retry`` sets ``x-should-retry``, which the SDK obeys; with
    ``echo_headers`` the message ends with the request's headers."""
    headers: dict[str, str] = {}
    if retry_after is not None:
        headers["retry-after"] = _format_seconds(retry_after)
    if should_retry is not None:
        headers["x-should-retry"] = "true" if should_retry else "false"
    error_type = error_type or DEFAULT_ERROR_TYPES.get(status, "api_error")
    return ErrorReply(status, error_type, message or f"fake {error_type}", headers, echo_headers)


def stream_error(
    reply: Reply, at: int | str, error_type: str = "overloaded_error", message: str = "Overloaded",
    *, then: Reply | None = None,
) -> StreamReply:
    return StreamReply(reply, _resolve_stop(reply, at), "error", error_type, message, then)


def cut_off(reply: Reply, at: int | str, *, reset: bool = False) -> StreamReply:
    return StreamReply(reply, _resolve_stop(reply, at), "reset" if reset else "fin")


def clean_end(reply: Reply, at: int | str) -> StreamReply:
    return StreamReply(reply, _resolve_stop(reply, at), "clean")


def held(response: Response, *, delay: float = 0.0, release: threading.Event | None = None) -> Held:
    return Held(response, delay, release)


def event_names(reply: Reply) -> list[str]:
    """The SSE event names of the full stream of ``reply``, in order, pings included."""
    return [name for name, _ in stream_events(reply, model="m", message_id="msg", request_index=0)]


# --- recording ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedRequest:
    index: int
    method: str
    path: str
    headers: Mapping[str, str]  # names lower-cased
    body: Any  # parsed JSON, or None if the body was not JSON
    raw_body: bytes
    received_at: float  # time.monotonic()
    outcome: str  # what the fake served, e.g. "reply:sse", "http_error:429", "script_exhausted"
    usage: Mapping[str, int] | None = None  # input/cache usage the prompt cache counted for it
    lane: str | None = None  # the lane (``script_for``) that answered it, if one did

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True


# --- wire format ----------------------------------------------------------------------------


def _format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


def _block_payload(block: Block) -> str:
    if isinstance(block, Text):
        return block.text
    if isinstance(block, Thinking):
        return block.thinking
    if isinstance(block, Compaction):
        return block.content or ""
    if isinstance(block, Structured):
        return "" if block.value is GENERATED else json.dumps(block.value)
    return json.dumps(block.input)


def _split(s: str, parts: int) -> list[str]:
    """Split ``s`` into ``parts`` non-empty contiguous pieces (fewer if ``s`` is short)."""
    n = max(1, min(parts, len(s)))
    size, extra = divmod(len(s), n)
    pieces, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        pieces.append(s[start:end])
        start = end
    return pieces


def _tool_id(block: ToolUse, request_index: int, block_index: int) -> str:
    return block.id or f"toolu_fake_{request_index}_{block_index}"


def _full_block(block: Block, request_index: int, block_index: int) -> JSONObject:
    if isinstance(block, Text):
        return {"type": "text", "text": block.text}
    if isinstance(block, Thinking):
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    if isinstance(block, Compaction):
        return compaction_json(block, request_index)
    if isinstance(block, Structured):
        raise TypeError("a Structured block is served as the Text of its value")
    return {
        "type": "tool_use",
        "id": _tool_id(block, request_index, block_index),
        "name": block.name,
        "input": block.input,
    }


def message_json(reply: Reply, *, model: str, message_id: str, request_index: int) -> JSONObject:
    input_tokens = DEFAULT_INPUT_TOKENS if reply.input_tokens is None else reply.input_tokens
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [_full_block(b, request_index, i) for i, b in enumerate(reply.content)],
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "cache_creation_input_tokens": reply.cache_creation_input_tokens,
            "cache_read_input_tokens": reply.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": reply.cache_creation_input_tokens,
                "ephemeral_1h_input_tokens": 0,
            },
            "output_tokens": reply.output_tokens,
            **({"iterations": [dict(i) for i in reply.iterations]} if reply.iterations else {}),
        },
    }


def _block_events(block: Block, index: int, request_index: int) -> list[tuple[str, JSONObject]]:
    """content_block_start, its deltas and content_block_stop, shaped as the real API sends them."""
    if isinstance(block, Text):
        start: JSONObject = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": t} for t in _split(block.text, block.deltas)]
    elif isinstance(block, Thinking):
        start = {"type": "thinking", "thinking": "", "signature": ""}
        # Omitted thinking (display "omitted") streams no thinking_delta at all.
        deltas = [{"type": "thinking_delta", "thinking": t} for t in _split(block.thinking, block.deltas)] \
            if block.thinking else []
        # The signature arrives whole, in one delta just before the block stops.
        deltas.append({"type": "signature_delta", "signature": block.signature})
    elif isinstance(block, Compaction):
        start, deltas = compaction_stream(block, request_index)
    elif isinstance(block, Structured):
        raise TypeError("a Structured block is served as the Text of its value")
    else:
        start = {
            "type": "tool_use",
            "id": _tool_id(block, request_index, index),
            "name": block.name,
            "input": {},
        }
        # The real API opens a tool's input with an empty partial_json; clients must cope.
        chunks = ["", *_split(json.dumps(block.input), block.deltas)]
        deltas = [{"type": "input_json_delta", "partial_json": c} for c in chunks]
    return [
        ("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}),
        *[
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ],
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def stream_events(
    reply: Reply, *, model: str, message_id: str, request_index: int
) -> list[tuple[str, JSONObject]]:
    start_message = message_json(reply, model=model, message_id=message_id, request_index=request_index)
    start_message.update(content=[], stop_reason=None, stop_sequence=None)
    # message_start carries the input side of usage; output_tokens only becomes final in message_delta.
    start_message["usage"] = {**start_message["usage"], "output_tokens": 1}

    events: list[tuple[str, JSONObject]] = [
        ("message_start", {"type": "message_start", "message": start_message})
    ]
    deltas_since_ping = 0
    for index, block in enumerate(reply.content):
        for name, data in _block_events(block, index, request_index):
            events.append((name, data))
            if name == "content_block_start" and index == 0:
                events.append(("ping", {"type": "ping"}))  # the real API pings right after the first start
            if name == "content_block_delta" and reply.ping_every > 0:
                deltas_since_ping += 1
                if deltas_since_ping == reply.ping_every:
                    events.append(("ping", {"type": "ping"}))
                    deltas_since_ping = 0
    final_usage: JSONObject = {"output_tokens": reply.output_tokens}
    if reply.iterations:  # the API repeats the input side with them, and they come only here
        usage = start_message["usage"]
        final_usage = {"input_tokens": usage["input_tokens"],
                       "cache_creation_input_tokens": usage["cache_creation_input_tokens"],
                       "cache_read_input_tokens": usage["cache_read_input_tokens"], **final_usage,
                       "iterations": [dict(i) for i in reply.iterations]}
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reply.stop_reason, "stop_sequence": None},
                "usage": final_usage,
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _resolve_stop(reply: Reply, at: int | str) -> int:
    """Resolve ``at`` eagerly, so a bad cut point fails in the test, not in the server thread."""
    names = event_names(reply)
    if isinstance(at, str):
        if at not in names:
            raise ValueError(f"no {at!r} event in this stream; events are {names}")
        return names.index(at)
    if not 0 <= at <= len(names):
        raise ValueError(f"at={at} is outside the stream's 0..{len(names)} events")
    return at


def sse(name: str, data: JSONObject) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def error_body(error_type: str, message: str, request_id: str, error_code: str | None = None) -> JSONObject:
    error: JSONObject = {"type": error_type, "message": message}
    if error_code is not None:
        error["details"] = {"error_code": error_code}
    return {"type": "error", "error": error, "request_id": request_id}


def complaint(message: str) -> ErrorReply:
    # x-should-retry: false, so the SDK surfaces a broken script at once instead of retrying into it.
    return ErrorReply(500, "api_error", message, {"x-should-retry": "false"})


def describe(response: Response, *, stream: bool) -> str:
    if isinstance(response, Held):
        return "held:" + describe(response.response, stream=stream)
    if isinstance(response, ErrorReply):
        return f"http_error:{response.status}"
    if isinstance(response, StreamReply):
        return f"stream:{response.ending}"
    return "reply:sse" if stream else "reply:json"
