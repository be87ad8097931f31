"""``python``: calls a registered function (never an arbitrary import named by the flow file)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flowkernel.core.names import KnownNames
from flowkernel.core.node import bindable, unknown_name
from flowkernel.errors import NodeFailure, Problem
from flowkernel.plugins.functions import Blocking, takes_ctx

if TYPE_CHECKING:
    from flowkernel.core.node_context import NodeContext


class PythonNode:
    """Input ``{"function": "<registered name>", "args"?: {...}}``; outputs the function's return value.

    A function that takes a parameter named ``ctx`` receives the ``NodeContext`` (state, patches,
    inbox). Plain functions run on the event loop, those marked ``flowkernel.plugins.registry.blocking`` in a worker
    thread: make I/O-bound functions ``async`` or mark them.
    """

    name = "python"
    input_schema: dict[str, Any] = {
        "type": "object", "required": ["function"], "additionalProperties": False,
        "properties": {
            "function": {"type": "string", "description": "A function registered by a plugin (never an import path)."},
            "args": bindable({"type": "object", "description": "Keyword arguments; bindings allowed in values."}),
        },
    }

    def runs_inline(self, input: Any, registry: Any) -> bool:
        """A sync function blocks the event loop wherever it runs: run it without a task of its own."""
        fn = registry.functions.get(str(input.get("function"))) if isinstance(input, dict) else None
        return fn is not None and _per_function(_INLINE, fn, _is_plain_function)

    def takes_messages(self, raw_input: Any, registry: Any) -> bool:
        """Only a function that takes ``ctx`` can read its inbox (``ctx.inbox()``); one named by a binding
        is known only when the node starts, so it is not refused."""
        name = raw_input.get("function") if isinstance(raw_input, dict) else None
        if not isinstance(name, str) or "{{" in name:
            return True
        fn = registry.functions.get(name)
        return fn is None or (type(fn) is not Blocking and _per_function(_WANTS_CTX, fn, takes_ctx))

    def check(self, raw_input: dict[str, Any], path: str, problems: list[Problem]) -> None:
        if not isinstance(raw_input.get("function"), str):
            problems.append(Problem(f"{path}.function", "python needs the registered `function` name"))
        args = raw_input.get("args")
        if args is not None and not isinstance(args, (dict, str)):
            problems.append(Problem(f"{path}.args", "args must be an object of keyword arguments"))

    def check_names(self, raw_input: dict[str, Any], path: str, known: KnownNames, problems: list[Problem]) -> None:
        name = raw_input.get("function")
        if isinstance(name, str) and "{{" not in name and name not in known.functions:
            problems.append(Problem(f"{path}.function", unknown_name("python function", name, known.functions)
                                    + "; register it with --plugin MODULE, the flowkernel.functions entry "
                                    "point or Registry.add_function"))

    async def run(self, ctx: NodeContext) -> Any:
        data = ctx.input if isinstance(ctx.input, dict) else {}
        name = data.get("function")
        fn = ctx.registry.functions.get(str(name))
        if fn is None:
            known = ", ".join(sorted(ctx.registry.functions)) or "none registered"
            raise NodeFailure(
                f"node {ctx.node_id!r}: no python function {name!r} (known: {known}); register it with "
                "--plugin MODULE, the flowkernel.functions entry point or Registry.add_function",
                "unknown_function")
        args = data.get("args") or {}
        if not isinstance(args, dict):
            raise NodeFailure(f"node {ctx.node_id!r}: args must be an object", "invalid_input")
        if type(fn) is Blocking:
            import anyio.lowlevel
            import anyio.to_thread

            result = await anyio.to_thread.run_sync(functools.partial(fn.fn, **args))
            # A thread cannot be stopped: a timeout, pause or abort that came meanwhile takes effect now.
            await anyio.lowlevel.checkpoint_if_cancelled()
            return result
        if _per_function(_WANTS_CTX, fn, takes_ctx):
            args = {**args, "ctx": ctx}
        result = fn(**args)
        if type(result) not in _PLAIN and inspect.isawaitable(result):
            result = await result
        return result


_PLAIN = frozenset({dict, list, str, int, float, bool, type(None)})  # results that cannot be awaitables
# What is known of each registered function, looked up on every node run.
_WANTS_CTX: dict[Any, bool] = {}
_INLINE: dict[Any, bool] = {}


def _per_function(cache: dict[Any, bool], fn: Any, probe: Callable[[Any], bool]) -> bool:
    try:
        known = cache.get(fn)
    except TypeError:  # an unhashable callable: ask every time
        return probe(fn)
    if known is None:
        known = cache[fn] = probe(fn)
    return known


def _is_plain_function(fn: Any) -> bool:
    """Called on the event loop, where it finishes without awaiting anything (not async, not blocking)."""
    return type(fn) is not Blocking and not inspect.iscoroutinefunction(fn) and not inspect.isasyncgenfunction(fn)
