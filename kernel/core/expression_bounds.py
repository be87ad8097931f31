"""Bounds on JSONata evaluation: which expressions need them, and the time, depth and size limits
and cancellation that hold the others.

Most expressions in a flow are *bounded by construction*: paths, literals, operators, conditions,
object and array constructors, filters and a set of linear built-in functions cost at most (the
expression's size x the data's size), and the data is already in memory. They run unguarded, as fast
as jsonata-python goes: the scheduler evaluates bindings on every step.

Every other expression is *open*: it may define and call functions (recursion), build ranges
(``[1..10000000]``), match regular expressions (catastrophic backtracking), ``$eval`` a string, sort
with a comparator, pad to any width. An open expression is evaluated under a ``Budget``: jsonata's
evaluate entry and exit hooks count its nesting depth, check its deadline and its scope's
cancellation on every step, and check the size of every intermediate list, object and string; regular
expressions are matched by ``flowkernel.core.bounded_regex`` within the remaining time (without the GIL, and
a long match in a child process that a cancellation kills); ``$pad`` and ``$replace`` check the size of what they would build
before building it. A limit that fires is an ``ExpressionLimitError`` (an ``ExpressionError``: the
scheduler records it as a ``binding_error``, a transform node as ``expression_error``), so the run's
event log says what happened and replay never re-evaluates it.

The deadline is the expression's limit or, when it comes sooner, its caller's (a node's ``timeoutMs``):
reaching the caller's is the caller's timeout, reported by the caller.

The run shell evaluates open expressions off the event loop (``flowkernel.run.offload``): a thread-local
``Scope`` tells an evaluation its limits, its caller's deadline and whether it was cancelled, and on the event loop's own
thread an open expression asks to be moved (``NeedsThread``). Anywhere else (tests, scripts) an open
expression runs where it is called, under the default limits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import flowkernel.core.bounded_regex as bounded_regex
import jsonata
import regex
from flowkernel.core.expression_scope import (  # noqa: F401  (the limits and scopes' documented home too)
    DEFAULT_LIMITS,
    INLINE_ONLY,
    EvaluationCancelled,
    ExpressionLimits,
    NeedsThread,
    Scope,
    current_scope,
    set_scope,
)
from flowkernel.errors import ExpressionError, ExpressionLimitError
from jsonata import functions as jsonata_functions
from jsonata.regex_engine import RegexFlags


class _Local(threading.local):
    budget: _Budget | None = None
    instance: jsonata.Jsonata | None = None


_local = _Local()


def own_jsonata_instance() -> jsonata.Jsonata:
    """Make this thread's jsonata instance one that only this thread uses, and return it.

    jsonata-python evaluates through a per-thread instance (``Jsonata.CURRENT``) whose attributes it
    changes while it evaluates; constructing an expression makes that expression the thread's instance.
    An expression that two threads evaluate (the same flow's runs on the event loop and in a worker
    thread) must never be one thread's instance, or one evaluation would see the other's scope.
    """
    instance = _local.instance
    if instance is None:
        instance = _local.instance = jsonata.Jsonata("$", regex_engine)
    jsonata.Jsonata.CURRENT.jsonata = instance
    return instance


class _Stop(BaseException):
    """(A BaseException: jsonata's handlers catch Exception.) A limit fired or the scope was cancelled, deep inside an evaluation."""

    def __init__(self, message: str, cancelled: bool = False) -> None:
        super().__init__(message)
        self.cancelled = cancelled


class _Budget:
    """One evaluation of one open expression."""

    __slots__ = ("deadline", "depth", "limits", "scope", "stops_caller")

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.limits = scope.limits
        self.deadline = time.monotonic() + scope.limits.timeout_ms / 1000
        # The caller's own deadline (a node's timeoutMs) when it comes first: reaching it is the caller's
        # timeout, not this expression's limit.
        self.stops_caller = scope.deadline is not None and scope.deadline < self.deadline
        if self.stops_caller:
            self.deadline = scope.deadline  # type: ignore[assignment]  # not None: checked above
        self.depth = 0

    def check(self) -> None:
        if self.scope.cancelled:
            raise _Stop("cancelled", cancelled=True)
        if time.monotonic() > self.deadline:
            if self.stops_caller:
                raise _Stop("the caller's deadline passed", cancelled=True)
            raise _Stop(f"ran longer than its {self.limits.timeout_ms} ms limit (FLOWKERNEL_EXPR_TIMEOUT_MS)")

    def bound(self) -> bounded_regex.Bound:
        scope = self.scope
        return bounded_regex.Bound(self.deadline, lambda: scope.cancelled)

    def check_size(self, value: Any) -> None:
        if isinstance(value, str):
            if len(value) > self.limits.max_string:
                raise _Stop(f"built a string of {len(value):,} characters, over the limit of "
                            f"{self.limits.max_string:,} (FLOWKERNEL_EXPR_MAX_STRING)")
        elif isinstance(value, (list, dict)) and len(value) > self.limits.max_items:
            what = "a list" if isinstance(value, list) else "an object"
            raise _Stop(f"built {what} of {len(value):,} items, over the limit of {self.limits.max_items:,} "
                        f"(FLOWKERNEL_EXPR_MAX_ITEMS)")


def _on_entry(expr: Any, input: Any, env: Any) -> None:
    budget = _local.budget
    if budget is None:
        return
    budget.depth += 1
    if budget.depth > budget.limits.max_depth:
        raise _Stop(f"nested deeper than {budget.limits.max_depth} evaluation steps (unbounded recursion?) "
                    f"(FLOWKERNEL_EXPR_MAX_DEPTH)")
    budget.check()


def _on_exit(expr: Any, input: Any, env: Any, result: Any) -> None:
    budget = _local.budget
    if budget is None:
        return
    budget.depth -= 1
    budget.check()
    if result is not None:
        budget.check_size(result)


def guard(compiled: jsonata.Jsonata) -> None:
    """Install the budget hooks and the size-checked built-ins on an open expression."""
    env = compiled.environment
    env.set_evaluate_entry_callback(_on_entry)
    env.set_evaluate_exit_callback(_on_exit)
    env.bind("pad", _PAD)
    env.bind("replace", _REPLACE)


def evaluate_open(compiled: jsonata.Jsonata, quoted: str, context: Any, variables: Any) -> Any:
    """Evaluate an open expression under a budget of this thread's scope; ``quoted`` is its source as
    error messages show it (``flowkernel.core.expressions.quoted``: cut short, so a message stays one line)."""
    scope = current_scope()
    if scope.inline_only:
        raise NeedsThread
    if scope.cancelled:
        raise EvaluationCancelled
    budget = _Budget(scope)
    previous, _local.budget = _local.budget, budget
    own_jsonata_instance().timestamp = round(time.time() * 1000)  # what $now() and $millis() return
    try:
        result = compiled.evaluate(context, variables)
        budget.check_size(result)
        return result
    except _Stop as stop:
        if stop.cancelled:
            raise EvaluationCancelled from None
        raise ExpressionLimitError(f"{quoted}: {stop}") from None
    except RecursionError:
        raise ExpressionLimitError(f"{quoted}: recursed deeper than Python allows "
                                   f"(lower FLOWKERNEL_EXPR_MAX_DEPTH to stop it sooner)") from None
    except Exception as exc:  # jsonata raises bare RuntimeErrors and the odd TypeError
        raise ExpressionError(f"{quoted}: {exc}") from None
    finally:
        _local.budget = previous


# -- regular expressions ------------------------------------------------------------------------


class _BoundedPattern:
    """A ``regex`` pattern matched within its evaluation's time (``flowkernel.core.bounded_regex``: a long
    match moves to a child process that a cancellation kills); jsonata calls these four."""

    __slots__ = ("_pattern",)

    def __init__(self, pattern: regex.Pattern[str]) -> None:
        self._pattern = pattern

    def search(self, string: str) -> Any:
        with _regex_time() as bound:
            return bounded_regex.search(self._pattern, string, bound)

    def finditer(self, string: str) -> Iterator[Any]:
        with _regex_time() as bound:  # the matching happens as the matches are taken
            yield from bounded_regex.finditer(self._pattern, string, bound)

    def sub(self, repl: Any, string: str, count: int = 0) -> str:
        with _regex_time() as bound:
            return bounded_regex.sub(self._pattern, repl, string, bound, count)

    def split(self, string: str, maxsplit: int = 0) -> list[str | None]:
        with _regex_time() as bound:
            return bounded_regex.split(self._pattern, string, bound, maxsplit)


@contextmanager
def _regex_time() -> Iterator[bounded_regex.Bound]:
    """The evaluation's time and cancellation, for its regular expressions: running out of either is
    the evaluation's time limit, or its caller's deadline, or its cancellation."""
    budget = _local.budget
    if budget is None:  # not under evaluate_open: this thread's scope's limits
        budget = _Budget(current_scope())
    try:
        yield budget.bound()
    except bounded_regex.RegexTimeout:
        budget.check()  # the caller's deadline, or a cancellation meanwhile
        raise _Stop(f"a regular expression ran past the {budget.limits.timeout_ms} ms limit "
                    f"(FLOWKERNEL_EXPR_TIMEOUT_MS)") from None
    except EvaluationCancelled:
        raise _Stop("cancelled", cancelled=True) from None


def regex_engine(pattern: str, flags: RegexFlags) -> _BoundedPattern:
    """jsonata's regex engine: the ``regex`` module (``re``'s syntax), bounded by the evaluation's time."""
    native = 0
    if flags.case_insensitive:
        native |= regex.IGNORECASE
    if flags.multiline:
        native |= regex.MULTILINE
    return _BoundedPattern(bounded_regex.compile_pattern(pattern, native))


# -- built-ins whose output can be far larger than their input -------------------------------------


class _SizeChecked:
    """``$pad`` and ``$replace``, refusing before they build a string over the limit."""

    @staticmethod
    def pad(string: str | None, width: Any, char: str | None) -> str | None:
        budget = _local.budget
        if budget is not None and isinstance(width, (int, float)) and abs(width) > budget.limits.max_string:
            raise _Stop(f"$pad to {int(abs(width)):,} characters is over the limit of "
                        f"{budget.limits.max_string:,} (FLOWKERNEL_EXPR_MAX_STRING)")
        return jsonata_functions.Functions.pad(string, width, char)  # type: ignore[no-any-return]

    @staticmethod
    def replace(string: str | None, pattern: Any, replacement: Any, limit: Any) -> str | None:
        budget = _local.budget
        if budget is not None and isinstance(string, str) and isinstance(pattern, str) and pattern \
                and isinstance(replacement, str):
            count = string.count(pattern)
            if isinstance(limit, (int, float)) and limit >= 0:
                count = min(count, int(limit))
            size = len(string) + count * (len(replacement) - len(pattern))
            if size > budget.limits.max_string:
                raise _Stop(f"$replace would build {size:,} characters, over the limit of "
                            f"{budget.limits.max_string:,} (FLOWKERNEL_EXPR_MAX_STRING)")
        return jsonata_functions.Functions.replace(string, pattern, replacement, limit)  # type: ignore[no-any-return]


_PAD = jsonata.Jsonata.JNativeFunction("pad", "<s-ns?:s>", _SizeChecked, "pad")
_REPLACE = jsonata.Jsonata.JNativeFunction("replace", "<s-(sf)(sf)n?:s>", _SizeChecked, "replace")


# -- which expressions are bounded by construction --------------------------------------------------

# Built-in functions whose cost and output are linear in their arguments.
_LINEAR_FUNCTIONS = frozenset({
    "sum", "count", "max", "min", "average", "string", "substring", "substringBefore", "substringAfter",
    "lowercase", "uppercase", "length", "trim", "contains", "split", "join", "number", "floor", "ceil",
    "round", "abs", "sqrt", "boolean", "not", "zip", "keys", "lookup", "append", "exists", "spread", "merge",
    "reverse", "type", "error", "assert", "base64encode", "base64decode", "encodeUrlComponent", "encodeUrl",
    "decodeUrlComponent", "decodeUrl",
})
# Node types that never loop, recurse or build more than their operands.
_PLAIN_TYPES = frozenset({"path", "name", "string", "number", "value", "wildcard", "condition", "block", "filter"})


def is_bounded(ast: Any) -> bool:
    """Whether the parsed expression ``ast`` costs at most (its size x its data's size) to evaluate."""
    seen: set[int] = set()
    pending: list[Any] = [ast]
    while pending:
        node = pending.pop()
        if isinstance(node, (list, tuple)):
            pending.extend(node)
            continue
        if not isinstance(node, jsonata.parser.Parser.Symbol) or id(node) in seen:
            continue
        seen.add(id(node))
        if not _plain(node):
            return False
        for key, value in vars(node).items():
            if not key.startswith("_") and isinstance(value, (jsonata.parser.Parser.Symbol, list, tuple)):
                pending.append(value)
    return True


def _plain(node: Any) -> bool:
    kind = getattr(node, "type", None)
    if getattr(node, "focus", None) or getattr(node, "index", None) or getattr(node, "tuple", None):
        return False  # @ and # bindings
    if kind is None or kind in _PLAIN_TYPES:
        return True  # untyped nodes are containers (an object constructor's grouping)
    value = getattr(node, "value", None)
    if kind == "binary":
        return value != ".."
    if kind == "unary":
        return value in ("-", "[", "{")
    if kind == "variable":
        return value != "$"  # $$, the whole context, inside a per-item step makes the cost quadratic
    if kind == "function":
        return _linear_call(node)
    if kind == "apply":  # x ~> $f(...): the call is checked where it appears
        rhs = getattr(node, "rhs", None)
        return getattr(rhs, "type", None) == "function" or (
            getattr(rhs, "type", None) == "variable" and getattr(rhs, "value", None) in _LINEAR_FUNCTIONS)
    return False  # regex, lambda, partial, bind, range, descendant, parent, sort, transform, and anything new


def _linear_call(node: Any) -> bool:
    procedure: Any = getattr(node, "procedure", None)
    name = getattr(procedure, "value", None)
    if getattr(procedure, "type", None) != "variable" or name not in _LINEAR_FUNCTIONS:
        return False
    arguments = getattr(node, "arguments", None) or []
    if name == "join" and len(arguments) > 1:
        # $join(items, sep): items x a separator taken from the data would be quadratic.
        return getattr(arguments[1], "type", None) == "string"
    return True
