"""JSONata expressions, ``{{ }}`` bindings and ``when`` conditions, compiled once at load.

Evaluation is pure: the same context gives the same value, which is what lets the reducer decide
edges during replay exactly as it did live.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import msgspec
from flowkernel.errors import ExpressionError, Problem

# What jsonata-python returns for a function value (a builtin, a lambda or a partial application); set
# with the first expression compiled, as JSONata is imported then: a flow without expressions runs
# without loading it (nor ``regex``).
_FUNCTIONS: tuple[type, ...] = ()
_BINDING = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)  # anchored use only: see _bindings


def _bindings(text: str) -> Iterator[tuple[int, int, str]]:
    """``(start, end, inner)`` of each ``{{ … }}`` in ``text``, as ``_BINDING.finditer`` finds them but
    in linear time: a regex search retries from every ``{{`` when no ``}}`` follows, so a string of many
    ``{{`` took minutes."""
    pos = 0
    while (start := text.find("{{", pos)) >= 0:
        end = text.find("}}", start + 2)
        if end < 0:
            return
        yield start, end + 2, text[start + 2:end]
        pos = end + 2


_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_PLAIN_PATH = re.compile(rf"{_NAME}(\.{_NAME})*")
_KEYWORDS = frozenset({"and", "or", "in", "true", "false", "null", "function"})
_MISSING = object()


def _plain_path(source: str) -> tuple[str, ...] | None:
    """``("planner", "text")`` for ``planner.text``: a path of plain names, no operator, no variable."""
    text = source.strip()
    if not _PLAIN_PATH.fullmatch(text):
        return None
    keys = tuple(text.split("."))
    return None if _KEYWORDS.intersection(keys) else keys


class Expr:
    """One compiled JSONata expression.

    ``bounded`` expressions (see ``flowkernel.core.expression_bounds``) are evaluated as they are; open ones
    under time, depth and size limits.
    """

    __slots__ = ("_compiled", "_path", "bounded", "source")

    def __init__(self, source: str) -> None:
        global _FUNCTIONS
        import jsonata
        from flowkernel.core.expression_bounds import guard, is_bounded, own_jsonata_instance, regex_engine

        if not _FUNCTIONS:
            _FUNCTIONS = (jsonata.Jsonata.JFunctionCallable, jsonata.parser.Parser.Symbol)
        self.source = source
        self._compiled = jsonata.Jsonata(source, regex_engine)
        own_jsonata_instance()  # constructing made this expression the thread's own instance: undo that
        # Inputs are plain JSON already (events are JSON round-tripped), so skip the per-call walk.
        self._compiled.set_validate_input(False)
        # Most bindings are a plain path (``planner.text``, ``agent.transcript``). Through maps it is a
        # lookup per name, with the value JSONata gives; JSONata itself walks the whole result (it
        # converts its null marker), which would make binding a long list cost its length.
        self._path = _plain_path(source)
        self.bounded = is_bounded(self._compiled.ast)
        if not self.bounded:
            guard(self._compiled)

    @property
    def ast(self) -> Any:
        """The parsed syntax tree (jsonata-python's), for checks that read the expression at load."""
        return self._compiled.ast

    def evaluate(self, context: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> Any:
        path = self._path
        if path is not None:
            value: Any = context
            for key in path:
                if type(value) is not dict:
                    break  # a list on the way maps the rest of the path over it: JSONata's to do
                value = value.get(key, _MISSING)
                if value is _MISSING:
                    return None
            else:
                return value
        # Variables always go in a frame of this call's own: the expression may be evaluated in two
        # threads at once, and without one jsonata binds ``$`` in the expression's shared frame.
        bindings = dict(variables) if variables else {}
        if not self.bounded:
            from flowkernel.core.expression_bounds import evaluate_open

            value = evaluate_open(self._compiled, quoted(self.source), context, bindings)
        else:
            try:
                value = self._compiled.evaluate(context, bindings)
            except Exception as exc:  # jsonata raises bare RuntimeErrors and the odd TypeError
                raise ExpressionError(f"{quoted(self.source)}: {exc}") from None
        if isinstance(value, _FUNCTIONS):  # no JSON value: it would fail later, far from its cause
            raise ExpressionError(f"{quoted(self.source)} evaluates to a function, not a value")
        return value


# Called with each expression compiled and its JSON path: how validation looks inside bindings.
ExprCheck = Callable[[Expr, str], None]

# The JSONata parser takes ~40 µs a character: a longer expression is a mistake or an attack, and its
# parse alone would hold validation for seconds to minutes.
MAX_EXPRESSION_CHARS = 10_000


def quoted(source: str, limit: int = 80) -> str:
    """``source`` quoted for a message, cut to ``limit`` characters: an error stays one readable line."""
    return repr(source if len(source) <= limit else source[:limit] + "…")


def compile_expr(source: str, path: str, problems: list[Problem], check: ExprCheck | None = None) -> Expr | None:
    """Compile ``source``; on a syntax error (or, validating, one over ``MAX_EXPRESSION_CHARS``) add a
    problem at ``path`` and return None."""
    if not source.strip():
        problems.append(Problem(path, "empty expression"))
        return None
    # Only where a document is validated (``check`` given): a stored flow compiles as it was accepted.
    if check is not None and len(source) > MAX_EXPRESSION_CHARS:
        problems.append(Problem(path, f"an expression of {len(source):,} characters ({quoted(source, 40)}); at most "
                                      f"{MAX_EXPRESSION_CHARS:,}: compute it in a python function instead"))
        return None
    try:
        expr = Expr(source)
    except RecursionError:
        problems.append(Problem(path, f"JSONata does not parse: nested too deeply in {quoted(source)}"))
        return None
    except Exception as exc:
        problems.append(Problem(path, f"JSONata does not parse: {exc} in {quoted(source)}"))
        return None
    if check is not None:
        check(expr, path)
    return expr


def strip_braces(source: str) -> str:
    """``{{ expr }}`` -> ``expr``; a bare expression is returned unchanged."""
    match = _BINDING.fullmatch(source.strip())
    return match.group(1).strip() if match else source


class Template(Protocol):
    def render(self, context: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> Any: ...


class _Node(msgspec.Struct, frozen=True):
    """A part of a compiled template or condition: immutable, compared by value. (msgspec structs: a
    class is made in a tenth of the time a dataclass takes, which every process that runs a flow
    pays at import.)"""


class _Const(_Node, frozen=True):
    value: Any

    def render(self, context: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> Any:
        return self.value


class _Whole(_Node, frozen=True):
    expr: Expr

    def render(self, context: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> Any:
        return self.expr.evaluate(context, variables)


class _Mixed(_Node, frozen=True):
    parts: tuple[str | Expr, ...]

    def render(self, context: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> Any:
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            value = part.evaluate(context, variables)
            if value is None:
                continue
            out.append(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
        return "".join(out)


class _Dict(_Node, frozen=True):
    items: tuple[tuple[str, Template], ...]

    def render(self, context: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> Any:
        return {k: t.render(context, variables) for k, t in self.items}


class _List(_Node, frozen=True):
    items: tuple[Template, ...]

    def render(self, context: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> Any:
        return [t.render(context, variables) for t in self.items]


class _Lazy:
    """A node input compiled when it is first used: a stored flow of 10,000 nodes that resumes halfway
    compiles the inputs of the nodes it runs, not all of them before it can start."""

    __slots__ = ("_compiled", "_index", "_raw")

    def __init__(self, raw: Any, index: int) -> None:
        self._raw, self._index = raw, index  # (its JSON path is only written out if it is compiled)
        self._compiled: Template | None = None

    def compiled(self) -> Template:
        if self._compiled is None:
            problems: list[Problem] = []
            compiled = compile_template(self._raw, f"$.nodes[{self._index}].input", problems)
            if problems:
                raise ExpressionError(str(problems[0]))
            self._compiled = compiled
        return self._compiled

    def render(self, context: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> Any:
        return self.compiled().render(context, variables)


def lazy_node_input(value: Any, index: int) -> Template:
    """``compile_template`` of node ``index``'s input, known to compile (a validated flow's), done on first use."""
    return _Lazy(value, index)


def is_constant(template: Template) -> bool:
    """Whether ``template`` renders the same value whatever the context (it has no ``{{ }}``)."""
    if type(template) is _Lazy:
        template = template.compiled()
    return isinstance(template, _Const)


def compile_template(value: Any, path: str, problems: list[Problem], check: ExprCheck | None = None) -> Template:
    """Compile every ``{{ }}`` in a JSON value. A string that is one whole binding keeps its type."""
    if isinstance(value, str):
        if "{{" not in value:
            return _Const(value)
        whole = _BINDING.fullmatch(value.strip())
        if whole and "{{" not in whole.group(1):
            expr = compile_expr(whole.group(1).strip(), path, problems, check)
            return _Whole(expr) if expr else _Const(None)
        parts: list[str | Expr] = []
        pos = 0
        for start, end, inner in _bindings(value):
            if start > pos:
                parts.append(value[pos:start])
            expr = compile_expr(inner.strip(), path, problems, check)
            if expr:
                parts.append(expr)
            pos = end
        if pos < len(value):
            parts.append(value[pos:])
        return _Mixed(tuple(parts))
    if isinstance(value, dict):
        items = tuple((k, compile_template(v, f"{path}.{k}", problems, check)) for k, v in value.items())
        if all(isinstance(t, _Const) for _, t in items):
            return _Const(value)
        return _Dict(items)
    if isinstance(value, list):
        elems = tuple(compile_template(v, f"{path}[{i}]", problems, check) for i, v in enumerate(value))
        if all(isinstance(t, _Const) for t in elems):
            return _Const(value)
        return _List(elems)
    return _Const(value)


class Condition(Protocol):
    def holds(self, context: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> bool: ...


class _Truthy(_Node, frozen=True):
    expr: Expr

    def holds(self, context: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> bool:
        return truthy(self.expr.evaluate(context, variables))


class _Equals(_Node, frozen=True):
    var: Expr
    value: Any

    def holds(self, context: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> bool:
        return bool(self.var.evaluate(context, variables) == self.value)


class _Not(_Node, frozen=True):
    inner: Condition

    def holds(self, context: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> bool:
        return not self.inner.holds(context, variables)


class _All(_Node, frozen=True):
    parts: tuple[Condition, ...]

    def holds(self, context: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> bool:
        return all(p.holds(context, variables) for p in self.parts)


class _Any(_Node, frozen=True):
    parts: tuple[Condition, ...]

    def holds(self, context: Mapping[str, Any], variables: Mapping[str, Any] | None = None) -> bool:
        return any(p.holds(context, variables) for p in self.parts)


ALWAYS: Condition = _All(())  # no ``when``: holds without looking at any context


def truthy(value: Any) -> bool:
    """JSONata's boolean cast: empty string, 0, null, false, empty array/object are false."""
    if isinstance(value, list):
        return any(truthy(v) for v in value)
    return bool(value)


def compile_when(value: Any, path: str, problems: list[Problem], check: ExprCheck | None = None) -> Condition:
    """Compile a ``when`` in the string or the structured form."""
    if value is None:
        return ALWAYS
    if isinstance(value, str):
        expr = compile_expr(strip_braces(value), path, problems, check)
        return _Truthy(expr) if expr else ALWAYS
    if isinstance(value, dict) and len(value) == 1:
        (key, arg), = value.items()
        if key == "equals":
            if not isinstance(arg, dict) or set(arg) != {"var", "value"} or not isinstance(arg["var"], str):
                problems.append(Problem(f"{path}.equals", 'expected {"var": "<path>", "value": <any>}'))
                return ALWAYS
            expr = compile_expr(strip_braces(arg["var"]), f"{path}.equals.var", problems, check)
            return _Equals(expr, arg["value"]) if expr else ALWAYS
        if key == "not":
            return _Not(compile_when(arg, f"{path}.not", problems, check))
        if key in ("and", "or"):
            if not isinstance(arg, list):
                problems.append(Problem(f"{path}.{key}", "expected a list of conditions"))
                return ALWAYS
            parts = tuple(compile_when(v, f"{path}.{key}[{i}]", problems, check) for i, v in enumerate(arg))
            return _All(parts) if key == "and" else _Any(parts)
    problems.append(Problem(path, "a when is a JSONata string or one of equals / not / and / or"))
    return ALWAYS
