"""Tools a ``claude.agent`` node can call: definitions, input schemas and invocation.

A tool is a Python function (sync or async). Its input JSON Schema comes from its type hints, or,
when it takes one parameter annotated with a pydantic model, from that model::

    @tool()
    def add(a: int, b: int = 0) -> int:
        \"\"\"Add two numbers.\"\"\"
        return a + b

    registry.register_tool(add)            # or @register_tool above @tool(), register_tool("add", add),
                                           # or the ``flowkernel.tools`` entry-point group

A plain function registered without ``@tool`` is wrapped on first use. ``ask_human`` is built in:
the node handles it itself (the node run waits for a ``reply``), so it is never invoked here.

A parameter annotated ``ToolContext`` (any name; ``ctx`` by custom) is not part of the input: it
receives the call's context, whose ``idempotency_key`` is the same each time the same tool call runs
(a call cut short by a crash runs again on resume with the key it had), so a tool with a side effect
can do it once::

    @tool()
    def pay(invoice: str, ctx: ToolContext) -> str:
        return payments.charge(invoice, idempotency_key=ctx.idempotency_key)
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints, overload

import anyio.to_thread
import pydantic
from flowkernel.errors import InvalidInputError

ASK_HUMAN = "ask_human"
# The result of a tool call that a crash or a pause cut short: stored with status ``error``, and what
# the model is told (the call is not run again: a tool may have done half of something).
INTERRUPTED_RESULT = ("the tool call was interrupted (a crash, a pause or a new pass of the node) before it "
                      "finished; it was not run again")

ASK_HUMAN_DEFINITION: dict[str, Any] = {
    "name": ASK_HUMAN,
    "description": "Ask the human operator a question and wait for their answer. Use it when you "
                   "need a decision or information only a person can give.",
    "input_schema": {
        "type": "object",
        "properties": {"question": {"type": "string", "description": "The question, self-contained."}},
        "required": ["question"],
    },
}

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool may know of the call it serves. ``idempotency_key``: ``<node run id>:<tool use id>``,
    the node run that received the tool call from the model and the call's id; it does not change
    across resumes, so a side effect keyed by it is done once however often the call runs."""

    idempotency_key: str
    tool_use_id: str
    node_id: str
    run_id: str  # the flow run


class ToolInputError(Exception):
    """The model called a tool with input that does not match its schema."""


@dataclass(frozen=True, slots=True)
class Tool:
    """A callable with the name, description and input schema the model sees."""

    name: str
    description: str
    input_schema: dict[str, Any]
    fn: Callable[..., Any]
    # The pydantic model that validates the input (and, with ``model_param``, is passed whole).
    _validator: type[pydantic.BaseModel] | None = field(default=None, repr=False)
    model_param: str | None = None
    context_param: str | None = None  # the parameter that receives the call's ``ToolContext``

    def definition(self) -> dict[str, Any]:
        """The entry of the Messages API ``tools`` list."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}

    async def call(self, tool_input: dict[str, Any], context: ToolContext | None = None) -> Any:
        """Validate ``tool_input`` and call the function (with ``context`` if it takes one). Sync
        functions run in a worker thread so that several tools from one message really run concurrently."""
        kwargs = self._arguments(tool_input)
        if self.context_param is not None:
            kwargs[self.context_param] = context
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**kwargs)
        result = await anyio.to_thread.run_sync(lambda: self.fn(**kwargs))
        if inspect.isawaitable(result):
            result = await result
        return result

    def _arguments(self, tool_input: dict[str, Any]) -> dict[str, Any]:
        if self._validator is None:
            return dict(tool_input)
        try:
            model = self._validator.model_validate(tool_input)
        except pydantic.ValidationError as exc:
            raise ToolInputError(f"invalid input for tool {self.name!r}: {exc}") from None
        if self.model_param is not None:
            return {self.model_param: model}
        return {name: getattr(model, name) for name in type(model).model_fields}


def _describe(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn)
    return doc.strip() if doc else f"The {getattr(fn, '__name__', 'tool')} tool."


def make_tool(fn: Callable[..., Any], *, name: str | None = None, description: str | None = None) -> Tool:
    """Build a ``Tool`` from a function, deriving its input schema from the signature."""
    tool_name = name or getattr(fn, "__name__", None)
    if not tool_name:
        raise InvalidInputError(f"tool {fn!r} needs a name")
    sig = inspect.signature(fn)
    try:
        hints = get_type_hints(fn)
    except Exception:
        hints = {}
    context = next((n for n, ann in hints.items() if ann is ToolContext and n in sig.parameters), None)
    params = [p for p in sig.parameters.values() if p.name != context
              and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    # One parameter typed with a pydantic model: that model is the input, passed whole.
    if len(params) == 1:
        ann = hints.get(params[0].name)
        if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
            return Tool(tool_name, description or _describe(fn), ann.model_json_schema(), fn, ann, params[0].name,
                        context)
    fields: dict[str, Any] = {}
    for p in params:
        ann = hints.get(p.name, Any)
        fields[p.name] = (ann, ... if p.default is inspect.Parameter.empty else p.default)
    model = pydantic.create_model(f"{tool_name}_input", **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)  # pydantic's generated titles are noise for the model
    return Tool(tool_name, description or _describe(fn), schema, fn, model, context_param=context)


@overload
def tool(fn: F, /) -> Tool: ...
@overload
def tool(*, name: str | None = None, description: str | None = None) -> Callable[[F], Tool]: ...


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
         description: str | None = None) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Decorator: ``@tool`` or ``@tool(name=..., description=...)`` turns a function into a ``Tool``."""
    if fn is not None:
        return make_tool(fn)

    def deco(f: Callable[..., Any]) -> Tool:
        return make_tool(f, name=name, description=description)
    return deco


def as_tool(name: str, entry: Any) -> Tool:
    """Normalise a registry entry (a ``Tool`` or a plain function) into a ``Tool`` named ``name``."""
    if isinstance(entry, Tool):
        return entry if entry.name == name else Tool(name, entry.description, entry.input_schema, entry.fn,
                                                     entry._validator, entry.model_param, entry.context_param)
    if callable(entry):
        return make_tool(entry, name=name)
    raise InvalidInputError(f"tool {name!r} is {type(entry).__name__}, not a function or kernel.tools.Tool")


def result_text(value: Any) -> str:
    """What a tool's return value looks like to the model: text as is, anything else as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def truncate(text: str, limit_bytes: int) -> str:
    """Cut ``text`` to at most ``limit_bytes`` of UTF-8 plus a marker saying how much was dropped."""
    data = text.encode("utf-8")
    if limit_bytes <= 0 or len(data) <= limit_bytes:
        return text
    kept = data[:limit_bytes].decode("utf-8", errors="ignore")
    return f"{kept}\n[flowkernel: tool result truncated: {limit_bytes} of {len(data)} bytes shown]"
