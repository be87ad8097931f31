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
