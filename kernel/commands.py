"""Commands (DESIGN §6): who may do what to a run, decided from its snapshot alone.

``judge_command`` is pure: it returns the ``command:received`` record (accepted or not, with the
reason) that the shell appends. A refused command changes nothing else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from flowkernel.compiler import CompiledFlow
from flowkernel.events import CommandReceived
from flowkernel.snapshot import RunSnapshot

KINDS = ("send", "reply", "resume", "pause", "abort", "retry")


@dataclass(frozen=True, slots=True)
class Command:
    kind: str
    target: str | None = None  # node run id, for send and reply
    content: Any = None  # the message (send, reply) or resume message
    reason: str | None = None  # for pause and abort

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "content": self.content, "reason": self.reason}

    @staticmethod
    def from_json(body: dict[str, Any]) -> Command:
        return Command(kind=str(body.get("kind")), target=body.get("target"), content=body.get("content"),
                       reason=body.get("reason"))


@dataclass(frozen=True, slots=True)
class CommandOutcome:
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


def _reject(cmd: Command, reason: str, *, invalid: bool = False) -> CommandOutcome:
    record = CommandReceived(command=cmd.kind, accepted=False, reason=reason, target=cmd.target, content=cmd.content,
                             refusal="invalid" if invalid else "conflict")
    return CommandOutcome(False, record, reason, invalid)


def _accept(cmd: Command, content: Any = None) -> CommandOutcome:
    return CommandOutcome(True, CommandReceived(command=cmd.kind, accepted=True, target=cmd.target,
                                                content=cmd.content if content is None else content))


def judge_command(flow: CompiledFlow, snap: RunSnapshot, cmd: Command, *, executing: bool) -> CommandOutcome:
    """Accept or refuse ``cmd`` for the run in ``snap``. ``executing``: a live executor holds the run."""
    if cmd.kind not in KINDS:
        return _reject(cmd, f"unknown command {cmd.kind!r}; use one of {', '.join(KINDS)}", invalid=True)
    status = snap.status
    if cmd.kind in ("send", "reply"):
        if not cmd.target:
            return _reject(cmd, f"{cmd.kind} needs the node runId it is for (--to NODE_RUN_ID); "
                                f"`flowkernel show {snap.runId}` lists the live node runs", invalid=True)
        if status in ("completed", "aborted"):
            return _reject(cmd, f"run {snap.runId} is {status}")
        live = live_node_runs(snap)
        node = live.get(cmd.target)
        if node is None:
            if cmd.target in snap.nodeRuns.values():
                return _reject(cmd, f"node run {cmd.target} of run {snap.runId} has finished")
            return _reject(cmd, f"{cmd.target} is not a live node run of run {snap.runId}", invalid=True)
        if cmd.kind == "reply":
            waiting = snap.waiting.get(node)
            if waiting is None or waiting.runId != cmd.target:
                return _reject(cmd, f"node run {cmd.target} ({node}) is not waiting for a reply; use send")
            content = cmd.content
            if waiting.schema is not None:
                import jsonschema

                content = _coerce(content, waiting.schema)
                try:
                    jsonschema.validate(content, waiting.schema)
                except jsonschema.ValidationError as exc:
                    where = "/".join(str(p) for p in exc.absolute_path) or "the reply"
                    return _reject(cmd, f"reply does not match the schema of {node}: {where}: {exc.message}",
                                   invalid=True)
            return _accept(cmd, content)
        return _accept(cmd)
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
        if status == "failed":
            return _reject(cmd, f"run {snap.runId} failed; use retry to re-run its failed nodes")
        if executing:
            return _reject(cmd, f"run {snap.runId} is already executing")
        return _accept(cmd)
    # retry
    if status != "failed":
        return _reject(cmd, f"run {snap.runId} is {status}; retry re-runs the failed nodes of a failed run")
    return _accept(cmd)


def _coerce(content: Any, schema: dict[str, Any]) -> Any:
    """A reply typed on the command line is text: read it as JSON unless the schema wants a string."""
    if isinstance(content, str) and schema.get("type") != "string":
        try:
            return json.loads(content)
        except json.JSONDecodeError:
            return content
    return content
