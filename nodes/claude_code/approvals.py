"""Durable approvals of a ``claude.code`` session's tool calls (DESIGN §7b).

The SDK asks ``can_use_tool`` about each tool the session may not use on its own (those named in
``ask``, and any its permission check would ask about). Without an answer at hand the node denies the
call with ``interrupt`` (the session's turn ends, its transcript stored), and the node run waits with
a ``tool-permission`` prompt: nothing lives in memory while a human decides, so a crash loses nothing.
The reply (``{"allow": true}`` or ``{"allow": false, "reason": …}``) continues the session with the
decision as its next user message; the model asks for the call again, and the same tool with the same
input gets the human's answer.
"""

from __future__ import annotations

import json
from typing import Any

PROMPT_KIND = "tool-permission"
# A reply to a tool-permission prompt (the command line's text is read as JSON against it).
REPLY_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["allow"], "additionalProperties": False,
    "properties": {"allow": {"type": "boolean"}, "reason": {"type": "string"}},
}
WAITING = "This call waits for a human's approval; the session stops here until the answer comes."


def _key(tool_name: str, tool_input: Any) -> str:
    return json.dumps([tool_name, tool_input], sort_keys=True, ensure_ascii=False)


class Approvals:
    """The answers this node run holds, and the request it stopped to ask about (``waiting``)."""

    def __init__(self) -> None:
        self.answers: dict[str, dict[str, Any]] = {}
        self.waiting: dict[str, Any] | None = None

    def answered(self, prompt: Any, reply: Any) -> str | None:
        """Take a human's ``reply`` to ``prompt`` (the waiting node run's); returns the session's next
        user message saying the decision, or None when ``prompt`` asked for no tool permission."""
        if not isinstance(prompt, dict) or prompt.get("kind") != PROMPT_KIND or not isinstance(reply, dict):
            return None
        tool = str(prompt.get("toolName"))
        self.answers[_key(tool, prompt.get("toolInput"))] = reply
        if reply.get("allow"):
            return f"Your {tool} call was approved: make it again, with the same input."
        reason = str(reply.get("reason") or "no reason given")
        return f"Your {tool} call was not approved: {reason}"

    async def decide(self, tool_name: str, tool_input: dict[str, Any], tool_use_id: str) -> dict[str, Any]:
        """The ``can_use_tool`` answer: the human's, when one is held for this call; else stop to ask."""
        answer = self.answers.pop(_key(tool_name, tool_input), None)
        if answer is not None:
            return {"allow": bool(answer.get("allow")), "reason": answer.get("reason")}
        if self.waiting is None:
            self.waiting = {"kind": PROMPT_KIND, "toolName": tool_name, "toolInput": tool_input,
                            "toolUseId": tool_use_id}
        return {"allow": False, "reason": WAITING, "interrupt": True}
