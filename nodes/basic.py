"""``noop``, ``transform`` and ``state.set``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowkernel.core.state_ops import OPS
from flowkernel.errors import ExpressionError, NodeFailure, Problem

# What runs a node is imported when one runs: checking a flow that is known to be valid (the
# validation cache) reads the node types but should not pay for the expression engine or msgspec.
if TYPE_CHECKING:
    from flowkernel.core.expressions import Expr
    from flowkernel.core.node_context import NodeContext


class NoopNode:
    """Outputs its (resolved) input."""

    name = "noop"
    input_schema: dict[str, Any] = {"type": "object", "description": "Anything; the node outputs it, resolved."}

    def runs_inline(self, input: Any, registry: Any) -> bool:
        return True

    async def run(self, ctx: NodeContext) -> Any:
        return ctx.input


class TransformNode:
    """Evaluates ``expr`` (JSONata) over the binding context; outputs the value.

    An expression bounded by construction runs inline; an open one (recursion, ranges, regular
    expressions, ...) in a worker thread under the run's expression limits, so the process goes on
    handling commands and other runs meanwhile, and a pause, an abort or ``timeoutMs`` stops it.
    """

    name = "transform"

    def runs_inline(self, input: Any, registry: Any) -> bool:
        source = input.get("expr") if isinstance(input, dict) else None
        compiled = self._compiled(source) if isinstance(source, str) else None
        return compiled is not None and compiled.bounded

    def __init__(self) -> None:
        self._cache: dict[str, Expr] = {}

    expression_keys = ("expr",)  # the compiler parses and checks it like a binding
    input_schema: dict[str, Any] = {
        "type": "object", "required": ["expr"], "additionalProperties": False,
        "properties": {"expr": {"type": "string", "description": (
            "JSONata evaluated over the binding context (bare or wrapped in {{ }}); the node outputs its value.")}},
    }

    def _compiled(self, source: str) -> Expr | None:
        compiled = self._cache.get(source)
        if compiled is None:
            from flowkernel.core.expressions import compile_expr, strip_braces

            compiled = compile_expr(strip_braces(source), "expr", [])
            if compiled is not None:
                self._cache[source] = compiled
        return compiled

    def check(self, raw_input: dict[str, Any], path: str, problems: list[Problem]) -> None:
        if not isinstance(raw_input.get("expr"), str):
            problems.append(Problem(f"{path}.expr", "transform needs a JSONata string in `expr`"))

    async def run(self, ctx: NodeContext) -> Any:
        # The expression is the raw text: its bindings are the expression itself, not a value to feed it.
        source = ctx.raw_input.get("expr")
        if not isinstance(source, str):
            raise NodeFailure("transform needs a JSONata string in `expr`", "invalid_input")
        compiled = self._cache.get(source)
        if compiled is None:
            from flowkernel.core.expressions import compile_expr, strip_braces

            problems: list[Problem] = []
            compiled = compile_expr(strip_braces(source), "expr", problems)
            if compiled is None:
                raise NodeFailure(str(problems[0]), "invalid_input")
            self._cache[source] = compiled
        context, variables = ctx.binding_context()
        try:
            if compiled.bounded:
                return compiled.evaluate(context, variables)
            return await ctx.evaluate(compiled, context, variables)
        except ExpressionError as exc:
            raise NodeFailure(str(exc), "expression_error") from None


class StateSetNode:
    """Changes the run's state at ``path`` with ``op`` (set, merge, append); outputs the value it wrote
    (``set``: the value; ``merge``: the object merged in; ``append``: the item appended).

    Never the whole value at ``path``: appending in a loop would then cost the whole list in every
    output, event and snapshot. A flow that wants the result binds ``state.<path>``.
    """

    name = "state.set"
    input_schema: dict[str, Any] = {
        "type": "object", "required": ["path", "value"], "additionalProperties": False,
        "properties": {
            "path": {"type": "string", "minLength": 1, "description": "A dotted path in the run's state, e.g. a.b."},
            "value": {"description": "The value to set, merge (an object) or append; bindings allowed."},
            "op": {"enum": list(OPS), "default": "set"},
        },
    }

    def runs_inline(self, input: Any, registry: Any) -> bool:
        return True

    def check(self, raw_input: dict[str, Any], path: str, problems: list[Problem]) -> None:
        if not isinstance(raw_input.get("path"), str):
            problems.append(Problem(f"{path}.path", "state.set needs a dotted `path` string"))
        if "value" not in raw_input:
            problems.append(Problem(f"{path}.value", "state.set needs a `value`"))
        op = raw_input.get("op", "set")
        if op not in OPS:
            problems.append(Problem(f"{path}.op", f"unknown op {op!r}; use one of {', '.join(OPS)}"))

    async def run(self, ctx: NodeContext) -> Any:
        data = ctx.input if isinstance(ctx.input, dict) else {}
        path = data.get("path")
        op = str(data.get("op", "set"))
        if not isinstance(path, str):
            raise NodeFailure("state.set needs a dotted `path` string", "invalid_input")
        value = data.get("value")
        ctx.patch_state(op, path, value)
        return value
