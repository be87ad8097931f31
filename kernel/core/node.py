"""The seam between the kernel and node types: the ``NodeType`` protocol and what a node returns.

A node type's ``run`` gets a ``flowkernel.core.node_context.NodeContext``; this module needs nothing of the
run shell, the compiler or the registry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from flowkernel.core.jsonschemas import BINDING_SCHEMA, check_schema
from flowkernel.core.names import KnownNames as KnownNames  # node types annotate check_names with it
from flowkernel.errors import Problem

if TYPE_CHECKING:
    from flowkernel.core.events import FlowPaused
    from flowkernel.core.node_context import NodeContext


@dataclass(frozen=True, slots=True)
class WaitFor:
    """Returned by a node to wait for a ``reply``: the node run goes ``waiting`` with this prompt."""

    prompt: Any
    schema: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Interrupted:
    """Returned by a cooperative node that stopped at a step boundary because the run is pausing:
    the node run stays interrupted and starts again (``resumedFrom``) when the run resumes.

    ``pause``: the node stopped of its own accord (a ``flow.call`` whose child run paused for its
    budget), and the run must pause with this ``flow:paused``."""

    pause: FlowPaused | None = None


INTERRUPTED = Interrupted()


@runtime_checkable
class NodeType(Protocol):
    """A node type. ``run`` returns the node's output, or ``WaitFor`` to wait for a reply.

    A node type with ``cooperative_pause = True`` is not cancelled when the run pauses: it should
    watch ``ctx.pause_requested()`` (or ``await ctx.wait_for_pause()``), finish its current step and
    return ``INTERRUPTED``. Every other node is cancelled and re-run on resume.

    A node type with ``takes_messages = True`` reads ``send`` messages from its inbox; a ``send`` to a
    node run of any other type is refused (see ``takes_messages`` below).
    """

    name: str

    async def run(self, ctx: NodeContext) -> Any: ...


@runtime_checkable
class RecordsAgentRuns(Protocol):
    """A node type whose node runs are agent runs (DESIGN §10: ``agent_runs``, ``flowkernel agents``):
    it sets ``records_agent_runs = True`` and says how many model calls (steps) one node run may make.
    The read models fold its node runs from the log by this declaration alone, knowing no node type."""

    records_agent_runs: bool

    def max_steps(self, node_input: Any) -> int | None:
        """The step budget of a node run with this (resolved) input, for its agent run's ``maxSteps``."""
        ...


class CheckedNodeType(NodeType, Protocol):
    """A node type that also checks its (unresolved) input when the flow is loaded.

    Optional attributes the compiler also reads (see ``flowkernel.core.validation``):

    - ``input_schema``: the JSON Schema of the input as written in the flow file (where a value may be
      a ``{{ }}`` binding, wrap its schema in ``bindable``). ``flowkernel schema`` gives it to editors
      (one ``oneOf`` branch per node type) and ``validate`` applies it to every node of the type;
    - ``expression_keys``: input keys whose string is a JSONata expression evaluated over the binding
      context (``transform``'s ``expr``), checked like a binding;
    - ``check_names(raw_input, path, known, problems)``: check the names of registered things the input
      gives (``known.functions``, ``known.tools``), called when the caller knows them;
    - ``advise(raw_input, path, notes)``: append what is worth a warning but does not make the flow
      invalid (a deprecated model); ``validate`` and ``run`` print each note and go on;
    - ``unavailable(who, services)``: why a node of this type (``who``, e.g. ``node 'planner'``) cannot
      run in a process with these services (no credentials for the API it calls), or None; a run is
      refused with it before anything is stored.
    """

    def check(self, raw_input: dict[str, Any], path: str, problems: list[Problem]) -> None: ...


def takes_messages(node_type: Any, raw_input: Any, registry: Any) -> bool:
    """Whether a node of ``node_type`` with ``raw_input`` (as written in the flow) reads ``send`` messages.

    ``takes_messages`` on the type is a bool, or, where the answer depends on the node's input (a
    ``python`` node's function), a method ``takes_messages(raw_input, registry) -> bool``. A type without
    it takes none: a message sent to it would wait in an inbox nobody reads."""
    flag = getattr(node_type, "takes_messages", False)
    if callable(flag):
        return bool(flag(raw_input, registry))
    return bool(flag)


def bindable(schema: dict[str, Any]) -> dict[str, Any]:
    """For ``input_schema``: ``schema``, or a string holding a ``{{ }}`` binding (whose value, and so its
    type, is only known at run time). ``"3"`` still fails an integer: only a binding passes."""
    return {"anyOf": [schema, BINDING_SCHEMA]}


def check_json_schema(schema: Any, path: str, problems: list[Problem]) -> None:
    """For node types' ``check``: add a problem at ``path`` unless ``schema`` is a valid JSON Schema
    object whose references all resolve within it (nothing is ever fetched)."""
    check_schema(schema, path, problems)


def unknown_name(kind: str, name: str, known: Iterable[str]) -> str:
    """``unknown python function 'x'; did you mean 'y'? (known: …)`` for ``check_names``."""
    import difflib

    names = sorted(known)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {name!r}{hint} (known: {', '.join(names) or 'none registered'})"
