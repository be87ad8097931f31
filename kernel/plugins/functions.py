"""Functions for ``python`` nodes: the ``blocking`` mark (run in a worker thread) and whether one takes ``ctx``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from flowkernel.errors import InvalidInputError


class Blocking:
    """A plain function marked by ``blocking``: a ``python`` node calls it in a worker thread."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"blocking({self.fn!r})"


def blocking(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a plain function that blocks (network or disk I/O, a long computation) so that ``python``
    nodes call it in a worker thread: the run's other node runs, its commands, lease renewal and a
    server in the same process go on meanwhile. Plain functions are otherwise called on the event loop,
    which is the cheapest for quick ones. A thread cannot be stopped: a timeout, pause or abort takes
    effect when the call returns. The function cannot take ``ctx`` (the run's state lives on the event
    loop): return what it computes, and let a ``state.set`` node or an ``async`` function store it."""
    if isinstance(fn, Blocking):
        return fn
    if not callable(fn):
        raise InvalidInputError(f"blocking({fn!r}): not a function")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise InvalidInputError(f"blocking({_label(fn)}): an async function does not block the event loop; "
                                "register it as it is")
    if takes_ctx(fn):
        raise InvalidInputError(f"blocking({_label(fn)}): a function run in a worker thread cannot take `ctx` (the "
                                "run's state lives on the event loop); make it async to use ctx, or return the value "
                                "and store it with a state.set node")
    return Blocking(fn)


def takes_ctx(fn: Any) -> bool:
    """Whether a function for ``python`` nodes has a ``ctx`` parameter (it is then given the NodeContext)."""
    try:
        return "ctx" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _label(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn))
