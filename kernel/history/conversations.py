"""Reading agent conversations back (DESIGN §7): pages of messages and tool calls, and a text rendering.

Pagination is by cursor: a page's ``nextCursor`` is the id of its last row, passed back as ``after``;
``None`` means there is nothing more. Filters combine (AND).
"""

from __future__ import annotations

import json
from typing import Any, TypedDict

from flowkernel.errors import InvalidInputError
from flowkernel.store.base import Store

MAX_LIMIT = 1000


class Page(TypedDict):
    items: list[dict[str, Any]]
    nextCursor: int | None


def _check(limit: int, run_id: str | None, flow_run_id: str | None, session_id: str | None) -> None:
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidInputError(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")
    if run_id is None and flow_run_id is None and session_id is None:
        raise InvalidInputError("say whose conversation: a node run id (nr_…), a run id (run_…) or a session id")


def _page(rows: list[dict[str, Any]], limit: int) -> Page:
    more = len(rows) > limit
    items = rows[:limit]
    return Page(items=items, nextCursor=int(items[-1]["id"]) if more and items else None)


def list_messages(store: Store, *, run_id: str | None = None, flow_run_id: str | None = None,
                  session_id: str | None = None, after: int = 0, limit: int = 100, node_id: str | None = None) -> Page:
    """Messages of a node run (``run_id``), a whole run (``flow_run_id``) or a session, oldest first;
    ``node_id`` keeps those of one node."""
    _check(limit, run_id, flow_run_id, session_id)
    rows = store.list_agent_messages(run_id=run_id, flow_run_id=flow_run_id, session_id=session_id,
                                     after=after, limit=limit + 1, node_id=node_id)
    return _page(rows, limit)


def list_tool_calls(store: Store, *, run_id: str | None = None, flow_run_id: str | None = None,
                    session_id: str | None = None, tool_name: str | None = None, status: str | None = None,
                    after: int = 0, limit: int = 100, node_id: str | None = None) -> Page:
    """Tool calls, oldest first; ``status`` is ``completed`` or ``error``."""
    _check(limit, run_id, flow_run_id, session_id)
    if status is not None and status not in ("completed", "error"):
        raise InvalidInputError(f"status must be `completed` or `error`, not {status!r}")
    rows = store.list_tool_calls(run_id=run_id, flow_run_id=flow_run_id, session_id=session_id,
                                 tool_name=tool_name, status=status, after=after, limit=limit + 1, node_id=node_id)
    return _page(rows, limit)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _block_lines(block: Any, width: int) -> list[str]:
    if not isinstance(block, dict):
        return [_clip(str(block), width)]
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", "")).splitlines() or [""]
    if kind == "thinking":
        return [_clip(f"(thinking) {block.get('thinking', '')}", width)] if block.get("thinking") \
            else ["(thinking, omitted)"]
    if kind == "compaction":  # the API's summary of everything before it: later requests start here
        return [_clip(f"(context compacted) {block.get('content') or '(no summary: the compaction failed)'}", width)]
    if kind == "redacted_thinking":
        return ["(thinking, redacted)"]
    if kind == "tool_use":
        return [_clip(f"→ {block.get('name')}({json.dumps(block.get('input'), ensure_ascii=False)}) "
                      f"[{block.get('id')}]", width)]
    if kind == "tool_result":
        content = block.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        mark = " ERROR" if block.get("is_error") else ""
        return [_clip(f"← [{block.get('tool_use_id')}]{mark} {text}", width)]
    return [_clip(json.dumps(block, ensure_ascii=False), width)]


def render_conversation(store: Store, *, run_id: str | None = None, flow_run_id: str | None = None,
                        session_id: str | None = None, width: int = 100) -> str:
    """The conversation as text for ``flowkernel show``: one header per message, blocks indented.

    Long tool inputs, results and thinking are cut to ``width`` characters; text is shown whole.
    """
    lines: list[str] = []
    after = 0
    while True:
        page = list_messages(store, run_id=run_id, flow_run_id=flow_run_id, session_id=session_id,
                             after=after, limit=MAX_LIMIT)
        for row in page["items"]:
            where = f"{row['nodeId']} {row['runId']}" if run_id is None else ""
            lines.append(f"[step {row['step']}] {row['role']} {where}".rstrip())
            content = row["content"]
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            for block in blocks if isinstance(blocks, list) else [blocks]:
                lines.extend(f"    {line}" for line in _block_lines(block, width))
        if page["nextCursor"] is None:
            break
        after = page["nextCursor"]
    return "\n".join(lines) if lines else "(no agent messages)"
