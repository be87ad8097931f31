"""The default query function: one model call over the ``anthropic`` SDK, streaming, with retries.

Who owns retries: this function, not the SDK. The client is built with ``max_retries=0`` so that
every failed attempt is seen here and reported as ``agent:error`` (the SDK's own retries are
invisible). Retried, with exponential backoff up to ``max_retries``: 429 (waiting at least
``retry-after``), 529, 408/409 and 5xx, connection failures, a stream cut off mid-way (the SDK
raises the HTTP transport's own error for that, not an ``anthropic`` one), an ``error`` event inside
the stream (the SDK raises a bare ``APIStatusError`` with status 200), and a stream that ends
cleanly before ``message_stop`` (the SDK raises nothing). ``x-should-retry`` from the server wins.
Deltas streamed by a failed attempt stay in the log; the retry streams its own.

A request with ``context_management`` (context-management compaction) goes through the SDK's beta
client with the beta its edits need (``client.beta.messages``, ``anthropic-beta: compact-2026-01-12``):
only the beta types know the ``compaction`` block, its ``compaction_delta`` and ``usage.iterations``,
which the plain client would parse as a text block and drop.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anthropic
import anyio
from flowkernel.agents.credentials import has_key, how_to_call, missing_credentials, sdk_may_discover
from flowkernel.agents.query import ModelMessage, QueryContext
from flowkernel.core.events import AgentError, AgentTextDelta, AgentThinkingDelta, BaseEvent
from flowkernel.errors import NodeFailure
from flowkernel.redaction import register_secret


class QueryFailed(NodeFailure):
    """A model call failed for good (not retryable, or out of retries)."""


class IncompleteStream(Exception):
    """The stream ended before ``message_stop``: the message is not known to be whole."""


@dataclass(frozen=True, slots=True)
class Failure:
    """What went wrong in one attempt, as ``agent:error`` reports it."""

    error_type: str
    message: str
    retryable: bool
    status: int | None = None
    retry_after_s: float | None = None


def _transport_error(exc: BaseException) -> bool:
    # httpx2 is the SDK's transport, imported by it; match by class so we need not import it ourselves.
    return any(c.__name__ in ("TransportError", "StreamError") and c.__module__.split(".")[0] in ("httpx", "httpx2")
               for c in type(exc).__mro__)


_TYPE_BY_BODY = {"rate_limit_error": "rate_limit", "overloaded_error": "overloaded",
                 "api_error": "api_error", "timeout_error": "api_error",
                 "invalid_request_error": "invalid_request", "request_too_large": "invalid_request",
                 "authentication_error": "authentication", "permission_error": "authentication",
                 "not_found_error": "invalid_request", "billing_error": "authentication"}


def _retry_after(headers: Any) -> float | None:
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name) if headers is not None else None
        if raw:
            try:
                return max(0.0, float(raw) / scale)
            except ValueError:
                continue  # an HTTP date: fall back to our own backoff
    return None


def classify(exc: BaseException) -> Failure | None:
    """Map an exception from one attempt to a ``Failure``; ``None`` if it is not a model-call failure."""
    if isinstance(exc, IncompleteStream):
        return Failure("network_error", str(exc), True)
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        body_type = exc.type if isinstance(getattr(exc, "type", None), str) else None
        headers = exc.response.headers if exc.response is not None else None
        text = getattr(exc, "api_message", None) or exc.message
        detail = f"{body_type}: {text}" if body_type else str(text)
        if status == 200:  # an error event inside the stream
            kind = _TYPE_BY_BODY.get(body_type or "", "api_error")
            return Failure(kind, f"error event in the stream: {detail}", True, status)
        if status == 429:
            kind = "rate_limit"
        elif status == 529:
            kind = "overloaded"
        elif status in (401, 403):
            kind = "authentication"
        elif 400 <= status < 500 and status not in (408, 409):
            kind = "invalid_request"
        else:
            kind = "overloaded" if body_type == "overloaded_error" else "api_error"
        retryable = status in (408, 409, 429) or status >= 500
        should = headers.get("x-should-retry") if headers is not None else None
        if should in ("true", "false"):
            retryable = should == "true"
        return Failure(kind, f"HTTP {status} {detail}", retryable, status, _retry_after(headers))
    if isinstance(exc, anthropic.APIConnectionError):
        return Failure("network_error", f"{type(exc).__name__}: {exc}", True)
    if isinstance(exc, anthropic.APIError):
        return Failure("api_error", f"{type(exc).__name__}: {exc}", False)
    if isinstance(exc, TypeError) and "authentication method" in str(exc):
        # The SDK looked for credentials of its own (a profile, a config folder) and found none.
        return Failure("authentication", f"the anthropic SDK found no credentials to call the Messages API with: "
                                         f"{how_to_call()}", False)
    if _transport_error(exc):
        return Failure("network_error", f"the connection broke mid-stream ({type(exc).__name__}: {exc})", True)
    return None


# The beta each context-management edit needs (``anthropic-beta``).
BETA_BY_EDIT = {"compact_20260112": "compact-2026-01-12"}
_USAGE_FIELDS = (("input_tokens", "inputTokens"), ("output_tokens", "outputTokens"),
                 ("cache_creation_input_tokens", "cacheCreationInputTokens"),
                 ("cache_read_input_tokens", "cacheReadInputTokens"))


def betas_for(request: dict[str, Any]) -> list[str]:
    """The betas ``request`` needs; empty for a request the plain client sends."""
    edits = (request.get("context_management") or {}).get("edits") or []
    return sorted({BETA_BY_EDIT[e["type"]] for e in edits if isinstance(e, dict) and e.get("type") in BETA_BY_EDIT})


class _Accumulator:
    """Builds the final message from raw stream events, emitting deltas as they arrive."""

    def __init__(self, emit: Callable[[BaseEvent], None]) -> None:
        self.emit = emit
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, str] = {}
        self.message: dict[str, Any] = {}
        self.usage: dict[str, int] = {}
        self.stop_reason: str | None = None
        self.iterations: list[dict[str, Any]] = []
        self.stopped = False

    def feed(self, event: Any) -> None:
        kind = event.type
        if kind == "message_start":
            m = event.message
            self.message = {"id": m.id, "model": m.model}
            self._usage(m.usage)
        elif kind == "content_block_start":
            block = event.content_block.model_dump(mode="json", exclude_none=True)
            if block.get("type") == "tool_use":
                self.partial_json[event.index] = ""
            if block.get("type") == "text":
                block.pop("citations", None)
            self.blocks[event.index] = block
        elif kind == "content_block_delta":
            self._delta(event.index, event.delta)
        elif kind == "content_block_stop":
            if event.index in self.partial_json:
                raw = self.partial_json.pop(event.index)
                self.blocks[event.index]["input"] = json.loads(raw) if raw else {}
        elif kind == "message_delta":
            self.stop_reason = event.delta.stop_reason
            self._usage(event.usage)
        elif kind == "message_stop":
            self.stopped = True

    def _delta(self, index: int, delta: Any) -> None:
        block = self.blocks[index]
        if delta.type == "text_delta":
            block["text"] = block.get("text", "") + delta.text
            self.emit(AgentTextDelta(content=delta.text))
        elif delta.type == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta.thinking
            self.emit(AgentThinkingDelta(content=delta.thinking))
        elif delta.type == "signature_delta":
            block["signature"] = block.get("signature", "") + delta.signature
        elif delta.type == "input_json_delta":
            self.partial_json[index] += delta.partial_json
        elif delta.type == "citations_delta":
            block.setdefault("citations", []).append(delta.citation.model_dump(mode="json", exclude_none=True))
        elif delta.type == "compaction_delta":
            # One delta carries the whole summary: it replaces, as the SDK's own accumulator does. The
            # block goes back to the API exactly as it came, so a field the delta leaves out stays out.
            for key in ("content", "encrypted_content"):
                if getattr(delta, key, None) is not None:
                    block[key] = getattr(delta, key)

    def _usage(self, usage: Any) -> None:
        # message_delta carries cumulative counts; fields it leaves out (None) keep message_start's value.
        for api, ours in _USAGE_FIELDS:
            value = getattr(usage, api, None)
            if value is not None:
                self.usage[ours] = int(value)
        iterations = getattr(usage, "iterations", None)
        if iterations:
            self.iterations = [{"type": getattr(i, "type", "message"),
                                **{ours: int(getattr(i, api, None) or 0) for api, ours in _USAGE_FIELDS}}
                               for i in iterations]

    def result(self) -> ModelMessage:
        keys = [ours for _, ours in _USAGE_FIELDS]
        if self.iterations:  # the top-level counts leave out a compaction's own pass, which is billed too
            usage = {k: sum(i[k] for i in self.iterations) for k in keys}
        else:
            usage = {k: self.usage.get(k, 0) for k in keys}
        message = ModelMessage(content=[self.blocks[i] for i in sorted(self.blocks)], stopReason=self.stop_reason,
                               usage=usage, model=str(self.message.get("model", "")),
                               id=str(self.message.get("id", "")))
        if self.iterations:
            message["iterations"] = self.iterations
        return message


Sleep = Callable[[float], Awaitable[None]]


class AnthropicQuery:
    """The default ``QueryFn``. ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL`` apply unless given.

    ``max_retries`` counts retries after the first attempt; backoff is ``backoff_s * 2**n`` capped at
    ``max_backoff_s``, and never shorter than the server's ``retry-after``.
    """

    def __init__(self, *, client: anthropic.AsyncAnthropic | None = None, base_url: str | None = None,
                 api_key: str | None = None, max_retries: int = 4, backoff_s: float = 1.0,
                 max_backoff_s: float = 60.0, sleep: Sleep = anyio.sleep) -> None:
        self._client = client
        self._base_url = base_url
        self._api_key = api_key
        register_secret(api_key)
        if client is not None:
            register_secret(client.api_key)
            register_secret(client.auth_token)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._sleep = sleep
        # An httpx client belongs to one event loop; keep one per loop so turns reuse connections.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anthropic.AsyncAnthropic] = \
            weakref.WeakKeyDictionary()

    def client(self) -> anthropic.AsyncAnthropic:
        if self._client is not None:
            return self._client
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            headers: dict[str, Any] = {}
            if self._keyless():
                # A compatible server that takes no key: say so, or the SDK refuses to send the request.
                headers["Authorization"] = anthropic.Omit()
            try:
                client = anthropic.AsyncAnthropic(base_url=self._base_url, api_key=self._api_key, max_retries=0,
                                                  default_headers=headers or None)
                register_secret(client.api_key)  # (whatever the environment gave it: never written)
                register_secret(client.auth_token)
            except anthropic.AnthropicError as exc:
                raise QueryFailed(f"cannot create the Anthropic client: {exc}; set ANTHROPIC_API_KEY",
                                  "authentication") from None
            self._clients[loop] = client
        return client

    def _keyless(self) -> bool:
        """Calls go to a server given by URL with no key, token or SDK credentials to send."""
        return (self._api_key is None and bool(self._base_url or os.environ.get("ANTHROPIC_BASE_URL"))
                and not has_key() and not sdk_may_discover())

    async def aclose(self) -> None:
        """Close the client this event loop uses (its connections belong to the loop)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    async def __call__(self, request: dict[str, Any], emit: Callable[[BaseEvent], None],
                       ctx: QueryContext) -> ModelMessage:
        if self._client is None and self._api_key is None and self._base_url is None:
            missing = missing_credentials(f"node {ctx.node_id!r}")
            if missing is not None:  # the sentence `flowkernel run` refuses with, not the SDK's TypeError
                raise QueryFailed(missing, "authentication")
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._once(request, emit)
            except Exception as exc:
                failure = classify(exc)
                if failure is None:
                    raise
                will_retry = failure.retryable and attempt <= self.max_retries
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                if failure.retry_after_s is not None:
                    delay = max(delay, failure.retry_after_s)
                emit(AgentError(errorType=failure.error_type, message=failure.message, details={
                    "attempt": attempt, "status": failure.status, "willRetry": will_retry,
                    "retryInS": round(delay, 3) if will_retry else None}))
                if not will_retry:
                    hint = "" if failure.retryable else " (not retryable)"
                    raise QueryFailed(f"node {ctx.node_id!r}: model call failed after {attempt} "
                                      f"attempt(s){hint}: {failure.message}", failure.error_type) from exc
                await self._sleep(delay)

    async def _once(self, request: dict[str, Any], emit: Callable[[BaseEvent], None]) -> ModelMessage:
        acc = _Accumulator(emit)
        betas = betas_for(request)
        if betas:
            beta = self.client().beta.messages
            stream: Any = await beta.create(**sdk_arguments(beta.create, request), betas=betas, stream=True)
        else:
            messages = self.client().messages
            stream = await messages.create(**sdk_arguments(messages.create, request), stream=True)
        async with stream:
            async for event in stream:
                acc.feed(event)
        if not acc.stopped:
            raise IncompleteStream("the stream ended before message_stop")
        return acc.result()


_KEYWORDS: dict[Any, frozenset[str]] = {}


def sdk_arguments(create: Callable[..., Any], request: dict[str, Any]) -> dict[str, Any]:
    """``request`` as keyword arguments of the SDK's ``create``: a request field the installed SDK has no
    parameter for (``temperature`` from anthropic 2.14 on) goes in ``extra_body``, so it still reaches
    the wire unchanged instead of failing the call with a ``TypeError``."""
    func = getattr(create, "__func__", create)
    known = _KEYWORDS.get(func)
    if known is None:
        known = _KEYWORDS[func] = frozenset(inspect.signature(create).parameters)
    extra = {k: v for k, v in request.items() if k not in known}
    if not extra:
        return request
    kwargs = {k: v for k, v in request.items() if k in known}
    kwargs["extra_body"] = {**kwargs.get("extra_body", {}), **extra}
    return kwargs


def default_query_fn() -> AnthropicQuery:
    return AnthropicQuery()

