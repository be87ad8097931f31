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

The script (``reply``, ``http_error``, ``stream_error``, ``cut_off``, ``clean_end``, ``held``) and its
wire format: ``flowkernel.testing.fake_wire``; the requests the fake refuses as the API would and its
prompt cache: ``flowkernel.testing.fake_checks``; the HTTP server: ``flowkernel.testing.fake_http``.
Every name a test uses is importable from here.

``fake.script_for(predicate, *responses, name=None)`` opens a **lane**: a request the predicate
matches (it gets an ``Incoming``: the parsed body and the headers) takes the lane's next response
instead of the main script's, so concurrent callers (a session-title request, a subagent) do not
steal the main loop's replies. Lanes are tried in the order they were opened; a matched lane that is
exhausted answers the "script exhausted" 500. ``title_request``, ``first_user_text_contains(text)``
and ``header_is(name, value)`` are ready-made predicates.

``POST /v1/messages/count_tokens`` answers ``{"input_tokens": N}`` (the prompt measured as the prompt
cache measures it) without taking a scripted response; those requests are recorded apart, in
``fake.count_requests``.

Native structured output (``output_config.format``, answered by a scripted ``Structured()``), thinking
``display``, thinking blocks bound to the model that made them, forced ``tool_choice`` with thinking,
and context-management compaction (``Compaction(...)``, or made when a request reaches its trigger)
are emulated as ``fake_conversation`` describes.

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
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from flowkernel.testing.fake_checks import (
    PromptCache,
    as_served,
    invalid_request,
    needs_usage,
    prompt_tokens,
    with_usage,
)
from flowkernel.testing.fake_conversation import (
    Compaction,
    Conversations,
    Structured,
    pauses_after_compaction,
)
from flowkernel.testing.fake_http import FakeServer, shut
from flowkernel.testing.fake_wire import (
    MESSAGES_PATH,
    ErrorReply,
    Held,
    JSONObject,
    RecordedRequest,
    Reply,
    Response,
    StreamReply,
    Text,
    Thinking,
    ToolUse,
    clean_end,
    complaint,
    cut_off,
    describe,
    error_body,
    event_names,
    held,
    http_error,
    reply,
    stream_error,
)

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
        self._server: FakeServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle

    def start(self) -> Self:
        if self._server is not None:
            raise RuntimeError("FakeAnthropic is already started")
        self._server = FakeServer(self)
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
            shut(conn)
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
                shut(conn)  # accepted during close: don't let it hold up the join
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
                response = complaint(f"fake: request {index} body is not a JSON object")
                outcome = "bad_body"
            elif (problem := invalid_request(body)) is not None:
                # Refused before any model runs, as the real API does: the script is kept.
                response = ErrorReply(400, "invalid_request_error", problem)
                outcome = "invalid_request"
            elif (fallback := self._fallback_for(body)) is not None:
                response, outcome = fallback, "fallback:" + describe(fallback, stream=False)
            elif (refusal := self._conversations.refuse(body, headers)) is not None:
                response = ErrorReply(400, "invalid_request_error", refusal.message, error_code=refusal.error_code) \
                    if refusal.status == 400 else complaint(refusal.message)
                outcome = "invalid_request" if refusal.status == 400 else "not_emulated"
            elif pauses_after_compaction(body):
                # The API stops after compacting: the scripted answer is for the request that follows.
                response = as_served(reply(Compaction(), stop_reason="compaction", output_tokens=1), body, index,
                                      self._conversations)
                outcome = "compaction_pause"
            elif (laned := self._from_lanes(index, body, headers)) is not None:
                response, outcome, lane = laned
                response = as_served(response, body, index, self._conversations)
            elif not self._script:
                response = complaint(
                    f"FakeAnthropic script exhausted: request {index} arrived "
                    f"but all {self._served} scripted responses were already served"
                )
                outcome = "script_exhausted"
            else:
                response = self._script.popleft()
                self._served += 1
                outcome = describe(response, stream=body.get("stream") is True)
                response = as_served(response, body, index, self._conversations)
            if isinstance(body, dict):
                self._note_fallback(body, response)
            usage: dict[str, int] | None = None
            if self._cache is not None and isinstance(body, dict) and needs_usage(response):
                usage = self._cache.serve(body)
                response = with_usage(response, usage)
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
                return complaint(f"fake: lane {lane.name!r} predicate failed on request {index}: {exc!r}"), \
                    "lane_error", lane.name
            if not matched:
                continue
            if not lane._responses:
                return complaint(f"FakeAnthropic lane {lane.name!r} exhausted: request {index} matched it "
                                  f"but all {lane.served} of its responses were already served"), \
                    "script_exhausted", lane.name
            lane.served += 1
            response = lane._responses.popleft()
            return response, describe(response, stream=body.get("stream") is True), lane.name
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
                status, payload = 200, {"input_tokens": prompt_tokens(body)}
            else:
                status, payload = 400, error_body("invalid_request_error", "messages: Field required",
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
