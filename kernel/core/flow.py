"""The flow file as users write it: pydantic models, their JSON Schema, and loading from disk."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from flowkernel.errors import FlowValidationError, Problem
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

_WHEN_SCHEMA: dict[str, Any] = {
    "description": "A JSONata string, or the structured form equals / not / and / or.",
    "anyOf": [
        {"type": "string"},
        {"type": "object", "required": ["equals"], "additionalProperties": False,
         "properties": {"equals": {"type": "object", "required": ["var", "value"],
                                   "additionalProperties": False,
                                   "properties": {"var": {"type": "string"}, "value": {}}}}},
        {"type": "object", "required": ["not"], "additionalProperties": False,
         "properties": {"not": {"$ref": "#/$defs/When"}}},
        {"type": "object", "required": ["and"], "additionalProperties": False,
         "properties": {"and": {"type": "array", "items": {"$ref": "#/$defs/When"}}}},
        {"type": "object", "required": ["or"], "additionalProperties": False,
         "properties": {"or": {"type": "array", "items": {"$ref": "#/$defs/When"}}}},
    ],
}

# Checked structurally by the compiler (flowkernel.core.expressions.parse_when), which reports JSON paths.
When = Annotated[Any, WithJsonSchema({"x-when": True})]


def _version(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("must be an integer or a string")
    return value


# Not a union: pydantic would report a bad value once per member, at paths such as `version.int`.
Version = Annotated[Any, AfterValidator(_version), WithJsonSchema({"type": ["integer", "string"]})]


class _Model(BaseModel):
    # strict: the compiler reads the document as written, so "3" must not pass as an integer nor
    # "false" as a boolean (lax mode accepts both, and `bool("false")` is True).
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, strict=True)


class RetryPolicy(_Model):
    maxAttempts: int = Field(1, ge=1, description="Attempts in all, the first included.")
    backoffMs: int = Field(0, ge=0, description="Wait before attempt n+1 is backoffMs * 2**(n-1).")


class Policy(_Model):
    retry: RetryPolicy | None = None
    timeoutMs: int | None = Field(None, gt=0, description="Cancel an attempt after this long.")
    continueOnError: bool = False
    maxCostUsd: float | None = Field(None, gt=0, allow_inf_nan=False, description=(
        "Pause the run when this node's model calls in this run have cost this many US dollars "
        "(checked after each call; the agent stops at its next turn boundary)."))


class Budget(_Model):
    maxCostUsd: float = Field(gt=0, allow_inf_nan=False, description=(
        "Pause the run when its model calls (child runs included) have cost this many US dollars; "
        "`flowkernel resume RUN --budget USD` raises the limit and continues."))


class Node(_Model):
    id: str = Field(min_length=1)
    type: str = Field(min_length=1, description="A registered node type, e.g. transform.")
    input: dict[str, Any] = Field(default_factory=dict)
    when: When | None = None
    policy: Policy = Field(default_factory=lambda: Policy())
    ui: Any = Field(None, description="Ignored by the kernel; free for editors.")


class ForEach(_Model):
    in_: str = Field(alias="in", description="JSONata yielding a list, bare or wrapped in {{ }}.")
    as_: str = Field("item", alias="as", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class Edge(_Model):
    id: str | None = Field(None, min_length=1, description="Default: \"from->to\".")
    from_: str = Field(alias="from")
    to: str
    when: When | None = None
    gate: Literal["all", "any"] | None = None
    forEach: ForEach | None = None
    maxIterations: int | None = Field(None, ge=0, description="Makes this a loop edge.")

    @property
    def edge_id(self) -> str:
        return self.id if self.id is not None else f"{self.from_}->{self.to}"


class StateSpec(_Model):
    initial: dict[str, Any] = Field(default_factory=dict)
    schema_: dict[str, Any] | None = Field(None, alias="schema")


class Flow(_Model):
    """A flow file: nodes, edges, the input schema and the initial state."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, strict=True)

    schema_ref: str | None = Field(None, alias="$schema", description="For editors; ignored by the kernel.")
    name: str = Field(min_length=1)
    version: Version | None = None
    description: str | None = None
    inputs: dict[str, Any] | None = Field(None, description="JSON Schema the run input must satisfy.")
    state: StateSpec = Field(default_factory=lambda: StateSpec())
    maxConcurrency: int = Field(8, ge=1)
    maxConcurrentRuns: int | None = Field(None, ge=1, description=(
        "At most this many runs of this flow execute at once across all workers; the rest wait queued."))
    budget: Budget | None = Field(None, description="What the run may spend before it pauses and asks.")
    nodes: list[Node]
    edges: list[Edge] = Field(default_factory=list)


def json_schema(node_types: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON Schema of flow files, for editors. Given the registered ``node_types``, a node's ``type``
    must be one of them and its ``input`` must match that type's ``input_schema``: a ``oneOf`` with one
    branch per type, keyed by ``type``, so an editor flags ``state.sett`` or an agent without a prompt."""
    schema: dict[str, Any] = _point_to_when(Flow.model_json_schema(by_alias=True))
    defs = schema.setdefault("$defs", {})
    defs["When"] = _WHEN_SCHEMA
    if node_types is not None:
        _node_per_type(defs, node_types)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "flowkernel flow"
    return schema


def _node_per_type(defs: dict[str, Any], node_types: Mapping[str, Any]) -> None:
    from flowkernel.core.jsonschemas import validator

    node = defs["Node"]
    names = sorted(node_types)
    node["properties"]["type"] = {**node["properties"]["type"], "enum": names}
    branches = []
    for name in names:
        branch: dict[str, Any] = {"title": name, "properties": {"type": {"const": name}}}
        input_schema = node_types[name].input_schema if hasattr(node_types[name], "input_schema") else None
        if isinstance(input_schema, dict):
            key = f"input:{name}"
            defs[key] = {"title": f"{name} input", **input_schema}
            branch["properties"]["input"] = {"$ref": f"#/$defs/{key}"}
            if not validator(input_schema).is_valid({}):  # a node without `input` has the input {}
                branch["required"] = ["input"]
        branches.append(branch)
    node["oneOf"] = branches


def _point_to_when(value: Any) -> Any:
    # pydantic cannot reference a definition it did not generate; swap the marker for the $ref.
    if isinstance(value, dict):
        if value.get("x-when") is True:
            return {"$ref": "#/$defs/When"}
        return {k: _point_to_when(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_point_to_when(v) for v in value]
    return value


def json_path(loc: tuple[int | str, ...]) -> str:
    path = "$"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{_alias(part)}"
    return path


def _alias(name: str) -> str:
    return {"from_": "from", "in_": "in", "as_": "as", "schema_": "schema"}.get(name, name)


# Keys that belong elsewhere: a hint beats a bare "unknown key".
_MISPLACED: dict[str, dict[str, str]] = {
    "nodes": {
        "forEach": "forEach belongs on an edge: put it on the edge into this node, "
                   '{"from": ..., "to": "<this node>", "forEach": {"in": ..., "as": ...}}',
        "gate": 'gate belongs on the edges into this node: {"from": ..., "to": "<this node>", "gate": "any"}',
        "maxIterations": "maxIterations belongs on an edge: it makes that edge a loop edge",
        "retry": 'retry belongs in policy: "policy": {"retry": {...}}',
        "timeoutMs": 'timeoutMs belongs in policy: "policy": {"timeoutMs": ...}',
        "continueOnError": 'continueOnError belongs in policy: "policy": {"continueOnError": true}',
        "maxCostUsd": 'maxCostUsd belongs in policy: "policy": {"maxCostUsd": ...}',
        "budget": 'a node\'s budget is policy.maxCostUsd: "policy": {"maxCostUsd": ...}',
    },
    "edges": {
        "input": "input belongs on a node; an edge has id, from, to, when, gate, forEach and maxIterations",
        "policy": "policy belongs on a node; an edge has id, from, to, when, gate, forEach and maxIterations",
        "type": "type belongs on a node; an edge has id, from, to, when, gate, forEach and maxIterations",
    },
}


def _unknown_key(loc: tuple[int | str, ...], model: type[BaseModel]) -> str:
    key = loc[-1]
    if len(loc) == 3 and isinstance(loc[0], str) and isinstance(key, str) and key in _MISPLACED.get(loc[0], {}):
        return _MISPLACED[str(loc[0])][key]
    import difflib

    known = [f.alias or name for name, f in model.model_fields.items()]
    close = difflib.get_close_matches(str(key), known, n=1)
    return f"unknown key; did you mean {close[0]!r}?" if close else f"unknown key; known keys: {', '.join(known)}"


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel]:
    """The model whose key ``loc`` names (for the known keys of an unknown-key error)."""
    model: type[BaseModel] = Flow
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        inner = _model_of(field.annotation) if field is not None else None
        if inner is None:
            break
        model = inner
    return model


def _model_of(annotation: Any) -> type[BaseModel] | None:
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def parse_flow(data: Any, source: str) -> Flow:
    """Validate the shape of a flow document; every problem is reported with its JSON path."""
    if not isinstance(data, dict):
        raise FlowValidationError(source, [Problem("$", "a flow must be a JSON object")])
    try:
        return Flow.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            msg = (_unknown_key(loc, _model_at(loc)) if err["type"] == "extra_forbidden"
                   else err["msg"].removeprefix("Value error, "))
            problems.append(Problem(json_path(loc), msg))
        raise FlowValidationError(source, problems) from None
