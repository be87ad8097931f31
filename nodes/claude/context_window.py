"""What of a stored conversation the next request carries (DESIGN §7).

The stored rows keep every message ever exchanged; the model is sent what the API wants of them:

- **After a compaction** the API summarized the conversation into a ``compaction`` block (at the
  start of the assistant message that answered the request), and drops every block before that
  block from later requests. The request therefore starts at the last compaction block that has a
  summary, sent back exactly as it came, and carries what follows it; what precedes it is left out
  here rather than sent to be dropped (the request stays the size of the context; the block is the
  first of the conversation, where the API looks for it; one summary per request, as it requires).
  A compaction block without a summary (a failed compaction, which the API treats as a no-op) is
  sent back where it is.
- **Thinking made by another model** (the node's model changed across a resume or a flow update) is
  left out: a thinking block's signature binds it to the model that wrote it, and the other model
  refuses it. Its text stays in the stored history. An assistant message left with no block is left
  out with it.

The rule depends only on the stored rows and the model, so a node run that resumes after a crash,
a pause or a flow update rebuilds exactly the context the model saw.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})
_DATED = re.compile(r"-\d{8}$")


@dataclass(frozen=True, slots=True)
class Window:
    messages: list[dict[str, Any]]  # the request's ``messages``
    summarized: int  # stored messages left out: the compaction block stands for them
    dropped_thinking: int  # thinking blocks left out: another model made them


def same_model(a: str, b: str) -> bool:
    """``a`` and ``b`` name one model (a dated id and its alias are the same model)."""
    return _DATED.sub("", a) == _DATED.sub("", b)


def made_by(row: Mapping[str, Any]) -> str | None:
    """The model an assistant row's call asked for (None for a message no call made: an opening one)."""
    call = row.get("modelCall") or {}
    model = call.get("requestModel") or call.get("model")
    return model if isinstance(model, str) and model else None


def compaction_at(content: Any) -> int | None:
    """Where ``content`` holds a compaction block with a summary, or None."""
    if not isinstance(content, list):
        return None
    for i in range(len(content) - 1, -1, -1):
        block = content[i]
        if isinstance(block, dict) and block.get("type") == "compaction" and block.get("content"):
            return i
    return None


def window(rows: Iterable[Mapping[str, Any]], model: str) -> Window:
    """The messages of ``rows`` (stored rows, system ones skipped) the next request to ``model`` carries."""
    stored = [r for r in rows if r.get("role") != "system"]
    start, block = 0, None
    for i in range(len(stored) - 1, -1, -1):
        if stored[i].get("role") == "assistant" and (block := compaction_at(stored[i].get("content"))) is not None:
            start = i
            break
    messages: list[dict[str, Any]] = []
    dropped = 0
    for i, row in enumerate(stored[start:], start):
        content: Any = row.get("content")
        if i == start and block is not None:
            content = content[block:]
        if row.get("role") == "assistant" and isinstance(content, list):
            maker = made_by(row)
            if maker is not None and not same_model(maker, model):
                kept = [b for b in content if not (isinstance(b, dict) and b.get("type") in THINKING_TYPES)]
                dropped += len(content) - len(kept)
                if not kept:
                    continue
                content = kept
        messages.append({"role": row.get("role"), "content": content})
    return Window(messages, start, dropped)
