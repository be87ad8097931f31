"""register_function, register_tool and register_node_type: each works as a decorator (bare, with a
name, with name=) and as a plain call (with or without a name), on a Registry and process-wide."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from flowkernel.agents.tools import Tool, as_tool, tool
from flowkernel.core.node_context import NodeContext
from flowkernel.errors import InvalidInputError
from flowkernel.plugins import registry as registry_module
from flowkernel.plugins.registry import Registry, default_registry
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore


@pytest.fixture
def fresh_default(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """The process-wide registry, replaced for this test only."""
    monkeypatch.setattr(registry_module, "_default", None)
    yield default_registry()


def run(reg: Registry, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    kernel = Kernel(MemoryStore(), registry=reg)
    snap = anyio.run(kernel.run, kernel.compile({"name": "reg", "nodes": nodes}), {})
    assert snap.status == "completed", snap.error
    return snap.outputs


class Echo:
    name = "test.echo"

    async def run(self, ctx: NodeContext) -> Any:
        return {"echo": ctx.input}


def _function_forms(register: Any) -> dict[str, Callable[..., Any]]:
    """Register one function per form; returns what each form gave back, by the name it should have."""
    got: dict[str, Callable[..., Any]] = {}

    @register
    def bare(x: int) -> int:
        return x + 1
    got["bare"] = bare

    @register()
    def empty_call(x: int) -> int:
        return x + 2
    got["empty_call"] = empty_call

    @register("named.positional")
    def f3(x: int) -> int:
        return x + 3
    got["named.positional"] = f3

    @register(name="named.keyword")
    def f4(x: int) -> int:
        return x + 4
    got["named.keyword"] = f4

    def plain(x: int) -> int:
        return x + 5
    got["plain"] = register(plain)

    got["plain.named"] = register("plain.named", lambda x: x + 6)
    return got


@pytest.mark.parametrize("where", ["registry", "process-wide"])
def test_register_function_every_form(where: str, fresh_default: Registry) -> None:
    reg = fresh_default.copy() if where == "registry" else fresh_default
    register = reg.register_function if where == "registry" else registry_module.register_function
    got = _function_forms(register)
    assert all(reg.functions[name] is fn for name, fn in got.items())  # decorators return the function itself
    assert got["bare"](1) == 2  # still callable as before
    outputs = run(reg, [{"id": f"n{i}", "type": "python", "input": {"function": name, "args": {"x": 10}}}
                        for i, name in enumerate(got)])
    assert [outputs[f"n{i}"] for i in range(len(got))] == [11, 12, 13, 14, 15, 16]


@pytest.mark.parametrize("where", ["registry", "process-wide"])
def test_register_tool_every_form(where: str, fresh_default: Registry) -> None:
    reg = fresh_default.copy() if where == "registry" else fresh_default
    register = reg.register_tool if where == "registry" else registry_module.register_tool

    @register
    def lookup(topic: str) -> str:
        """Look a topic up."""
        return topic

    @register("search")
    def find(q: str) -> str:
        """Search."""
        return q

    @register(name="fetch", description="Fetch a page by URL.")
    def get(url: str) -> str:
        return url

    @register
    @tool(name="made")
    def made_with_tool(a: int) -> int:
        """Made with @tool."""
        return a

    def plain(a: int) -> int:
        """Plain."""
        return a
    assert register(plain) is plain
    assert register("plain.named", plain) is plain

    assert callable(lookup) and lookup("x") == "x"  # the decorator leaves the function as it was
    assert isinstance(made_with_tool, Tool)
    assert set(reg.tools) >= {"lookup", "search", "fetch", "made", "plain", "plain.named"}
    definitions = {name: as_tool(name, reg.tools[name]).definition() for name in
                   ("lookup", "search", "fetch", "made", "plain.named")}
    assert definitions["lookup"]["description"] == "Look a topic up."
    assert definitions["search"]["name"] == "search" and definitions["search"]["input_schema"]["required"] == ["q"]
    assert definitions["fetch"]["description"] == "Fetch a page by URL."
    assert definitions["made"]["description"] == "Made with @tool."
    assert definitions["plain.named"]["name"] == "plain.named"


@pytest.mark.parametrize("where", ["registry", "process-wide"])
def test_register_node_type_every_form(where: str, fresh_default: Registry) -> None:
    reg = fresh_default.copy() if where == "registry" else fresh_default
    register = reg.register_node_type if where == "registry" else registry_module.register_node_type

    @register
    class Bare(Echo):
        name = "test.bare"

    @register("test.named")
    class Named(Echo):
        pass

    @register(name="test.keyword")
    class Keyword(Echo):
        pass

    assert register(Echo) is Echo  # a class: instantiated once, under its own name
    instance = Echo()
    assert register("test.instance", instance) is instance
    assert isinstance(Bare, type) and isinstance(Named, type) and isinstance(Keyword, type)

    names = ["test.bare", "test.named", "test.keyword", "test.echo", "test.instance"]
    assert all(name in reg.node_types for name in names)
    outputs = run(reg, [{"id": f"n{i}", "type": name, "input": {"i": i}} for i, name in enumerate(names)])
    assert [outputs[f"n{i}"] for i in range(len(names))] == [{"echo": {"i": i}} for i in range(len(names))]


@pytest.mark.parametrize(("call", "message"), [
    (lambda r: r.register_function("a", "b", "c"), "takes a name, a target, or both"),
    (lambda r: r.register_function(lambda x: x), "has no name of its own"),
    (lambda r: r.register_function("x")(42), "is not callable"),
    (lambda r: r.register_function("x", name="y"), "give the name once"),
    (lambda r: r.register_tool("t", 42), "not a function or flowkernel.agents.tools.Tool"),
    (lambda r: r.register_node_type(object), "is not a node type"),
    (lambda r: r.register_node_type("x")(42), "cannot set its name"),
])
def test_registration_mistakes_are_reported_at_once(call: Callable[[Registry], Any], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        call(Registry())
