"""A Claude node's conversation as stored rows (DESIGN §7): written as it happens, rebuilt on resume.

Writes are observability: a failed write is reported (``agent:error`` with ``store_error`` and a
line on stderr) and the agent goes on. The snapshot, written by the kernel, is what must not fail.
A write refused because the execution lost the run's lease (``LeaseLostError``: another executor has
the run and will rebuild this conversation) is no failure to report: the node run stops, quietly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from flowkernel.core.events import AgentError
from flowkernel.core.node_context import NodeContext
from flowkernel.errors import LeaseLostError
from flowkernel.ids import now_ms
from flowkernel.redaction import redacted

log = logging.getLogger("flowkernel.nodes")

PAGE = 500


def _pages(fetch: Callable[[int], list[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    after = 0
    while True:
        rows = fetch(after)
        yield from rows
        if len(rows) < PAGE:
            return
        after = int(rows[-1]["id"])


class Transcript:
    """The stored rows of one session, and the messages they make."""

    def __init__(self, ctx: NodeContext, session_id: str) -> None:
        self.ctx = ctx
        self.session_id = session_id
        self.messages: list[dict[str, Any]] = []  # what the next request's `messages` starts with
        # Every stored row, system ones included: {"id", "runId", "role", "content", "step", "modelCall"}.
        self.rows: list[dict[str, Any]] = []
        self.steps = 0  # model calls in this session so far, across node runs
        self.tool_results: dict[str, dict[str, Any]] = {}  # toolUseId -> stored tool-call row

    def load(self) -> None:
        """Rebuild the conversation exactly from the stored rows."""
        store = self.ctx.store
        for row in _pages(lambda after: store.list_agent_messages(session_id=self.session_id, after=after,
                                                                  limit=PAGE)):
            self.rows.append({k: row.get(k) for k in ("id", "runId", "role", "content", "step", "modelCall")})
            if row["role"] == "system":
                continue  # the system prompt travels in the request's `system`, not in `messages`
            self.messages.append({"role": row["role"], "content": row["content"]})
            if row["role"] == "assistant":
                self.steps = max(self.steps, int(row["step"]))

    def load_tool_results(self, ids: set[str]) -> None:
        """Tool calls of the last assistant message that finished before an interruption."""
        store = self.ctx.store
        for row in _pages(lambda after: store.list_tool_calls(session_id=self.session_id, after=after,
                                                              limit=PAGE)):
            if row["toolUseId"] in ids:
                self.tool_results[row["toolUseId"]] = row

    def pending_tool_uses(self) -> list[dict[str, Any]]:
        """The tool_use blocks of a trailing assistant message that have no tool_result yet."""
        if not self.messages or self.messages[-1]["role"] != "assistant":
            return []
        content = self.messages[-1]["content"]
        if not isinstance(content, list):
            return []
        return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]

    def add(self, role: str, content: Any, step: int, model_call: dict[str, Any] | None = None) -> int | None:
        """Append a message to the conversation and store it; the row id, or None if storing failed.
        An assistant message keeps ``model_call``: the model, id, stop reason and usage of its call."""
        if role != "system":
            self.messages.append({"role": role, "content": content})
        row_id = self.write("message", self.ctx.store.add_agent_message, {"role": role, "content": content,
                                                                            "step": step, "modelCall": model_call})
        self.rows.append({"id": row_id, "runId": self.ctx.run_id, "role": role, "content": content, "step": step,
                          "modelCall": model_call})
        return row_id

    def add_tool_call(self, row: dict[str, Any]) -> int | None:
        return self.write("tool call", self.ctx.store.add_tool_call, row)

    def write(self, what: str, fn: Callable[[dict[str, Any]], int], fields: dict[str, Any]) -> int | None:
        row = {"flowRunId": self.ctx.flow_run_id, "runId": self.ctx.run_id, "nodeId": self.ctx.node_id,
               "sessionId": self.session_id, "createdAt": now_ms(), **redacted(fields)}
        try:
            return fn(row)
        except LeaseLostError:
            raise
        except Exception as exc:
            message = f"could not store the agent's {what} (session {self.session_id}): {exc}"
            log.warning("node %s (%s): %s", self.ctx.node_id, self.ctx.run_id, message)
            self.ctx.emit(AgentError(errorType="store_error", message=message,
                                     details={"what": what, "step": fields.get("step")}))
            return None
