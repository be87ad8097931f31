"""How a node run of a ``claude.agent`` picks up what the node runs it continues left behind.

A node run may be killed between any two of its writes: after ``agent:start`` and before the prompt
row, between a tool call and its row, between the user message of a turn boundary and the
``inbox:consumed`` that marks its inbox messages taken, after the final answer and before
``node:complete``. The node run that continues it (its *lineage*, ``flowkernel.history.lineage``) reads the
stored rows and finishes each of those steps exactly once:

- the *preamble* (system row, tool results closing a conversation a previous pass left mid-tool-call,
  the prompt) is what the first node run of a pass writes first; its rows are written in order, so
  the lineage's stored rows are a prefix of it until it is complete, and only the rest is written;
- a tool call of the last assistant message with no stored row was cut short: it runs again (``cut_short``)
  with the idempotency key it had; one a new pass finds (``closing``) is stored with status ``error``,
  saying it was interrupted (and ``agent:tool`` says so too), and the model is told the same;
- inbox messages the interrupted node run had already stored (as an ``ask_human`` answer, or in the
  user message of a turn boundary whose ``inbox:consumed`` was never committed) are not sent again;
- a final answer that was stored stands: the node completes with it (or asks for the correction an
  ``outputSchema`` needs), instead of calling the model again.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from flowkernel.agents.tools import ASK_HUMAN, INTERRUPTED_RESULT, result_text
from flowkernel.core.events import AgentTool
from flowkernel.core.node_context import NodeContext
from flowkernel.history.lineage import Lineage
from flowkernel.nodes.claude.transcript import Transcript


@dataclass(frozen=True, slots=True)
class Planned:
    """A row of the preamble: ``kind`` is ``system``, ``closing`` or ``opening``."""

    kind: str
    role: str
    content: Any
    step: int


def tool_uses(message: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The tool_use blocks of an assistant message."""
    if message is None or message.get("role") != "assistant" or not isinstance(message.get("content"), list):
        return []
    return [b for b in message["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]


class Pickup:
    """The stored rows of one session split into those of earlier passes and those of this lineage."""

    def __init__(self, ctx: NodeContext, transcript: Transcript, lineage: Lineage) -> None:
        self.ctx = ctx
        self.transcript = transcript
        self.lineage = lineage
        mine = set(lineage.runs)
        self.prior = [r for r in transcript.rows if r["runId"] not in mine]
        self.own = [r for r in transcript.rows if r["runId"] in mine]
        self.cut_short: list[dict[str, Any]] = []  # tool calls ``settle`` found without a row: to run again

    def preamble(self, system: str | None, opening: list[dict[str, Any]]) -> list[Planned]:
        """What the first node run of this pass writes before its first turn boundary."""
        prior_messages = [r for r in self.prior if r["role"] != "system"]
        steps = max((int(r["step"]) for r in self.prior if r["role"] == "assistant"), default=0)
        rows: list[Planned] = []
        if not prior_messages and system:
            rows.append(Planned("system", "system", system, 0))
        if tool_uses(prior_messages[-1] if prior_messages else None):
            rows.append(Planned("closing", "user", None, steps))  # its blocks are made when it is written
        rows += [Planned("opening", m["role"], m["content"], steps + 1) for m in opening]
        return rows

    def missing(self, preamble: list[Planned]) -> list[Planned]:
        """The part of the preamble the lineage has not stored yet (all of it for a new pass)."""
        return preamble[len(self.own):]

    def own_messages(self) -> list[dict[str, Any]]:
        return [r for r in self.own if r["role"] != "system"]

    def model_calls(self) -> list[dict[str, Any]]:
        """The model calls this pass made before this node run (``modelCall`` of its stored assistant
        messages: model, id, stop reason, usage), so its output counts the whole pass."""
        return [r.get("modelCall") or {} for r in self.own if r["role"] == "assistant"]

    def last_assistant(self) -> dict[str, Any] | None:
        rows: list[dict[str, Any]] = [r for r in self.transcript.rows if r["role"] == "assistant"]
        return rows[-1] if rows else None

    def corrections(self) -> int:
        """``outputSchema`` corrections this pass asked for so far (user rows right after an answer)."""
        own = self.own_messages()
        return sum(1 for a, b in pairwise(own)
                   if a["role"] == "assistant" and b["role"] == "user" and not tool_uses(a))

    def settle(self, uses: list[dict[str, Any]], resolved: dict[str, tuple[str, bool]], *,
               closing: bool = False) -> set[int]:
        """Results for ``uses`` (tool calls of the last assistant message) from their stored rows; a
        call with no row was cut short: it goes to ``cut_short`` (run again), or, ``closing``, is stored
        now as interrupted (``ask_human`` too: a new pass answers no earlier question). Returns the inbox messages (by seq) that answered
        ``ask_human`` calls already: stored as their rows, but not marked taken (that comes with the
        user message, which was not stored)."""
        self.transcript.load_tool_results({b["id"] for b in uses})
        answered = 0
        message = self.last_assistant()
        for b in uses:
            row = self.transcript.tool_results.get(b["id"])
            if row is not None:
                resolved[b["id"]] = (result_text(row.get("output")), row.get("status") == "error")
                if b.get("name") == ASK_HUMAN and row.get("status") != "error":
                    answered += 1
            elif closing:
                self.store_interrupted(b, message)
                resolved[b["id"]] = (INTERRUPTED_RESULT, True)
            elif b.get("name") != ASK_HUMAN:
                self.cut_short.append(b)
        answers = [m.seq for m in self.ctx.inbox() if m.kind != "resume"]
        return set(answers[:answered]) if not closing else set()

    def store_interrupted(self, use: dict[str, Any], message: dict[str, Any] | None) -> None:
        """A tool call that a crash or a pause cut short: stored (status ``error``) and told as such."""
        name = str(use.get("name"))
        step = int(message["step"]) if message is not None else self.transcript.steps
        self.transcript.add_tool_call({"messageId": message["id"] if message is not None else None,
                                       "toolName": name, "toolUseId": use["id"], "input": use.get("input"),
                                       "output": INTERRUPTED_RESULT, "status": "error", "durationMs": 0,
                                       "step": step})
        self.ctx.emit(AgentTool(toolName=name, toolUseId=str(use["id"]), toolInput=use.get("input"),
                                toolOutput=INTERRUPTED_RESULT, durationMs=0, error="interrupted: " + INTERRUPTED_RESULT))

    def stored_but_not_consumed(self, preamble_length: int) -> set[int]:
        """Inbox messages (by seq) the interrupted node run put in its last user message but never
        marked taken (killed between the two): the ones delivered before this node run's restart."""
        own = self.own_messages()
        if not own or own[-1]["role"] != "user" or len(self.own) <= preamble_length:
            return set()
        before = own[-2] if len(own) > 1 else None
        if before is not None and before["role"] == "assistant" and not tool_uses(before):
            return set()  # an outputSchema correction, not a turn boundary
        if int(own[-1]["step"]) in self.lineage.consumed_steps:
            return set()
        return {m.seq for m in self.ctx.inbox() if m.seq < self.lineage.restart_seq}

    def final_answer(self, preamble_length: int) -> dict[str, Any] | None:
        """The lineage's stored answer, when the conversation ends with it (no tool calls pending)."""
        own = self.own_messages()  # the session's last rows: earlier passes' come first
        if len(self.own) <= preamble_length or not own or own[-1]["role"] != "assistant" or tool_uses(own[-1]):
            return None
        if (own[-1].get("modelCall") or {}).get("stopReason") in ("pause_turn", "compaction"):
            return None  # not an answer: the turn goes on with the next call
        return own[-1]
