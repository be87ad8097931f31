"""A Claude Code session's messages (the JSON of ``flowkernel.agents.sessions``) as flowkernel's agent
events (DESIGN §4) and agent-run history (§7, §10).

- partial messages (``stream_event``) → ``agent:text:delta`` / ``agent:thinking:delta``; each model
  call's ``message_start`` + ``message_delta`` → one ``agent:usage``, priced with flowkernel's table
  (the CLI's rates agree with it), so the run's cost moves with every call, as ``claude.agent``'s;
- assistant blocks → ``agent:text`` / ``agent:thinking``; the blocks of one API message → one stored
  assistant message (the SDK yields one ``AssistantMessage`` per block);
- a ``tool_use`` and its ``tool_result`` → ``agent:tool`` (input, output, duration, error) and a
  stored tool call; the user message carrying the results → a stored user message;
- the result → ``agent:complete`` (or ``agent:error`` with the SDK subtype as ``errorType``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from flowkernel.core.events import (
    USAGE_KEYS,
    AgentError,
    AgentText,
    AgentTextDelta,
    AgentThinking,
    AgentThinkingDelta,
    AgentTool,
    AgentUsage,
)
from flowkernel.core.node_context import NodeContext
from flowkernel.nodes.claude.pricing import Price, cost_usd, find_price
from flowkernel.nodes.claude.transcript import Transcript

_API_USAGE = {"input_tokens": "inputTokens", "output_tokens": "outputTokens",
              "cache_creation_input_tokens": "cacheCreationInputTokens",
              "cache_read_input_tokens": "cacheReadInputTokens"}


def usage_of(api_usage: Any) -> dict[str, int]:
    """Messages API usage (snake case) as flowkernel's ``usage`` object."""
    api_usage = api_usage if isinstance(api_usage, dict) else {}
    out = dict.fromkeys(USAGE_KEYS, 0)
    for key, name in _API_USAGE.items():
        value = api_usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[name] = value
    return out


def result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return "" if content is None else str(content)


@dataclass
class _Call:
    """The model call in flight, from ``message_start`` to ``message_stop``."""

    model: str
    message_id: str | None
    usage: dict[str, int]
    stop: str | None = None


@dataclass
class SessionStream:
    """Folds one node run's session messages into events and stored rows."""

    ctx: NodeContext
    transcript: Transcript
    prices: dict[str, Price]
    model: str
    calls: int = 0
    cost: float = 0.0
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_KEYS, 0))
    call: _Call | None = None
    blocks: list[dict[str, Any]] = field(default_factory=list)  # the API message being assembled
    blocks_id: str | None = None
    tools: dict[str, tuple[str, Any, float]] = field(default_factory=dict)  # toolUseId -> name, input, began
    message_rows: dict[str, int | None] = field(default_factory=dict)  # toolUseId -> stored assistant row
    result: dict[str, Any] | None = None

    def take(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "stream_event":
            self._stream(message.get("event") or {})
        elif kind == "assistant":
            self._assistant(message)
        elif kind == "user":
            self._flush()
            self._user(message)
        elif kind == "result":
            self._flush()
            self.result = message
        elif kind == "system" and message.get("subtype") == "mirror_error":
            data = message.get("data") or {}
            self.ctx.emit(AgentError(errorType="store_error", message="the session's transcript could not be "
                                     f"mirrored into the run's store: {data.get('error') or message.get('error')}",
                                     details={"key": data.get("key") or message.get("key")}))

    # -- partial messages: deltas and per-call usage ---------------------------------------

    def _stream(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self._flush()
            body = event.get("message") or {}
            self.call = _Call(str(body.get("model") or self.model), body.get("id"), usage_of(body.get("usage")))
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta" and delta.get("text"):
                self.ctx.emit(AgentTextDelta(content=delta["text"]))
            elif delta.get("type") == "thinking_delta" and delta.get("thinking"):
                self.ctx.emit(AgentThinkingDelta(content=delta["thinking"]))
        elif kind == "message_delta" and self.call is not None:
            out = (event.get("usage") or {}).get("output_tokens")
            if isinstance(out, int):
                self.call.usage["outputTokens"] = out
            self.call.stop = (event.get("delta") or {}).get("stop_reason")
        elif kind == "message_stop" and self.call is not None:
            self._flush()
            self._count(self.call)
            self.call = None

    def _count(self, call: _Call) -> None:
        self.calls += 1
        price = find_price(call.model, self.prices)
        call_cost = cost_usd(call.usage, price)
        self.cost += call_cost
        for k in USAGE_KEYS:
            self.usage[k] += call.usage[k]
        self.ctx.emit(AgentUsage(model=call.model, usage=dict(call.usage), costUsd=round(call_cost, 10)))

    # -- whole messages ---------------------------------------------------------------------

    def _assistant(self, message: dict[str, Any]) -> None:
        message_id = message.get("message_id")
        if self.blocks and message_id != self.blocks_id:
            self._flush()
        self.blocks_id = message_id
        for block in message.get("content") or []:
            if not isinstance(block, dict):
                continue
            self.blocks.append(block)
            kind = block.get("type")
            if kind == "text" and block.get("text"):
                self.ctx.emit(AgentText(content=block["text"]))
            elif kind == "thinking" and block.get("thinking"):
                self.ctx.emit(AgentThinking(content=block["thinking"]))
            elif kind == "tool_use":
                self.tools[str(block.get("id"))] = (str(block.get("name")), block.get("input"), time.monotonic())
        error = message.get("error")
        if error:
            self.ctx.emit(AgentError(errorType=str(error), message=result_text(message.get("content"))
                                     or f"the model call failed: {error}"))

    def _flush(self) -> None:
        """Store the API message assembled so far as one assistant row (one step)."""
        if not self.blocks:
            return
        call = self.call
        step = self.transcript.steps + 1
        self.transcript.steps = step
        model_call = {"model": call.model if call else self.model, "id": self.blocks_id,
                      "stopReason": call.stop if call else None, "usage": dict(call.usage) if call else None}
        row = self.transcript.add("assistant", self.blocks, step, model_call)
        for block in self.blocks:
            if block.get("type") == "tool_use":
                self.message_rows[str(block.get("id"))] = row
        self.blocks, self.blocks_id = [], None

    def _user(self, message: dict[str, Any]) -> None:
        content = message.get("content")
        step = self.transcript.steps
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    self._tool_result(block, step)
        self.transcript.add("user", content, step)

    def _tool_result(self, block: dict[str, Any], step: int) -> None:
        use_id = str(block.get("tool_use_id"))
        name, tool_input, began = self.tools.pop(use_id, ("unknown", None, time.monotonic()))
        output = result_text(block.get("content"))
        failed = bool(block.get("is_error"))
        duration = int((time.monotonic() - began) * 1000)
        self.transcript.add_tool_call({"messageId": self.message_rows.pop(use_id, None), "toolName": name,
                                       "toolUseId": use_id, "input": tool_input, "output": output, "step": step,
                                       "durationMs": duration, "status": "error" if failed else "completed"})
        self.ctx.emit(AgentTool(toolName=name, toolUseId=use_id, toolInput=tool_input, toolOutput=output,
                                durationMs=duration, error=output if failed else None))
