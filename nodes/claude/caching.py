"""Prompt caching: where a request marks its stable prefix with ``cache_control``.

The API caches the prompt (tools, then system, then messages) up to each marked block, and a later
request that starts with the same prefix reads it at a tenth of the input price or less. A Claude
node's prefix only grows: its tools and system prompt never change within a node run, and each turn
of a tool loop appends to the conversation. So a request marks, within the API's limit of four:

1. the last tool definition and 2. the system prompt: the part every turn shares;
3. the last block of the conversation: this turn writes the whole prompt to the cache;
4. the last block of the user message before it: where the previous turn's breakpoint was, so this
   turn reads that prefix even when the turn in between added more than the 20 blocks the API looks
   back from a breakpoint (many parallel tool calls).

Markers go on copies: the stored conversation never holds them. Thinking blocks and empty text
blocks cannot carry one, so the last block that can is marked.
"""

from __future__ import annotations

from typing import Any

EPHEMERAL: dict[str, str] = {"type": "ephemeral"}
MAX_BREAKPOINTS = 4
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})


def _markable(block: Any) -> bool:
    if not isinstance(block, dict) or block.get("type") in _UNMARKABLE:
        return False
    return block.get("type") != "text" or bool(block.get("text"))


def _marked_content(content: Any) -> Any | None:
    """``content`` with its last markable block marked, or None if no block can be."""
    if isinstance(content, str):
        return [{"type": "text", "text": content, "cache_control": EPHEMERAL}] if content else None
    if not isinstance(content, list):
        return None
    for i in range(len(content) - 1, -1, -1):
        if _markable(content[i]):
            return [*content[:i], {**content[i], "cache_control": EPHEMERAL}, *content[i + 1:]]
    return None


def mark_cache_breakpoints(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` with ``cache_control`` on its stable prefix (see the module docstring)."""
    out = dict(request)
    used = 0
    tools = out.get("tools")
    if tools:
        out["tools"] = [*tools[:-1], {**tools[-1], "cache_control": EPHEMERAL}]
        used += 1
    system = out.get("system")
    if isinstance(system, str) and system:
        out["system"] = [{"type": "text", "text": system, "cache_control": EPHEMERAL}]
        used += 1
    messages = list(out.get("messages") or [])
    candidates = [len(messages) - 1]
    candidates += [i for i in range(len(messages) - 2, -1, -1) if messages[i].get("role") == "user"][:1]
    for i in candidates:
        if i < 0 or used >= MAX_BREAKPOINTS:
            continue
        marked = _marked_content(messages[i].get("content"))
        if marked is not None:
            messages[i] = {**messages[i], "content": marked}
            used += 1
    out["messages"] = messages
    return out
