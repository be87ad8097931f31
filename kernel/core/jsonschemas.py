"""The JSON Schemas a flow carries (``inputs``, a ``human.input`` reply schema, an agent's
``outputSchema``): checked when the flow is loaded, applied without ever fetching anything and
without ever stalling the process.

A ``$ref`` resolves only inside the schema itself (``#/$defs/…``, or an ``$id`` the schema declares):
jsonschema's default would fetch ``http://…`` references (and ``file://`` ones), so a flow file could
make the kernel issue requests or read files. Every validator here is built on a registry whose
``retrieve`` refuses, and ``check_schema`` reports a ``$ref`` that does not resolve, with its path.

The regular expressions a schema brings (``pattern``, ``patternProperties``, and the
``additionalProperties`` and ``unevaluatedProperties`` that consult it) are matched by
``flowkernel.core.bounded_regex`` under one deadline per validation, the limit of expressions
(``FLOWKERNEL_EXPR_TIMEOUT_MS``): jsonschema's own ``re.search`` holds the GIL, so a pattern such as
``^(a|a)+$`` against a long enough value would freeze every thread of the process. Running out of
time raises ``PatternTimeoutError`` with the JSON paths of the value and of the schema keyword.
``format`` stays an annotation (no format is asserted, the ``regex`` format included).
"""

from __future__ import annotations

import threading
import time
import types
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

from flowkernel.errors import PatternTimeoutError, Problem

if TYPE_CHECKING:
    from flowkernel.core.bounded_regex import Bound
    from flowkernel.core.expression_scope import ExpressionLimits, Scope
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

# A string holding a ``{{ }}`` binding: what ``flowkernel.core.node.bindable`` lets stand for any value.
BINDING_SCHEMA: dict[str, Any] = {"type": "string", "pattern": r"\{\{",
                                  "description": "A {{ }} binding: its value is known when the node runs."}

# Keywords whose values are data, not subschemas: a "$ref" inside them is not a reference.
_DATA_KEYWORDS = frozenset({"const", "enum", "examples", "default"})
# Keywords whose values map names (which may be any word, "const" included) to subschemas.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _refuse(uri: str) -> Any:
    from referencing.exceptions import NoSuchResource

    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class: ref is its field


def _registry() -> Any:
    from referencing import Registry

    return Registry(retrieve=_refuse)  # type: ignore[call-arg]


def validator(schema: dict[str, Any]) -> Validator:
    """A Draft 2020-12 validator for ``schema`` that resolves references only within it and matches its
    patterns within a deadline. Every JSON Schema flowkernel applies goes through here."""
    made: Validator = _bounded_validator_class()(schema, registry=_registry())
    return made


def instance_errors(schema: dict[str, Any], instance: Any, *, schema_at: str = "schema") -> list[tuple[str, str]]:
    """``(where, message)`` for each way ``instance`` fails ``schema``; ``where`` is a JSON path
    below the instance (``""`` for the instance itself, else ``.a[0]``), errors sorted by it.

    Raises ``PatternTimeoutError`` when matching one of the schema's patterns runs past the time limit
    (``schema_at`` names the schema in its message, e.g. ``$.inputs``), ``EvaluationCancelled`` when
    this thread's scope is cancelled or its deadline passes."""
    from jsonschema.exceptions import SchemaError, UnknownType
    from referencing.exceptions import Unresolvable

    check = _Check()
    previous, _active.check = _active.check, check
    try:
        found = []
        for err in validator(schema).iter_errors(instance):
            if check.ran_out is not None:
                break
            found.append(err)
    except Unresolvable as exc:  # a schema stored before references were checked, or made by a binding
        return [("", f"the schema's $ref {_ref_text(exc)} does not resolve within the schema")]
    except (SchemaError, UnknownType) as exc:
        return [("", f"the schema is not a valid JSON Schema: {exc}")]
    finally:
        _active.check = previous
    if check.ran_out is not None:
        raise check.timeout_error(check.ran_out, schema_at)
    out = []
    for err in sorted(found, key=lambda e: [str(p) for p in e.absolute_path]):
        out.append((_path(err.absolute_path), err.message))
    return out


def _path(parts: Any) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


# -- patterns matched within a deadline ------------------------------------------------------------


class _Check:
    """One validation: its deadline, its scope's cancellation, and the first pattern that ran out."""

    __slots__ = ("bound", "limits", "ran_out", "scope", "stops_caller")

    def __init__(self) -> None:
        from flowkernel.core.bounded_regex import Bound
        from flowkernel.core.expression_scope import given_scope, limits_from_env

        scope = given_scope()
        if scope is None:
            self.limits: ExpressionLimits = limits_from_env()
        else:
            self.limits = scope.limits
        until = time.monotonic() + self.limits.timeout_ms / 1000
        # A caller's deadline (a node's timeoutMs) that comes first is the caller's timeout, not the schema's.
        self.stops_caller = scope is not None and scope.deadline is not None and scope.deadline < until
        if self.stops_caller:
            until = scope.deadline  # type: ignore[union-attr,assignment]  # checked above
        self.scope: Scope | None = scope
        self.bound: Bound = Bound(until, (lambda: scope.cancelled) if scope is not None else (lambda: False))
        self.ran_out: ValidationError | None = None

    def timeout_error(self, err: ValidationError, schema_at: str) -> PatternTimeoutError:
        where = _path(err.absolute_path)
        keyword = schema_at + _path(err.absolute_schema_path)
        pattern = str(getattr(err, "pattern", ""))
        shown = pattern if len(pattern) <= 80 else pattern[:80] + "…"
        return PatternTimeoutError(where, keyword, f"matching the pattern {shown!r} of {keyword} ran past the "
                                   f"{self.limits.timeout_ms} ms limit (FLOWKERNEL_EXPR_TIMEOUT_MS): the pattern "
                                   "backtracks too much for this value")


class _Active(threading.local):
    check: _Check | None = None


_active = _Active()


class _BoundedRe:
    """What jsonschema's pattern keywords call as ``re``: ``search``, within this validation's deadline."""

    @staticmethod
    def search(pattern: str, string: str) -> Any:
        import regex
        from flowkernel.core.bounded_regex import RegexTimeout, compile_pattern, search
        from jsonschema.exceptions import SchemaError

        check = _active.check or _Check()
        try:
            compiled = compile_pattern(pattern)
        except regex.error as exc:
            raise SchemaError(f"the pattern {pattern!r} is not a regular expression: {exc}") from None
        try:
            return search(compiled, string, check.bound)
        except RegexTimeout:
            if check.stops_caller:
                from flowkernel.core.expression_scope import EvaluationCancelled

                raise EvaluationCancelled from None
            raise


def _rebound(function: Any, namespace: dict[str, Any]) -> Any:
    """jsonschema's own ``function``, reading its globals from ``namespace`` (where ``re`` is ``_BoundedRe``)."""
    copy = types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__,
                              function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    return copy


def _reporting(keyword: Any) -> Any:
    """``keyword`` yielding a pattern that ran out as a validation error (so it gets the JSON paths of
    the value and of the keyword), noted as this validation's first when it is."""
    from flowkernel.core.bounded_regex import RegexTimeout
    from jsonschema.exceptions import ValidationError

    def checked(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        try:
            yield from keyword(validator, value, instance, schema)
        except RegexTimeout as out:
            on_key = isinstance(instance, dict) and out.subject in instance
            err = ValidationError(f"matching the pattern {out.pattern!r} ran past its time limit",
                                  path=[out.subject] if on_key else [])
            err.pattern = out.pattern  # type: ignore[attr-defined]
            check = _active.check
            if check is not None and check.ran_out is None:
                check.ran_out = err
            yield err

    return checked


_PATTERN_KEYWORDS = ("pattern", "patternProperties", "additionalProperties", "unevaluatedProperties")
_PATTERN_HELPERS = ("find_additional_properties", "find_evaluated_property_keys_by_schema")


@cache
def _bounded_validator_class() -> Any:
    """Draft 2020-12 with its pattern keywords matching through ``_BoundedRe``: jsonschema's own code for
    each (so their meaning is exactly jsonschema's), with ``re`` swapped in the globals it reads."""
    import jsonschema
    from jsonschema import _utils

    utils_namespace = {**vars(_utils), "re": _BoundedRe}
    for name in _PATTERN_HELPERS:
        utils_namespace[name] = _rebound(getattr(_utils, name), utils_namespace)
    keywords = {}
    base = jsonschema.Draft202012Validator
    for name in _PATTERN_KEYWORDS:
        original = base.VALIDATORS[name]
        namespace = {**original.__globals__, "re": _BoundedRe,
                     **{h: utils_namespace[h] for h in _PATTERN_HELPERS if h in original.__globals__}}
        keywords[name] = _reporting(_rebound(original, namespace))
    return jsonschema.validators.extend(base, keywords)  # type: ignore[no-untyped-call]


def _ref_text(exc: Exception) -> str:
    ref = getattr(exc, "ref", None)
    return repr(ref) if ref is not None else str(exc)


def check_schema(schema: Any, path: str, problems: list[Problem]) -> None:
    """Add a problem at ``path`` unless ``schema`` is a valid JSON Schema object whose every ``$ref``
    resolves within it."""
    if not isinstance(schema, dict):
        problems.append(Problem(path, "must be a JSON Schema object"))
        return
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.absolute_path)
        problems.append(Problem(path + where, f"not a valid JSON Schema: {exc.message}"))
        return
    _check_refs(schema, path, problems)


def _check_refs(schema: dict[str, Any], path: str, problems: list[Problem]) -> None:
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    root = DRAFT202012.create_resource(schema)
    root_uri: str = schema["$id"] if isinstance(schema.get("$id"), str) else ""
    registry = _registry().with_resource(root_uri, root).crawl()
    todo: list[tuple[Any, str, str]] = [(schema, path, root_uri)]
    while todo:
        node, where, base = todo.pop()
        if isinstance(node, list):
            todo.extend((v, f"{where}[{i}]", base) for i, v in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("$id"), str):
            base = urljoin(base, node["$id"])
        for key in ("$ref", "$dynamicRef"):
            ref = node.get(key)
            if not isinstance(ref, str):
                continue
            try:
                registry.resolver(base_uri=base).lookup(ref)
            except Unresolvable:
                problems.append(Problem(f"{where}.{key}", f"{ref!r} does not resolve within this schema: a "
                                        "$ref may only point inside it (#/$defs/…); flowkernel never fetches "
                                        "a URL or reads a file for a schema"))
        for key, value in node.items():
            if key in _SCHEMA_MAPS and isinstance(value, dict):  # names -> subschemas
                todo.extend((v, f"{where}.{key}.{name}", base) for name, v in value.items())
            elif key not in _DATA_KEYWORDS and isinstance(value, (dict, list)):
                todo.append((value, f"{where}.{key}", base))


def input_problems(schema: dict[str, Any], instance: Any, path: str) -> list[Problem]:
    """Where ``instance`` (a node's input as written) fails a node type's ``input_schema``, one problem
    per way, at its JSON path below ``path``, said as the flow's author would fix it."""
    from jsonschema.exceptions import SchemaError, UnknownType
    from referencing.exceptions import Unresolvable

    try:
        errors = list(_input_validator(schema).iter_errors(instance))
    except (SchemaError, UnknownType, Unresolvable) as exc:  # the node type's bug, not the flow's
        return [Problem(path, f"the node type's input_schema is not usable: {type(exc).__name__}: {exc}")]
    problems: list[Problem] = []
    for err in sorted(errors, key=lambda e: [str(p) for p in e.absolute_path]):
        problems.extend(_described(err, path))
    return problems


_VALIDATORS: dict[int, tuple[dict[str, Any], Validator]] = {}  # by id(): node types' schemas live as long


def _input_validator(schema: dict[str, Any]) -> Validator:
    cached = _VALIDATORS.get(id(schema))
    if cached is None or cached[0] is not schema:
        cached = _VALIDATORS[id(schema)] = (schema, validator(schema))
    return cached[1]


def _where(path: str, parts: Any) -> str:
    return path + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _described(err: Any, path: str) -> list[Problem]:
    from jsonschema.exceptions import best_match

    where = _where(path, err.absolute_path)
    if err.validator in ("anyOf", "oneOf") and err.context:
        branches = err.validator_value if isinstance(err.validator_value, list) else []
        if branches and all(set(b) == {"required"} for b in branches if isinstance(b, dict)):
            names = " or ".join(f"`{k}`" for b in branches for k in b["required"])
            return [Problem(where, f"needs {names}")]
        binding = next((i for i, b in enumerate(branches) if b == BINDING_SCHEMA), None)
        others = [e for e in err.context if binding is None or e.relative_schema_path[0] != binding]
        if others:
            inner = _described(best_match(others), path)
            if binding is not None:
                return [Problem(p.path, f"{p.message} (or a {{{{ }}}} binding)") for p in inner]
            return inner
    if err.validator == "required":
        missing = [k for k in err.validator_value if isinstance(err.instance, dict) and k not in err.instance]
        return [Problem(f"{where}.{k}", "is required") for k in missing] or [Problem(where, err.message)]
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        import difflib

        known = sorted(err.schema.get("properties", {}))
        out = []
        for key in sorted(set(err.instance) - set(known)):
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known) or 'none'}"
            out.append(Problem(f"{where}.{key}", f"unknown key; {hint}"))
        if out:
            return out
    message = err.message if len(err.message) <= 300 else err.message[:300] + "…"  # it quotes the value
    return [Problem(where, message)]
