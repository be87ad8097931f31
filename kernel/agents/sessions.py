"""The seam of Claude Code sessions (DESIGN §7b), as ``query.py`` is the seam of model calls.

A ``claude.code`` node run opens one session through a ``SessionQuery`` and reads its messages, each
the JSON form of a Claude Agent SDK message (``{"type": "system" | "assistant" | "user" |
"stream_event" | "result", …}``, the SDK dataclass's fields, content blocks as Messages API blocks).
Two implementations:

- ``flowkernel.agents.claude_sdk.SdkSessionQuery`` (the default): the real SDK (``ClaudeSDKClient``)
  and the CLI its wheel bundles, hermetic, under a supervisor that takes the CLI's whole process tree
  down with it;
- ``flowkernel.fixtures.sessions.FixtureSessionQuery``: replays recorded message streams
  without starting the CLI (``{"calls": [{"input": <prompt and options>, "messages": [...]}]}``).

The node type chooses (``flowkernel.nodes.claude_code.node.session_query_for``); an embedding program
or a test gives its own as ``services.extra["session_query"]``.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

SERVICE = "session_query"  # the key of ``RunServices.extra`` that overrides the choice
WORKSPACES = "flowkernel-workspaces"


def run_workspace(flow_run_id: str) -> Path:
    """The run's own workspace folder (the same path on every worker of a machine): where a
    ``claude.code`` node without ``cwd`` works, and where a node may put a folder for one to work in."""
    return Path(tempfile.gettempdir()) / WORKSPACES / flow_run_id

# (tool name, tool input, tool use id) -> {"allow": bool, "reason"?: str, "interrupt"?: bool}: whether the
# session may make the call; ``interrupt`` ends the session's turn (the node waits for a human)
Permission = Callable[[str, dict[str, Any], str], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """What one process of a session is started with: the user message it sends first (the node's
    prompt, or the resume message), and the options as JSON (``sessionId`` to start a session with
    that id, or ``resume`` to continue one; ``cwd``, ``model``, ``allowedTools``, …, as the node's
    input names them)."""

    prompt: str
    options: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "options": self.options}


class LiveSession(Protocol):
    """An open session: its messages, until its result; user messages sent into it meanwhile."""

    def messages(self) -> AsyncIterator[dict[str, Any]]: ...

    async def send(self, text: str) -> None:
        """A user message the session takes at its next turn boundary."""
        ...

    async def interrupt(self) -> None:
        """Stop the turn in flight (its tools' processes included)."""
        ...


class SessionQuery(Protocol):
    """Opens sessions. ``store``: the SDK ``SessionStore`` its transcript is mirrored into (and resumed
    from); ``permission``: asked about each tool the session may not use without asking. Leaving the
    context stops the session's process and every process it started. ``call``: how many processes
    of this node's session ran before in the run (a fixture's call index)."""

    def open(self, request: SessionRequest, *, node_id: str, store: Any, permission: Permission | None,
             call: int = 0) -> AbstractAsyncContextManager[LiveSession]: ...
