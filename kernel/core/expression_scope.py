"""The scope an evaluation of JSONata runs in: its limits, its cancellation, and whether it may run on
this thread at all (``flowkernel.core.expression_bounds`` says what each is for).

Kept apart from ``expression_bounds`` so that the run shell can set scopes without importing JSONata
and ``regex``: a flow without expressions runs without loading either.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

import msgspec
from flowkernel.errors import InvalidInputError


class ExpressionLimits(msgspec.Struct, frozen=True):
    """How far one open expression may go. Give ``Kernel(services={"expression_limits": ...})`` or set
    the ``FLOWKERNEL_EXPR_*`` environment variables (``limits_from_env``)."""

    timeout_ms: int = 5_000
    max_depth: int = 1_000  # nested evaluation steps (about three per level of a recursive function)
    max_items: int = 1_000_000  # items of a list (a range too) or keys of an object
    max_string: int = 10_000_000  # characters of a string


DEFAULT_LIMITS = ExpressionLimits()

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


class NeedsThread(BaseException):
    """An open expression was about to run on the event loop's thread: the shell runs the same pure
    decision again in a worker thread. A BaseException so no ``except Exception`` on the way swallows it."""


class EvaluationCancelled(BaseException):
    """The scope of an evaluation was cancelled (the run pauses or aborts, the node run is cancelled)."""


class Scope:
    """Limits, the caller's deadline (``time.monotonic()`` seconds, e.g. a node's ``timeoutMs``) and
    cancellation shared by the evaluations of one off-loop call (one decision, one transform)."""

    __slots__ = ("cancelled", "deadline", "inline_only", "limits")

    def __init__(self, limits: ExpressionLimits = DEFAULT_LIMITS, *, inline_only: bool = False,
                 deadline: float | None = None) -> None:
        self.limits = limits
        self.cancelled = False
        self.inline_only = inline_only
        self.deadline = deadline

    def cancel(self) -> None:
        """Stop every evaluation of this scope at its next step (callable from any thread)."""
        self.cancelled = True


INLINE_ONLY = Scope(inline_only=True)
_DEFAULT_SCOPE = Scope()


class _Local(threading.local):
    scope: Scope | None = None


_local = _Local()


def current_scope() -> Scope:
    return _local.scope or _DEFAULT_SCOPE


def given_scope() -> Scope | None:
    """This thread's scope if one was set (``call_off_loop`` sets one), else None."""
    return _local.scope


def set_scope(scope: Scope | None) -> Scope | None:
    """Make ``scope`` this thread's scope; returns the previous one (to restore)."""
    previous, _local.scope = _local.scope, scope
    return previous
