"""A scriptable fake of the Anthropic Messages API, served over real HTTP on loopback.

Tests point the real ``anthropic`` client at it, so the SDK's own transport, SSE
decoder, stream accumulator and retry loop run exactly as in production::

    with FakeAnthropic() as fake:
        fake.script(
            http_error(429, retry_after=0.05),
            reply(Thinking("hmm", signature="sig"), Text("Hello"), ToolUse("search", {"q": "x"})),
        )
        client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test")
        ...
        assert fake.requests[0].body["messages"] == [...]

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

``fake.script_for(predicate, *responses, name=None)`` opens a **lane**: a request the predicate
matches (it gets an ``Incoming``: the parsed body and the headers) takes the lane's next response
instead of the main script's, so concurrent callers (a session-title request, a subagent) do not
steal the main loop's replies. Lanes are tried in the order they were opened; a matched lane that is
exhausted answers the "script exhausted" 500. ``title_request``, ``first_user_text_contains(text)``
and ``header_is(name, value)`` are ready-made predicates.

``POST /v1/messages/count_tokens`` answers ``{"input_tokens": N}`` (the prompt measured as the prompt
cache measures it) without taking a scripted response; those requests are recorded apart, in
``fake.count_requests``.

A client that drops its connection (a killed process, a reset) is dropped quietly: no traceback.

A request the real API would refuse (a thinking budget under 1024 or not below ``max_tokens``, an
unknown thinking type or effort, more than four ``cache_control`` breakpoints, a marker on a thinking
or empty text block) is answered 400 ``invalid_request_error`` and keeps the script.

Native structured output (``output_config.format``, answered by a scripted ``Structured()``), thinking
``display``, thinking blocks bound to the model that made them, forced ``tool_choice`` with thinking,
and context-management compaction (``Compaction(...)``, or made when a request reaches its trigger)
are emulated as ``fake_conversation`` describes.

``FakeAnthropic(prompt_cache=True)`` counts each request's input the way the API's prompt cache
reports it, for every reply scripted without ``input_tokens``: the prompt is measured (about four
characters of canonical JSON a token), each ``cache_control`` breakpoint writes its prefix, and a
later request reads the longest written prefix found at a breakpoint or up to 20 blocks before one
(``cache_read_input_tokens``), writes the rest up to its last breakpoint
(``cache_creation_input_tokens``) and counts what follows as ``input_tokens``. Without it such a
reply reports 10 input tokens and no cache use.

Every request is recorded in ``fake.requests`` (``RecordedRequest``: parsed JSON body,
lower-cased headers, arrival time, and what was served). Running out of script answers 500
``api_error`` with ``x-should-retry: false`` (so the SDK fails fast instead of retrying into
the same hole) and a message saying the script is exhausted. ``fake.request_count`` and
``fake.remaining`` (responses not yet served) are counters; ``wait_for_requests(n, timeout)``
(or ``await wait_for_requests_async(n, timeout)``) blocks until ``n`` requests have arrived,
recorded on arrival, before their response is sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, Self, cast
from urllib.parse import urlsplit

from flowkernel.testing.fake_conversation import (
    GENERATED,
    Compaction,
    Conversations,
    Structured,
    compaction_due,
    compaction_json,
    compaction_stream,
    context_tokens,
    frame_tokens,
    measure,
    output_schema,
    pauses_after_compaction,
    structured_problem,
    usage_entry,
)
from flowkernel.testing.fake_conversation import instance_of as schema_instance

__all__ = [
    "Compaction",
    "ErrorReply",
    "FakeAnthropic",
    "Held",
    "Incoming",
    "Lane",
    "PromptCache",
    "RecordedRequest",
    "Reply",
    "Response",
    "StreamReply",
    "Structured",
    "Text",
    "Thinking",
    "ToolUse",
    "clean_end",
    "cut_off",
    "event_names",
    "first_user_text_contains",
    "header_is",
    "held",
    "http_error",
    "invalid_request",
    "reply",
    "stream_error",
    "title_request",
]

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
    return [name for name, _ in _stream_events(reply, model="m", message_id="msg", request_index=0)]


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


def _message_json(reply: Reply, *, model: str, message_id: str, request_index: int) -> JSONObject:
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


def _stream_events(
    reply: Reply, *, model: str, message_id: str, request_index: int
) -> list[tuple[str, JSONObject]]:
    start_message = _message_json(reply, model=model, message_id=message_id, request_index=request_index)
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


def _sse(name: str, data: JSONObject) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _error_body(error_type: str, message: str, request_id: str, error_code: str | None = None) -> JSONObject:
    error: JSONObject = {"type": error_type, "message": message}
    if error_code is not None:
        error["details"] = {"error_code": error_code}
    return {"type": "error", "error": error, "request_id": request_id}


# --- server ---------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    # Handler threads are joined on close (after their sockets are shut), so no test leaks threads.
    daemon_threads = False
    block_on_close = True

    def __init__(self, fake: FakeAnthropic) -> None:
        self.fake = fake
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client killed or reset while its keep-alive connection idles (the handler waits for its
        # next request line): nothing to report. Anything else is a bug of the fake's, shown as usual.
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked bodies, as the SDK's pool expects

    @property
    def fake(self) -> FakeAnthropic:
        return cast(_Server, self.server).fake

    def setup(self) -> None:
        super().setup()
        self.fake._track(self.connection)

    def finish(self) -> None:
        self.fake._untrack(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean; every request is in fake.requests instead

    def do_POST(self) -> None:
        self._handle()

    def do_GET(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _handle(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        path = urlsplit(self.path).path
        if self.command == "POST" and path == COUNT_TOKENS_PATH:
            status, payload = self.fake._count_tokens(self.command, path, headers, body, raw)
            self._send_json(status, payload, {})
            return
        index, response = self.fake._take(self.command, path, headers, body, raw)
        try:
            self._serve(index, response, body)
        except OSError:
            self.close_connection = True  # the client went away mid-response; nothing to tell it

    def _serve(self, index: int, response: Response, body: Any) -> None:
        request_id = f"req_fake_{index}"
        if isinstance(response, Held):
            if response.delay > 0:
                self.fake._stopping.wait(response.delay)
            if response.release is not None:
                self.fake._wait_gate(response.release)
            if self.fake._stopping.is_set():
                self.close_connection = True
                return
            self._serve(index, response.response, body)
            return
        if isinstance(response, ErrorReply):
            self._send_error(response, index)
            return
        wants_stream = isinstance(body, dict) and body.get("stream") is True
        reply = response.reply if isinstance(response, StreamReply) else response
        model = reply.model or (body.get("model") if isinstance(body, dict) else None) or "claude-fake"
        message_id = reply.id or f"msg_fake_{index}"
        if not wants_stream:
            if isinstance(response, StreamReply):
                problem = (
                    f"fake: scripted a {response.ending} stream but request {index} did not ask to stream"
                )
                self._send_error(_complaint(problem), index)
                return
            message = _message_json(reply, model=model, message_id=message_id, request_index=index)
            self._send_json(200, message, {"request-id": request_id})
            return
        events = _stream_events(reply, model=model, message_id=message_id, request_index=index)
        ending: Literal["error", "clean", "fin", "reset"] = "clean"
        if isinstance(response, StreamReply):
            events, ending = events[: response.stop], response.ending
            if ending == "error":
                error = _error_body(response.error_type, response.error_message, request_id)
                del error["request_id"]  # in-stream errors carry no request_id in their data
                events.append(("error", error))
        self._send_stream(events, ending, request_id)

    def _send_json(self, status: int, payload: JSONObject, headers: Mapping[str, str]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status, "Overloaded" if status == 529 else None)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, error: ErrorReply, index: int) -> None:
        request_id = f"req_fake_{index}"
        message = error.message
        if error.echo_headers:
            headers = dict(self.fake.requests[index].headers)
            message = f"{message} (request headers: {json.dumps(headers)})"
        body = _error_body(error.error_type, message, request_id, error.error_code)
        self._send_json(error.status, body, {"request-id": request_id, **error.headers})

    def _send_stream(
        self,
        events: Sequence[tuple[str, JSONObject]],
        ending: Literal["error", "clean", "fin", "reset"],
        request_id: str,
    ) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("request-id", request_id)
        self.end_headers()
        for name, data in events:
            # One event per chunk, written at once, so the client sees them arrive one by one.
            payload = _sse(name, data)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        if ending == "fin":
            # Drop the connection without the terminating zero-length chunk.
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        elif ending == "reset":
            self.close_connection = True
            # Linger 0 makes close() send RST, as a crashed proxy would.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        else:
            self.wfile.write(b"0\r\n\r\n")


class FakeAnthropic:
    """The fake server; a context manager that starts on enter and stops (joining threads) on exit."""

    def __init__(self, *, prompt_cache: bool = False, min_cache_tokens: int = 0) -> None:
        self._cond = threading.Condition()
        self._cache = PromptCache(min_cache_tokens) if prompt_cache else None
        self._conversations = Conversations()  # what was served that must come back as it was
        self._script: deque[Response] = deque()
        self._requests: list[RecordedRequest] = []
        self._connections: set[socket.socket] = set()
        self._gates: set[threading.Event] = set()
        self._served = 0  # scripted responses handed out, for the exhaustion message
        self._lanes: list[Lane] = []
        self._fallbacks: list[tuple[str, Reply]] = []  # (request key, reply to its non-streaming retry)
        self._count_requests: list[RecordedRequest] = []
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # lifecycle

    def start(self) -> Self:
        if self._server is not None:
            raise RuntimeError("FakeAnthropic is already started")
        self._server = _Server(self)
        # serve_forever only notices shutdown() between polls; its 0.5 s default would add that to
        # every test's teardown.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name="fake-anthropic", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        with self._cond:
            self._stopping.set()
            connections = list(self._connections)
            gates = list(self._gates)
        # Unblock handlers held on a gate: the test is over, so nobody else will release them.
        for gate in gates:
            gate.set()
        server.shutdown()
        # Handlers idle on keep-alive block in readline until their socket is shut.
        for conn in connections:
            _shut(conn)
        server.server_close()
        thread.join()
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeAnthropic is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # scripting and inspection

    def script(self, *responses: Response) -> None:
        """Queue responses for the next ``POST /v1/messages`` requests, in order."""
        with self._cond:
            self._script.extend(responses)

    def script_for(self, predicate: Callable[[Incoming], bool], *responses: Response,
                   name: str | None = None) -> Lane:
        """Open a lane: the requests ``predicate`` matches take ``responses`` in order, not the main
        script's (see the module docstring). Returns the lane, to add to it or look at it."""
        lane = Lane(self, name or str(getattr(predicate, "__name__", "lane")), predicate)
        lane.script(*responses)
        with self._cond:
            self._lanes.append(lane)
        return lane

    @property
    def count_requests(self) -> list[RecordedRequest]:
        """The ``POST /v1/messages/count_tokens`` requests, in order (not in ``requests``)."""
        with self._cond:
            return list(self._count_requests)

    @property
    def remaining(self) -> int:
        """How many scripted responses are not yet served."""
        with self._cond:
            return len(self._script)

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._cond:
            return list(self._requests)

    @property
    def request_count(self) -> int:
        with self._cond:
            return len(self._requests)

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until at least ``n`` requests have arrived; ``TimeoutError`` after ``timeout``."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) >= n, timeout):
                raise TimeoutError(f"expected {n} requests within {timeout}s, got {len(self._requests)}")
            return list(self._requests)

    async def wait_for_requests_async(self, n: int, timeout: float = 5.0) -> list[RecordedRequest]:
        # In a worker thread, so the event loop stays free to run the client making the requests.
        return await asyncio.to_thread(self.wait_for_requests, n, timeout)

    # called from handler threads

    def _track(self, conn: socket.socket) -> None:
        with self._cond:
            if self._stopping.is_set():
                _shut(conn)  # accepted during close: don't let it hold up the join
            self._connections.add(conn)

    def _untrack(self, conn: socket.socket) -> None:
        with self._cond:
            self._connections.discard(conn)

    def _wait_gate(self, gate: threading.Event) -> None:
        with self._cond:
            if self._stopping.is_set():
                return
            self._gates.add(gate)
        gate.wait()
        with self._cond:
            self._gates.discard(gate)

    def _take(
        self, method: str, path: str, headers: Mapping[str, str], body: Any, raw: bytes
    ) -> tuple[int, Response]:
        """Record a request and pick its response: the next scripted one, or the fake's own complaint."""
        with self._cond:
            index = len(self._requests)
            response: Response
            lane: str | None = None
            if method != "POST" or path != MESSAGES_PATH:
                response = ErrorReply(404, "not_found_error", f"fake: no route {method} {path}")
                outcome = "not_found"
            elif not isinstance(body, dict):
                response = _complaint(f"fake: request {index} body is not a JSON object")
                outcome = "bad_body"
            elif (problem := invalid_request(body)) is not None:
                # Refused before any model runs, as the real API does: the script is kept.
                response = ErrorReply(400, "invalid_request_error", problem)
                outcome = "invalid_request"
            elif (fallback := self._fallback_for(body)) is not None:
                response, outcome = fallback, "fallback:" + _describe(fallback, stream=False)
            elif (refusal := self._conversations.refuse(body, headers)) is not None:
                response = ErrorReply(400, "invalid_request_error", refusal.message, error_code=refusal.error_code) \
                    if refusal.status == 400 else _complaint(refusal.message)
                outcome = "invalid_request" if refusal.status == 400 else "not_emulated"
            elif pauses_after_compaction(body):
                # The API stops after compacting: the scripted answer is for the request that follows.
                response = _as_served(reply(Compaction(), stop_reason="compaction", output_tokens=1), body, index,
                                      self._conversations)
                outcome = "compaction_pause"
            elif (laned := self._from_lanes(index, body, headers)) is not None:
                response, outcome, lane = laned
                response = _as_served(response, body, index, self._conversations)
            elif not self._script:
                response = _complaint(
                    f"FakeAnthropic script exhausted: request {index} arrived "
                    f"but all {self._served} scripted responses were already served"
                )
                outcome = "script_exhausted"
            else:
                response = self._script.popleft()
                self._served += 1
                outcome = _describe(response, stream=body.get("stream") is True)
                response = _as_served(response, body, index, self._conversations)
            if isinstance(body, dict):
                self._note_fallback(body, response)
            usage: dict[str, int] | None = None
            if self._cache is not None and isinstance(body, dict) and _needs_usage(response):
                usage = self._cache.serve(body)
                response = _with_usage(response, usage)
            self._requests.append(
                RecordedRequest(index, method, path, dict(headers), body, raw, time.monotonic(), outcome, usage,
                                lane)
            )
            self._cond.notify_all()
            return index, response

    def _from_lanes(self, index: int, body: JSONObject, headers: Mapping[str, str]) -> tuple[Response, str, str] | None:
        """The response of the first lane whose predicate matches the request, with its outcome and
        the lane's name; None when no lane matches. Called under the lock."""
        incoming = Incoming(body, headers)
        for lane in self._lanes:
            try:
                matched = lane.predicate(incoming)
            except Exception as exc:
                return _complaint(f"fake: lane {lane.name!r} predicate failed on request {index}: {exc!r}"), \
                    "lane_error", lane.name
            if not matched:
                continue
            if not lane._responses:
                return _complaint(f"FakeAnthropic lane {lane.name!r} exhausted: request {index} matched it "
                                  f"but all {lane.served} of its responses were already served"), \
                    "script_exhausted", lane.name
            lane.served += 1
            response = lane._responses.popleft()
            return response, _describe(response, stream=body.get("stream") is True), lane.name
        return None

    def _note_fallback(self, body: JSONObject, response: Response) -> None:
        """A stream that ends in an error with a ``then`` reply: keep it for the request's retry."""
        while isinstance(response, Held):
            response = response.response
        if isinstance(response, StreamReply) and response.then is not None and body.get("stream") is True:
            self._fallbacks.append((_retry_key(body), response.then))

    def _fallback_for(self, body: JSONObject) -> Reply | None:
        """The reply kept for this request if it is the non-streaming retry of one that failed mid-stream."""
        if body.get("stream") is True or not self._fallbacks:
            return None
        key = _retry_key(body)
        for i, (wanted, fallback) in enumerate(self._fallbacks):
            if wanted == key:
                del self._fallbacks[i]
                return fallback
        return None

    def _count_tokens(self, method: str, path: str, headers: Mapping[str, str], body: Any,
                      raw: bytes) -> tuple[int, JSONObject]:
        """Record a ``count_tokens`` request and answer it; no scripted response is taken."""
        with self._cond:
            index = len(self._count_requests)
            if isinstance(body, dict) and isinstance(body.get("messages"), list):
                status, payload = 200, {"input_tokens": sum(_tokens(item) for item, _ in _prompt_items(body))}
            else:
                status, payload = 400, _error_body("invalid_request_error", "messages: Field required",
                                                   f"req_fake_count_{index}")
            self._count_requests.append(RecordedRequest(index, method, path, dict(headers), body, raw,
                                                        time.monotonic(), f"count_tokens:{status}"))
            return status, payload


@dataclass(frozen=True)
class Incoming:
    """A ``POST /v1/messages`` request as a lane's predicate sees it."""

    body: JSONObject
    headers: Mapping[str, str]  # names lower-cased

    @property
    def first_user_text(self) -> str:
        """The text of the first user message (its text blocks joined by newlines)."""
        for message in self.body.get("messages") or []:
            if isinstance(message, dict) and message.get("role") == "user":
                return _text_of(message.get("content"))
        return ""


class Lane:
    """Responses for the requests one predicate matches (``FakeAnthropic.script_for``)."""

    def __init__(self, fake: FakeAnthropic, name: str, predicate: Callable[[Incoming], bool]) -> None:
        self._fake = fake
        self.name = name
        self.predicate = predicate
        self._responses: deque[Response] = deque()
        self.served = 0

    def script(self, *responses: Response) -> None:
        """Queue more responses on this lane."""
        with self._fake._cond:
            self._responses.extend(responses)

    @property
    def remaining(self) -> int:
        with self._fake._cond:
            return len(self._responses)

    @property
    def requests(self) -> list[RecordedRequest]:
        """The requests this lane answered."""
        return [r for r in self._fake.requests if r.lane == self.name]


def title_request(request: Incoming) -> bool:
    """The Claude Code CLI's session-title request (sent unless nonessential traffic is disabled)."""
    return request.body.get("tools") == [] and request.first_user_text.startswith("<session>")


def first_user_text_contains(text: str) -> Callable[[Incoming], bool]:
    """Requests whose first user message contains ``text`` (e.g. a subagent's prompt)."""

    def matches(request: Incoming) -> bool:
        return text in request.first_user_text

    matches.__name__ = f"first_user_text_contains({text!r})"
    return matches


def header_is(name: str, value: str) -> Callable[[Incoming], bool]:
    """Requests with header ``name`` equal to ``value`` (e.g. ``x-claude-code-session-id``)."""

    def matches(request: Incoming) -> bool:
        return request.headers.get(name.lower()) == value

    matches.__name__ = f"header_is({name!r}, {value!r})"
    return matches


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


def _retry_key(body: JSONObject) -> str:
    """What a non-streaming retry shares with the request it retries: the model and the messages."""
    return json.dumps([body.get("model"), body.get("messages")], sort_keys=True)


EFFORTS = ("low", "medium", "high", "xhigh", "max")
MAX_CACHE_BREAKPOINTS = 4
MIN_THINKING_BUDGET = 1024


def _content_blocks(body: JSONObject) -> list[tuple[str, Any]]:
    """Every block of the prompt that may carry ``cache_control``, with where it is."""
    blocks: list[tuple[str, Any]] = [(f"tools.{i}", t) for i, t in enumerate(body.get("tools") or [])]
    system = body.get("system")
    if isinstance(system, list):
        blocks += [(f"system.{i}", b) for i, b in enumerate(system)]
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            blocks += [(f"messages.{i}.content.{j}", b) for j, b in enumerate(content)]
    return blocks


def invalid_request(body: JSONObject) -> str | None:
    """What the real API would refuse with 400 in a request's thinking, effort or cache markers."""
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "adaptive", "disabled", "between_tools"):
            return f"thinking.type: Input tag {kind!r} found using 'type' does not match any of the expected tags"
        if kind == "enabled":
            budget = thinking.get("budget_tokens")
            if not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
                return f"thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_THINKING_BUDGET}"
            if budget >= int(body.get("max_tokens") or 0):
                return "`max_tokens` must be greater than `thinking.budget_tokens`"
        elif "budget_tokens" in thinking:
            return f"thinking.{kind}.budget_tokens: Extra inputs are not permitted"
    output_config = body.get("output_config")
    if isinstance(output_config, dict) and output_config.get("effort") not in (None, *EFFORTS):
        return f"output_config.effort: Input should be {', '.join(repr(e) for e in EFFORTS)}"
    marked = 1 if body.get("cache_control") else 0
    for where, block in _content_blocks(body):
        if not isinstance(block, dict) or "cache_control" not in block:
            continue
        marked += 1
        if block.get("type") in ("thinking", "redacted_thinking"):
            return f"{where}.cache_control: thinking blocks cannot be marked for caching"
        if block.get("type") == "text" and not block.get("text"):
            return f"{where}.cache_control: cache_control cannot be set for empty text blocks"
    if marked > MAX_CACHE_BREAKPOINTS:
        return f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {marked}."
    return None


# --- prompt cache ---------------------------------------------------------------------------


def _tokens(item: Any) -> int:
    """A stable stand-in for a tokenizer: about four characters of canonical JSON a token."""
    return max(1, len(json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)) // 4)


def _prompt_items(body: JSONObject) -> list[tuple[Any, bool]]:
    """The prompt in the order the API caches it (tools, system, messages), one item per block,
    each without its marker and with whether it carried one."""
    items: list[tuple[Any, bool]] = []

    def add(where: Any, block: Any) -> None:
        marked = isinstance(block, dict) and "cache_control" in block
        plain = {k: v for k, v in block.items() if k != "cache_control"} if isinstance(block, dict) else block
        items.append(([where, plain], marked))

    for tool in body.get("tools") or []:
        add("tool", tool)
    system = body.get("system")
    for block in [{"type": "text", "text": system}] if isinstance(system, str) else system or []:
        add("system", block)
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content") if isinstance(message, dict) else None
        role = message.get("role") if isinstance(message, dict) else None
        for block in [{"type": "text", "text": content}] if isinstance(content, str) else content or []:
            add(["message", i, role], block)
    return items


class PromptCache:
    """The API's prompt cache, as its usage reports it: each breakpoint (a ``cache_control`` block,
    or the last block for a top-level ``cache_control``) writes the prefix up to it; a request reads
    the longest written prefix found at a breakpoint or up to 20 blocks before one. Reads and writes
    are reported apart from ``input_tokens``, which counts what follows the last breakpoint. Entries
    do not expire. Keyed by model, as the API's cache is."""

    LOOKBACK = 20

    def __init__(self, min_tokens: int = 0) -> None:
        self.min_tokens = min_tokens
        self._written: set[str] = set()

    def serve(self, body: JSONObject) -> dict[str, int]:
        items = _prompt_items(body)
        digests: list[str] = []
        totals: list[int] = []
        running = hashlib.sha256(str(body.get("model")).encode())
        total = 0
        for item, _ in items:
            running.update(json.dumps(item, sort_keys=True).encode())
            digests.append(running.hexdigest())
            total += _tokens(item)
            totals.append(total)
        points = [i for i, (_, marked) in enumerate(items) if marked]
        if body.get("cache_control") and items and len(items) - 1 not in points:
            points.append(len(items) - 1)
        if not points:
            return {"input_tokens": total, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        hit = -1
        for point in points:
            for at in range(point, max(-1, point - self.LOOKBACK), -1):
                if digests[at] in self._written:
                    hit = max(hit, at)
                    break
        last = max(points)
        read = totals[hit] if hit >= 0 else 0
        written = totals[last] - read if last > hit and totals[last] >= self.min_tokens else 0
        for point in points:
            if totals[point] >= self.min_tokens:
                self._written.add(digests[point])
        return {"input_tokens": total - read - written, "cache_creation_input_tokens": written,
                "cache_read_input_tokens": read}


def _as_served(response: Response, body: JSONObject, index: int, served: Conversations) -> Response:
    """The scripted response as the API would serve it to ``body`` (``fake_conversation``): structured
    answers made, thinking omitted when asked, a compaction when due; its signed blocks remembered."""
    if isinstance(response, Held):
        return replace(response, response=_as_served(response.response, body, index, served))
    if isinstance(response, StreamReply):
        inner = _as_served(response.reply, body, index, served)
        return replace(response, reply=inner) if isinstance(inner, Reply) else inner
    if not isinstance(response, Reply):
        return response
    content: list[Block] = []
    schema = output_schema(body)
    for block in response.content:
        if isinstance(block, Structured):
            if schema is None:
                return _complaint(f"fake: request {index} has no output_config.format for the scripted Structured "
                                  "answer")
            value = schema_instance(schema) if block.value is GENERATED else block.value
            if (problem := structured_problem(value, schema)) is not None:
                return _complaint(f"fake: the scripted Structured value does not match request {index}'s "
                                  f"output_config.format schema ({problem}); script a Text to answer off it")
            block = Text(json.dumps(value), deltas=block.deltas)
        thinking = body.get("thinking")
        if isinstance(block, Thinking) and isinstance(thinking, dict) and thinking.get("display") == "omitted":
            block = Thinking("", signature=block.signature, deltas=block.deltas)
        content.append(block)
    scripted = any(isinstance(b, Compaction) for b in content)
    if scripted or compaction_due(body):
        if "context_management" not in body:
            return _complaint(f"fake: a compaction is scripted for request {index}, which has no context_management")
        if not scripted:
            content.insert(0, Compaction())
        summary = next(b for b in content if isinstance(b, Compaction))
        after = frame_tokens(body) + measure(compaction_json(summary, index))
        passes: tuple[JSONObject, ...] = (usage_entry("compaction", context_tokens(body), measure(summary.content)),)
        if response.stop_reason != "compaction":  # paused after compacting: no message pass
            passes += (usage_entry("message", after, response.output_tokens),)
        response = replace(response, input_tokens=after, cache_creation_input_tokens=0, cache_read_input_tokens=0,
                           iterations=passes)
    response = replace(response, content=tuple(content))
    model = response.model or str(body.get("model") or "claude-fake")
    served.remember(_message_json(response, model=model, message_id="", request_index=index))
    return response


def _needs_usage(response: Response) -> bool:
    if isinstance(response, Held):
        return _needs_usage(response.response)
    reply = response.reply if isinstance(response, StreamReply) else response
    return isinstance(reply, Reply) and reply.input_tokens is None


def _with_usage(response: Response, usage: Mapping[str, int]) -> Response:
    if isinstance(response, Held):
        return replace(response, response=_with_usage(response.response, usage))
    if isinstance(response, StreamReply):
        return replace(response, reply=cast(Reply, _with_usage(response.reply, usage)))
    if isinstance(response, Reply):
        return replace(response, input_tokens=usage["input_tokens"],
                       cache_creation_input_tokens=usage["cache_creation_input_tokens"],
                       cache_read_input_tokens=usage["cache_read_input_tokens"])
    return response


def _complaint(message: str) -> ErrorReply:
    # x-should-retry: false, so the SDK surfaces a broken script at once instead of retrying into it.
    return ErrorReply(500, "api_error", message, {"x-should-retry": "false"})


def _describe(response: Response, *, stream: bool) -> str:
    if isinstance(response, Held):
        return "held:" + _describe(response.response, stream=stream)
    if isinstance(response, ErrorReply):
        return f"http_error:{response.status}"
    if isinstance(response, StreamReply):
        return f"stream:{response.ending}"
    return "reply:sse" if stream else "reply:json"


def _shut(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by its handler
