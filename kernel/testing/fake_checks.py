"""What the fake Messages API checks and computes about a request as the real API does: the requests it
refuses, the prompt cache's token counts, and a scripted answer as served to the request that takes it.

A request the real API would refuse (a thinking budget under 1024 or not below ``max_tokens``, an
unknown thinking type or effort, more than four ``cache_control`` breakpoints, a marker on a thinking
or empty text block) is answered 400 ``invalid_request_error`` and keeps the script.

``FakeAnthropic(prompt_cache=True)`` counts each request's input the way the API's prompt cache
reports it, for every reply scripted without ``input_tokens``: the prompt is measured (about four
characters of canonical JSON a token), each ``cache_control`` breakpoint writes its prefix, and a
later request reads the longest written prefix found at a breakpoint or up to 20 blocks before one
(``cache_read_input_tokens``), writes the rest up to its last breakpoint
(``cache_creation_input_tokens``) and counts what follows as ``input_tokens``. Without it such a
reply reports 10 input tokens and no cache use.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

from flowkernel.testing.fake_conversation import (
    GENERATED,
    Compaction,
    Conversations,
    Structured,
    compaction_due,
    compaction_json,
    context_tokens,
    frame_tokens,
    measure,
    output_schema,
    structured_problem,
    usage_entry,
)
from flowkernel.testing.fake_conversation import instance_of as schema_instance
from flowkernel.testing.fake_wire import (
    Block,
    Held,
    JSONObject,
    Reply,
    Response,
    StreamReply,
    Text,
    Thinking,
    complaint,
    message_json,
)

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


def prompt_tokens(body: JSONObject) -> int:
    """The prompt's size in tokens, as ``count_tokens`` answers it."""
    return sum(_tokens(item) for item, _ in _prompt_items(body))


def as_served(response: Response, body: JSONObject, index: int, served: Conversations) -> Response:
    """The scripted response as the API would serve it to ``body`` (``fake_conversation``): structured
    answers made, thinking omitted when asked, a compaction when due; its signed blocks remembered."""
    if isinstance(response, Held):
        return replace(response, response=as_served(response.response, body, index, served))
    if isinstance(response, StreamReply):
        inner = as_served(response.reply, body, index, served)
        return replace(response, reply=inner) if isinstance(inner, Reply) else inner
    if not isinstance(response, Reply):
        return response
    content: list[Block] = []
    schema = output_schema(body)
    for block in response.content:
        if isinstance(block, Structured):
            if schema is None:
                return complaint(f"fake: request {index} has no output_config.format for the scripted Structured "
                                  "answer")
            value = schema_instance(schema) if block.value is GENERATED else block.value
            if (problem := structured_problem(value, schema)) is not None:
                return complaint(f"fake: the scripted Structured value does not match request {index}'s "
                                  f"output_config.format schema ({problem}); script a Text to answer off it")
            block = Text(json.dumps(value), deltas=block.deltas)
        thinking = body.get("thinking")
        if isinstance(block, Thinking) and isinstance(thinking, dict) and thinking.get("display") == "omitted":
            block = Thinking("", signature=block.signature, deltas=block.deltas)
        content.append(block)
    scripted = any(isinstance(b, Compaction) for b in content)
    if scripted or compaction_due(body):
        if "context_management" not in body:
            return complaint(f"fake: a compaction is scripted for request {index}, which has no context_management")
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
    served.remember(message_json(response, model=model, message_id="", request_index=index))
    return response


def needs_usage(response: Response) -> bool:
    if isinstance(response, Held):
        return needs_usage(response.response)
    reply = response.reply if isinstance(response, StreamReply) else response
    return isinstance(reply, Reply) and reply.input_tokens is None


def with_usage(response: Response, usage: Mapping[str, int]) -> Response:
    if isinstance(response, Held):
        return replace(response, response=with_usage(response.response, usage))
    if isinstance(response, StreamReply):
        return replace(response, reply=cast(Reply, with_usage(response.reply, usage)))
    if isinstance(response, Reply):
        return replace(response, input_tokens=usage["input_tokens"],
                       cache_creation_input_tokens=usage["cache_creation_input_tokens"],
                       cache_read_input_tokens=usage["cache_read_input_tokens"])
    return response
