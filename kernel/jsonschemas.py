"""The JSON Schemas a flow carries (``inputs``, a ``human.input`` reply schema, an agent's
``outputSchema``): checked when the flow is loaded, applied without ever fetching anything.

A ``$ref`` resolves only inside the schema itself (``#/$defs/…``, or an ``$id`` the schema declares):
jsonschema's default would fetch ``http://…`` references (and ``file://`` ones), so a flow file could
make the kernel issue requests or read files. Every validator here is built on a registry whose
``retrieve`` refuses, and ``check_schema`` reports a ``$ref`` that does not resolve, with its path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

from flowkernel.errors import Problem

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

# A string holding a ``{{ }}`` binding: what ``flowkernel.node.bindable`` lets stand for any value.
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
    """A Draft 2020-12 validator for ``schema`` that resolves references only within it."""
    import jsonschema

    return jsonschema.Draft202012Validator(schema, registry=_registry())


def instance_errors(schema: dict[str, Any], instance: Any) -> list[tuple[str, str]]:
    """``(where, message)`` for each way ``instance`` fails ``schema``; ``where`` is a JSON path
    below the instance (``""`` for the instance itself, else ``.a[0]``), errors sorted by it."""
    from jsonschema.exceptions import SchemaError, UnknownType
    from referencing.exceptions import Unresolvable

    try:
        errors = sorted(validator(schema).iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])
    except Unresolvable as exc:  # a schema stored before references were checked, or made by a binding
        return [("", f"the schema's $ref {_ref_text(exc)} does not resolve within the schema")]
    except (SchemaError, UnknownType) as exc:
        return [("", f"the schema is not a valid JSON Schema: {exc}")]
    out = []
    for err in errors:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        out.append((where, err.message))
    return out


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
