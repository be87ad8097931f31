"""Native structured output: ``outputSchema`` as the API's ``output_config.format``, or the fallback.

The API constrains the answer to a strict subset of JSON Schema: every object closed
(``additionalProperties: false``), a few string formats, ``minItems`` of 0 or 1, and none of the
other assertions (``minLength``, ``maximum``, ``pattern``, …). The ``anthropic`` SDK turns a schema
into that subset with ``transform_schema``, moving each assertion it drops into the description so
the model may still follow it; ``strict_schema`` below gives exactly what it gives (a test compares
them), without importing the SDK, which a run replaying fixtures never loads otherwise.

The answer is still validated against the user's own schema: the model is bound by the strict one
only, so an answer can pass it and fail a dropped assertion (handled like any mismatch: the model is
asked again, up to ``outputRetries``). A schema the subset cannot say without changing which answers
are right is not sent natively: an object with no ``properties`` (free-form: closing it would allow
only ``{}``), one whose ``additionalProperties`` or ``patternProperties`` admit more keys, a name in
``required`` that ``properties`` does not list, a ``type`` list, or a schema the transform refuses.
Those, and models without native structured output (``models.py``), get the schema as an instruction
in the system prompt.
"""

from __future__ import annotations

import json
from typing import Any

# The string formats the strict subset keeps (the SDK's ``SupportedStringFormats``).
STRING_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6",
                            "uuid"})
_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


class NotStrict(ValueError):
    """The schema cannot be said in the API's strict subset."""


def instruction(schema: dict[str, Any]) -> str:
    """The fallback: the system prompt's instruction to answer with JSON matching ``schema``."""
    return ("When you give your final answer, reply with only a JSON value, no other text, "
            "that matches this JSON Schema:\n" + json.dumps(schema, sort_keys=True))


def output_format(schema: dict[str, Any]) -> dict[str, Any] | None:
    """``output_config.format`` for ``schema``, or None when the strict subset cannot say it."""
    try:
        _check_open_objects(schema)
        strict = strict_schema(schema)
    except Exception:  # whatever the transform cannot take goes as the instruction, which takes any schema
        return None
    return {"type": "json_schema", "schema": strict}


def _check_open_objects(schema: Any) -> None:
    """Raise ``NotStrict`` where closing an object would change which answers are right."""
    if isinstance(schema, list):
        for item in schema:
            _check_open_objects(item)
        return
    if not isinstance(schema, dict):
        return
    if isinstance(schema.get("type"), list):
        raise NotStrict("a list of types")
    if schema.get("type") == "object":
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            raise NotStrict("an object without properties")
        extra = schema.get("additionalProperties", False)
        if extra is not False and "additionalProperties" in schema:
            raise NotStrict("additionalProperties")
        if schema.get("patternProperties"):
            raise NotStrict("patternProperties")
        missing = [n for n in schema.get("required") or [] if n not in properties]
        if missing:
            raise NotStrict(f"required names not in properties: {missing}")
    for key in ("properties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            for sub in schema[key].values():
                _check_open_objects(sub)
    for key in ("items", "anyOf", "oneOf", "allOf"):
        _check_open_objects(schema.get(key))


def _primitive(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` in the API's strict subset, as ``anthropic.transform_schema`` makes it; ``ValueError``
    for a schema with none of ``type``, ``anyOf``, ``oneOf``, ``allOf``, ``enum`` or ``const``."""
    strict: dict[str, Any] = {}
    rest = dict(schema)
    defs = rest.pop("$defs", None)
    if defs is not None:
        strict["$defs"] = {name: strict_schema(sub) for name, sub in defs.items()}
    ref = rest.pop("$ref", None)
    if ref is not None:
        strict["$ref"] = ref
        return strict
    kind = rest.pop("type", None)
    any_of, one_of, all_of = rest.pop("anyOf", None), rest.pop("oneOf", None), rest.pop("allOf", None)
    enum = rest.get("enum")
    if isinstance(enum, list) and enum and all(_primitive(v) for v in enum):
        strict["enum"] = list(rest.pop("enum"))
    if "const" in rest and _primitive(rest["const"]):
        strict["const"] = rest.pop("const")
    literal = "enum" in strict or "const" in strict
    if literal:
        kind = None
    if isinstance(any_of, list):
        strict["anyOf"] = [strict_schema(v) for v in any_of]
    elif isinstance(one_of, list):
        strict["anyOf"] = [strict_schema(v) for v in one_of]
    elif isinstance(all_of, list):
        strict["allOf"] = [strict_schema(v) for v in all_of]
    elif not literal:
        if kind is None:
            raise ValueError("Schema must have a 'type', 'anyOf', 'oneOf', or 'allOf' field, or a 'const' or "
                             "non-empty 'enum' of strings, numbers, booleans, or null.")
        strict["type"] = kind
    description = rest.pop("description", None)
    if description is not None:
        strict["description"] = description
    title = rest.pop("title", None)
    if title is not None:
        strict["title"] = title
    if kind == "object":
        strict["properties"] = {k: strict_schema(v) for k, v in rest.pop("properties", {}).items()}
        rest.pop("additionalProperties", None)
        strict["additionalProperties"] = False
        required = rest.pop("required", None)
        if required is not None:
            strict["required"] = list(required) if isinstance(required, list) else required
    elif kind == "string":
        fmt = rest.pop("format", None)
        if fmt and fmt in STRING_FORMATS:
            strict["format"] = fmt
        elif fmt:
            rest["format"] = fmt  # unsupported: described below, as the SDK does
    elif kind == "array":
        items = rest.pop("items", None)
        if items is not None:
            strict["items"] = strict_schema(items)
        min_items = rest.pop("minItems", None)
        if (min_items is not None and min_items == 0) or min_items == 1:  # (the SDK's test, exactly)
            strict["minItems"] = min_items
        elif min_items is not None:
            rest["minItems"] = min_items
    elif kind is not None and kind not in _TYPES:
        raise ValueError(f"unsupported type {kind!r}")
    if rest:  # what the subset cannot say, in the description, so the model may still follow it
        before = strict.get("description")
        strict["description"] = ((before + "\n\n" if before is not None else "")
                                 + "{" + ", ".join(f"{k}: {v}" for k, v in rest.items()) + "}")
    return strict
