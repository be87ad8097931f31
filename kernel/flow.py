"""The flow file as users write it: pydantic models, their JSON Schema, and loading from disk."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from flowkernel.errors import FlowValidationError, Problem
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

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

# Checked structurally by the compiler (flowkernel.expressions.parse_when), which reports JSON paths.
When = Annotated[Any, WithJsonSchema({"x-when": True})]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class RetryPolicy(_Model):
    maxAttempts: int = Field(1, ge=1, description="Attempts in all, the first included.")
    backoffMs: int = Field(0, ge=0, description="Wait before attempt n+1 is backoffMs * 2**(n-1).")


class Policy(_Model):
    retry: RetryPolicy | None = None
    timeoutMs: int | None = Field(None, gt=0, description="Cancel an attempt after this long.")
    continueOnError: bool = False


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
    id: str | None = None
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

    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, frozen=True,
    )

    name: str = Field(min_length=1)
    version: int | str | None = None
    description: str | None = None
    inputs: dict[str, Any] | None = Field(None, description="JSON Schema the run input must satisfy.")
    state: StateSpec = Field(default_factory=lambda: StateSpec())
    maxConcurrency: int = Field(8, ge=1)
    maxConcurrentRuns: int | None = Field(None, ge=1, description=(
        "At most this many runs of this flow execute at once across all workers; the rest wait queued."))
    nodes: list[Node]
    edges: list[Edge] = Field(default_factory=list)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of flow files, for editors."""
    schema: dict[str, Any] = _point_to_when(Flow.model_json_schema(by_alias=True))
    schema.setdefault("$defs", {})["When"] = _WHEN_SCHEMA
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "flowkernel flow"
    return schema


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


def parse_flow(data: Any, source: str) -> Flow:
    """Validate the shape of a flow document; every problem is reported with its JSON path."""
    if not isinstance(data, dict):
        raise FlowValidationError(source, [Problem("$", "a flow must be a JSON object")])
    try:
        return Flow.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            problems.append(Problem(json_path(tuple(err["loc"])), msg))
        raise FlowValidationError(source, problems) from None
