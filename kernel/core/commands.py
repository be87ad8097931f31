"""Commands (DESIGN §6): who may do what to a run, decided from its snapshot alone.

``judge_command`` is pure: it returns the ``command:received`` record (accepted or not, with the
reason) that the shell appends. A refused command changes nothing else, and its record keeps only a
bounded preview of what it carried and its size: a refusal must not cost what the message weighs,
and what was refused (text that is not UTF-8, say) may not even be storable.

``send`` and ``reply`` name their node run by id (``nr_…``) or by node id when exactly one node run
of that node can take the command; the accepted record names the node run. A ``send`` to a
``human.input`` node run is its reply: that node takes nothing else. A ``send`` to a node run whose
type does not read messages (``NodeType.takes_messages``: a ``transform``, a ``python`` function
without ``ctx``) is refused rather than left in an inbox nobody reads.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import msgspec
from flowkernel.core.budgets import resume_problem
from flowkernel.core.compiler import CompiledFlow
from flowkernel.core.events import CommandReceived
from flowkernel.core.nesting import MAX_DEPTH, clipped
from flowkernel.core.nonfinite import describe, loads_strict
from flowkernel.core.snapshot import RunSnapshot, undelivered_answer
from flowkernel.errors import PatternTimeoutError

KINDS = ("send", "reply", "resume", "pause", "abort", "retry")
PREVIEW_CHARS = 200  # of a refused command's content, in its record
_JSON_SCALARS = (str, int, float, bool, type(None))
_SURROGATE = re.compile("[\ud800-\udfff]")


class Command(msgspec.Struct, frozen=True):
    kind: str
    target: str | None = None  # node run id, for send and reply
    content: Any = None  # the message (send, reply) or resume message
    reason: str | None = None  # for pause and abort
    budget: Any = None  # for resume: the new limit in USD (``resume --budget``), checked by the judge

    def to_json(self) -> dict[str, Any]:
        out = {"kind": self.kind, "target": self.target, "content": self.content, "reason": self.reason}
        if self.budget is not None:
            out["budget"] = self.budget
        return out

    @staticmethod
    def from_json(body: Any) -> Command:
        """The command stored in a queue row; whatever the row holds, a Command the judge can refuse."""
        if not isinstance(body, dict):
            return Command(kind=f"<not a command: {type(body).__name__}>")
        return Command(kind=str(body.get("kind")), target=body.get("target"), content=body.get("content"),
                       reason=body.get("reason"), budget=body.get("budget"))


class CommandOutcome(msgspec.Struct, frozen=True):
    accepted: bool
    record: CommandReceived
    reason: str | None = None
    invalid: bool = False  # refused because the command itself is wrong, not because of the run's state


def live_node_runs(snap: RunSnapshot) -> dict[str, str]:
    """Node run id -> node id, for node runs that can take a message now."""
    live: dict[str, str] = {}
    for n, st in snap.nodeStatus.items():
        if st in ("running", "waiting") and n in snap.nodeRuns and n not in snap.forEach:
            live[snap.nodeRuns[n]] = n
        fe = snap.forEach.get(n)
        if fe is not None:
            for run_id in fe.running.values():
                live[run_id] = n
    for n, w in snap.waiting.items():
        live[w.runId] = n
    return live


def _storable(text: str) -> str:
    """``text`` with what cannot be stored as UTF-8 (lone surrogates, as undecodable bytes become) as U+FFFD."""
    if _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub("\ufffd", text)


def _size(value: Any) -> int:
    """Bytes of ``value`` as it would be stored (UTF-8 text, or JSON)."""
    if isinstance(value, str):
        try:
            return len(value.encode("utf-8", "surrogateescape"))  # undecodable bytes count as the bytes they were
        except UnicodeEncodeError:
            return len(value.encode("utf-8", "replace"))
    try:
        return len(json.dumps(value, ensure_ascii=False).encode("utf-8", "replace"))
    except RecursionError:  # nested too deeply to encode: the size of what can be shown of it
        return _size(clipped(value))
    except (TypeError, ValueError):
        return len(repr(value).encode("utf-8", "replace"))


def _preview(value: Any) -> str:
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except RecursionError:
            text = json.dumps(clipped(value), ensure_ascii=False, default=repr)
        except (TypeError, ValueError):
            text = repr(value)
    text = text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
    return _storable(text)


def _reject(cmd: Command, reason: str, *, invalid: bool = False) -> CommandOutcome:
    target = cmd.target if isinstance(cmd.target, str) or cmd.target is None else repr(cmd.target)
    preview = size = None
    if cmd.content is not None:
        preview, size = _preview(cmd.content), _size(cmd.content)
    record = CommandReceived(command=_storable(cmd.kind), accepted=False, reason=_storable(reason),
                             target=None if target is None else _storable(target)[:PREVIEW_CHARS],
                             contentPreview=preview, contentBytes=size, refusal="invalid" if invalid else "conflict")
    return CommandOutcome(False, record, record.reason, invalid)


def refusal(cmd: Command, reason: str, *, invalid: bool = False) -> CommandOutcome:
    """The outcome of refusing ``cmd`` for ``reason``: its record holds a preview of the content, not the content."""
    return _reject(cmd, reason, invalid=invalid)


def _accept(cmd: Command, content: Any = None, target: str | None = None) -> CommandOutcome:
    return CommandOutcome(True, CommandReceived(command=cmd.kind, accepted=True, target=target or cmd.target,
                                                content=cmd.content if content is None else content))


def not_storable(value: Any, what: str) -> str | None:
    """Why ``value`` cannot travel in a command (text that is not UTF-8, something that is not JSON, nesting
    deeper than ``flowkernel.core.nesting.MAX_DEPTH``), or None."""
    found = unstorable_at(value, what)
    return None if found is None else f"{found[0]} {found[1]}"


def unstorable_at(value: Any, what: str) -> tuple[str, str] | None:
    """``(JSON path, what is wrong there)`` for the first part of ``value`` that cannot be stored, or None."""
    stack: list[tuple[Any, str, int]] = [(value, what, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            bad = _SURROGATE.search(item)
            if bad is not None:
                i, c = bad.start(), ord(bad.group())
                # Undecodable bytes arrive as U+DC80..U+DCFF (surrogateescape): name the byte.
                byte = f"byte 0x{c - 0xDC00:02x}" if 0xDC80 <= c <= 0xDCFF else f"lone surrogate U+{c:04X}"
                return where, f"is not valid UTF-8 text ({byte} at character {i}); send UTF-8 text"
        elif isinstance(item, dict | list | tuple) and depth >= MAX_DEPTH:
            return where, f"is nested more than {MAX_DEPTH} levels deep (lists and objects); flowkernel takes at " \
                          f"most {MAX_DEPTH}"
        elif isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    return where, f"is not JSON (an object key {k!r} is not a string)"
                stack.append((k, f"{where} (a key)", depth + 1))
                stack.append((v, f"{where}.{k}" if k.isidentifier() else f"{where}[{k!r}]", depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            return where, f"is {describe(item)}, which JSON cannot hold (it would be stored as null)"
        elif not isinstance(item, _JSON_SCALARS):
            return where, f"is not JSON (a {type(item).__name__})"
    return None


def _resolve_target(snap: RunSnapshot, flow: CompiledFlow, cmd: Command) -> tuple[str, str] | tuple[str, bool]:
    """``(node run id, node id)`` the command is for, or ``(why there is none, whether the command is
    wrong rather than the run's state)``. ``cmd.target`` names a node run, or a node that has exactly
    one node run that can take ``cmd``."""
    target = str(cmd.target)
    live = live_node_runs(snap)
    node = live.get(target)
    if node is not None:
        return target, node
    if target in snap.nodeRuns.values():
        return f"node run {target} of run {snap.runId} has finished", False
    if target not in flow.nodes:
        return f"{target} is not a live node run of run {snap.runId}, nor one of its nodes", True
    if cmd.kind == "reply" or flow.nodes[target].type == "human.input":
        w = snap.waiting.get(target)
        candidates = [w.runId] if w is not None else []
        able = "waiting for a reply"
    else:
        candidates = [r for r, n in live.items() if n == target]
        able = "live"
    if not candidates:
        return f"node {target} of run {snap.runId} has no node run {able}", False
    if len(candidates) > 1:
        return (f"node {target} of run {snap.runId} has {len(candidates)} node runs {able} "
                f"({', '.join(sorted(candidates))}); name one with --to NODE_RUN_ID"), True
    return candidates[0], target


def _budget_problem(cmd: Command) -> str | None:
    budget = cmd.budget
    if budget is None:
        return None
    if cmd.kind != "resume":
        return f"--budget goes with resume, not {cmd.kind}"
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not math.isfinite(budget) or budget <= 0:
        return f"--budget must be a positive number of US dollars, not {_preview(budget)}"
    return None


def judge_command(flow: CompiledFlow, snap: RunSnapshot, cmd: Command, *, executing: bool,
                  below: float = 0.0, takes_messages: Callable[[str], bool] | None = None) -> CommandOutcome:
    """Accept or refuse ``cmd`` for the run in ``snap``. ``executing``: a live executor holds the run.
    ``below``: what the run's child runs cost (a resume must leave the run under its budget).
    ``takes_messages(node_id)``: whether that node's type reads ``send`` messages (None: every node)."""
    if cmd.kind not in KINDS:
        return _reject(cmd, f"unknown command {_storable(cmd.kind)!r}; use one of {', '.join(KINDS)}", invalid=True)
    problem = _budget_problem(cmd)
    if problem is not None:
        return _reject(cmd, problem, invalid=True)
    for value, what in ((cmd.content, "the message" if cmd.kind != "reply" else "the reply"),
                        (cmd.target, "--to"), (cmd.reason, "the reason")):
        problem = not_storable(value, what)
        if problem is not None:
            return _reject(cmd, problem, invalid=True)
    if cmd.target is not None and not isinstance(cmd.target, str):
        return _reject(cmd, "--to must be a node run id (nr_…) or a node id", invalid=True)
    status = snap.status
    if cmd.kind in ("send", "reply"):
        if not cmd.target:
            return _reject(cmd, f"{cmd.kind} needs the node runId it is for (--to NODE_RUN_ID, or --to NODE_ID "
                                f"when one node run of that node can take it); `flowkernel show {snap.runId}` "
                                "lists the live node runs", invalid=True)
        if status in ("completed", "aborted"):
            return _reject(cmd, f"run {snap.runId} is {status}")
        found = _resolve_target(snap, flow, cmd)
        if isinstance(found[1], bool):
            return _reject(cmd, found[0], invalid=found[1])
        target, node = found
        as_reply = cmd.kind == "reply" or flow.nodes[node].type == "human.input"
        if as_reply:
            waiting = snap.waiting.get(node)
            if waiting is None or waiting.runId != target:
                if cmd.kind == "send":
                    return _reject(cmd, f"node run {target} ({node}) is a human.input that is not waiting yet; "
                                        "send its answer once it waits")
                return _reject(cmd, f"node run {target} ({node}) is not waiting for a reply; use send")
            pending = undelivered_answer(snap, node)
            if pending is not None:  # a node run takes one answer: a second would reach it as a second turn
                if executing:
                    return _reject(cmd, f"node run {target} ({node}) already has a reply on its way (accepted at "
                                        f"event {pending.seq}); it takes one answer")
                return _reject(cmd, f"node run {target} ({node}) already holds a reply, accepted at event "
                                    f"{pending.seq} and not delivered (the process that took it stopped first); "
                                    f"`flowkernel resume {snap.runId}` delivers it")
            content = cmd.content
            if waiting.schema is not None:
                from flowkernel.core.jsonschemas import instance_errors

                try:
                    content = _coerce(content, waiting.schema)
                except RecursionError:
                    return _reject(cmd, f"the reply is nested more than {MAX_DEPTH} levels deep (lists and "
                                        f"objects); flowkernel takes at most {MAX_DEPTH}", invalid=True)
                problem = not_storable(content, "the reply")
                if problem is not None:
                    return _reject(cmd, problem, invalid=True)
                try:
                    errors = instance_errors(waiting.schema, content, schema_at=f"{node}.input.schema")
                except PatternTimeoutError as exc:
                    errors = [(exc.where, str(exc))]
                if errors:
                    where, message = errors[0]
                    return _reject(cmd, f"{cmd.kind} does not match the schema of {node}: "
                                        f"{where.lstrip('.') or 'the reply'}: {message}", invalid=True)
            return _accept(cmd, content, target)
        if takes_messages is not None and not takes_messages(node):
            return _reject(cmd, f"node run {target} ({node}) is a `{flow.nodes[node].type}` node, which does not "
                                "take messages (claude.agent and human.input nodes do, and python nodes whose function "
                                "takes `ctx`)")
        return _accept(cmd, target=target)
    if cmd.kind == "pause":
        if status != "running":
            return _reject(cmd, f"run {snap.runId} is {status}; only a running run can pause")
        return _accept(cmd)
    if cmd.kind == "abort":
        if status in ("completed", "aborted"):
            return _reject(cmd, f"run {snap.runId} is already {status}")
        return _accept(cmd)
    if cmd.kind == "resume":
        if status in ("completed", "aborted"):
            return _reject(cmd, f"run {snap.runId} is {status}; there is nothing to resume")
        if executing:
            return _reject(cmd, f"run {snap.runId} is already executing")
        over = resume_problem(flow, snap, cmd.budget, below=below)
        if over is not None:
            return _reject(cmd, over)
        return _accept(cmd)
    # retry
    if status != "failed":
        return _reject(cmd, f"run {snap.runId} is {status}; retry re-runs the failed nodes of a failed run")
    # As for resume (which on a failed run re-runs the failed nodes too): a run that has spent its budget
    # would pause again at its first model call, paid for; `resume --budget` raises the limit instead.
    over = resume_problem(flow, snap, None, below=below)
    if over is not None:
        return _reject(cmd, over)
    return _accept(cmd)


def retry_restarts_a_failure(flow: CompiledFlow, snap: RunSnapshot) -> bool:
    """Whether ``retry`` of the failed run in ``snap`` starts again something that may succeed now: a
    failed node (without ``continueOnError``) or forEach item. A binding that failed evaluates the same
    again, and a run that failed on an edge's ``when`` or ``forEach.in`` (or with no node able to start)
    has nothing to re-run: only a fixed flow (``retry --flow``) continues those."""
    for n, st in snap.nodeStatus.items():
        fault = snap.faults.get(n)
        node = flow.nodes.get(n)
        if st == "failed" and (node is None or not node.policy.continueOnError) \
                and (fault is None or fault.errorType != "binding_error"):
            return True
    return any(r is not None and r.error is not msgspec.UNSET for fe in snap.forEach.values() for r in fe.results)


def _coerce(content: Any, schema: dict[str, Any]) -> Any:
    """A reply typed on the command line is text: read it as JSON unless the schema wants a string.
    Raises ``RecursionError`` for JSON nested too deeply to read."""
    if isinstance(content, str) and schema.get("type") != "string":
        try:
            return loads_strict(content)
        except ValueError:  # not JSON, or NaN or Infinity: the text as typed, which the schema judges
            return content
    return content
