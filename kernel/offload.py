"""Open JSONata expressions run off the event loop, so a process executing runs keeps handling
commands, renewing leases and running other runs while one expression computes.

``call_off_loop`` runs a function (a scheduling decision, a transform) in a worker thread under a
``Scope`` of limits; cancelling the caller cancels the scope, which stops the thread's evaluation at
its next step, and the thread has always finished when ``call_off_loop`` returns: no stray thread.
Limits come from ``Kernel(services={"expression_limits": ExpressionLimits(...)})`` or the environment.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import anyio
from flowkernel.errors import InvalidInputError
from flowkernel.expression_scope import (
    DEFAULT_LIMITS,
    EvaluationCancelled,
    ExpressionLimits,
    Scope,
    set_scope,
)
from flowkernel.expressions import Expr

T = TypeVar("T")

CANCELLED: Any = object()  # what ``call_off_loop`` returns when the scope was cancelled from outside

_ENV = {"timeout_ms": "FLOWKERNEL_EXPR_TIMEOUT_MS", "max_depth": "FLOWKERNEL_EXPR_MAX_DEPTH",
        "max_items": "FLOWKERNEL_EXPR_MAX_ITEMS", "max_string": "FLOWKERNEL_EXPR_MAX_STRING"}
_from_env: tuple[tuple[str | None, ...], ExpressionLimits] | None = None


def limits_from_env(environ: Mapping[str, str] = os.environ) -> ExpressionLimits:
    """The limits the ``FLOWKERNEL_EXPR_*`` variables set (positive integers), defaults for the rest."""
    global _from_env
    raw = tuple(environ.get(name) for name in _ENV.values())
    if _from_env is not None and _from_env[0] == raw:
        return _from_env[1]
    values: dict[str, int] = {}
    for (field, name), text in zip(_ENV.items(), raw, strict=True):
        if text is None or not text.strip():
            continue
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise InvalidInputError(f"{name}={text!r}: expected a positive whole number")
        values[field] = value
    limits = ExpressionLimits(**values) if values else DEFAULT_LIMITS
    _from_env = (raw, limits)
    return limits


def expression_limits(services: Mapping[str, Any]) -> ExpressionLimits:
    """The limits for a run: the ``expression_limits`` service, else the environment's."""
    given = services.get("expression_limits")
    return given if isinstance(given, ExpressionLimits) else limits_from_env()


async def call_off_loop(scope: Scope, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread with ``scope`` as its expression scope. Returns ``CANCELLED``
    if the scope was cancelled by someone else; if the caller is cancelled, the thread is stopped and
    waited for, then the cancellation goes on."""

    def work() -> tuple[Any, Exception | None]:
        set_scope(scope)
        try:
            return fn(*args), None
        except EvaluationCancelled:
            return CANCELLED, None
        except Exception as exc:  # raised in the caller, outside the task group (which would wrap it)
            return None, exc
        finally:
            set_scope(None)

    async def cancel_scope_on_cancel() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel_scope_on_cancel)
        try:
            # Not abandoned on cancellation: the thread stops at its evaluation's next step, and is waited for.
            result, error = await anyio.to_thread.run_sync(work)
        finally:
            tg.cancel_scope.cancel()
    if error is not None:
        raise error
    if result is CANCELLED:
        await anyio.lowlevel.checkpoint_if_cancelled()
    return result  # type: ignore[no-any-return]


async def evaluate_off_loop(expr: Expr, context: Any, variables: Any, limits: ExpressionLimits) -> Any:
    """Evaluate ``expr`` in a worker thread under ``limits`` (for node types that evaluate expressions)."""
    result = await call_off_loop(Scope(limits), expr.evaluate, context, variables)
    if result is CANCELLED:  # only the caller's cancellation cancels this scope, and that raised above
        raise EvaluationCancelled
    return result
