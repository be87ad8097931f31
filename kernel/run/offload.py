"""Open JSONata expressions run off the event loop, so a process executing runs keeps handling
commands, renewing leases and running other runs while one expression computes.

``call_off_loop`` runs a function (a scheduling decision, a transform) in a worker thread under a
``Scope`` of limits; cancelling the caller cancels the scope, which stops the thread's evaluation at
its next step, and the thread has always finished when ``call_off_loop`` returns: no stray thread.
Limits come from the run's services (``RunServices.expression_limits``) or the environment.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from flowkernel.core.expression_scope import EvaluationCancelled, Scope, set_scope
from flowkernel.core.expression_scope import (
    limits_from_env as limits_from_env,  # (re-exported: callers import it from here)
)

T = TypeVar("T")

CANCELLED: Any = object()  # what ``call_off_loop`` returns when the scope was cancelled from outside

async def call_off_loop(scope: Scope, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread with ``scope`` as its expression scope. Returns ``CANCELLED``
    if the scope was cancelled by someone else; if the caller is cancelled, the thread is stopped and
    waited for, then the cancellation goes on. The caller's deadline (``anyio.fail_after`` around it,
    as a node's ``timeoutMs`` is) becomes the scope's: no evaluation outlives it."""
    caller_deadline = anyio.current_effective_deadline()
    if caller_deadline != math.inf:
        at = time.monotonic() + (caller_deadline - anyio.current_time())
        scope.deadline = at if scope.deadline is None else min(scope.deadline, at)

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
            # Stopped at the caller's deadline, which the thread may see a moment before the event loop does.
            at_deadline = result is CANCELLED and not scope.cancelled
        finally:
            tg.cancel_scope.cancel()
    if error is not None:
        raise error
    if result is CANCELLED:
        await anyio.lowlevel.checkpoint_if_cancelled()
        if at_deadline and caller_deadline != math.inf:
            await anyio.sleep(max(caller_deadline - anyio.current_time(), 0.0) + 1.0)  # the deadline cancels it
    return result  # type: ignore[no-any-return]
