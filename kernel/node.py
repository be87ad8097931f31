"""The seam between the kernel and node types: the ``NodeType`` protocol and what a node returns.

A node type's ``run`` gets a ``flowkernel.context.NodeContext``; this module needs nothing of the
run shell, the compiler or the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from flowkernel.errors import Problem

if TYPE_CHECKING:
    from flowkernel.context import NodeContext


@dataclass(frozen=True, slots=True)
class WaitFor:
    """Returned by a node to wait for a ``reply``: the node run goes ``waiting`` with this prompt."""

    prompt: Any
    schema: dict[str, Any] | None = None


class Interrupted:
    """Returned by a cooperative node that stopped at a step boundary because the run is pausing:
    the node run stays interrupted and starts again (``resumedFrom``) when the run resumes."""


INTERRUPTED = Interrupted()


@runtime_checkable
class NodeType(Protocol):
    """A node type. ``run`` returns the node's output, or ``WaitFor`` to wait for a reply.

    A node type with ``cooperative_pause = True`` is not cancelled when the run pauses: it should
    watch ``ctx.pause_requested()`` (or ``await ctx.wait_for_pause()``), finish its current step and
    return ``INTERRUPTED``. Every other node is cancelled and re-run on resume.
    """

    name: str

    async def run(self, ctx: NodeContext) -> Any: ...


class CheckedNodeType(NodeType, Protocol):
    """A node type that also checks its (unresolved) input when the flow is loaded."""

    def check(self, raw_input: dict[str, Any], path: str, problems: list[Problem]) -> None: ...


def check_json_schema(schema: Any, path: str, problems: list[Problem]) -> None:
    """For node types' ``check``: add a problem at ``path`` unless ``schema`` is a valid JSON Schema object."""
    if not isinstance(schema, dict):
        problems.append(Problem(path, "must be a JSON Schema object"))
        return
    import jsonschema  # only when a flow has a schema: keeps start-up light

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        problems.append(Problem(path, f"not a valid JSON Schema: {exc.message}"))
