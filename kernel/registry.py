"""Registries of node types, python functions and tools.

The operator chooses what code runs, never the flow file: functions and tools come from installed
packages (entry-point groups ``flowkernel.functions``, ``flowkernel.tools``, ``flowkernel.nodes``),
from ``--plugin`` modules (also ``FLOWKERNEL_PLUGINS``), or from the Python API.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Any, TypeVar

from kernel.errors import InvalidInputError
from kernel.node import NodeType

F = TypeVar("F", bound=Callable[..., Any])


class Registry:
    """Node types, functions and tools available to runs."""

    def __init__(self) -> None:
        self.node_types: dict[str, NodeType] = {}
        self.functions: dict[str, Callable[..., Any]] = {}
        self.tools: dict[str, Any] = {}

    def add_node_type(self, node_type: NodeType | type[Any]) -> None:
        instance = node_type() if isinstance(node_type, type) else node_type
        if not isinstance(instance, NodeType):
            raise InvalidInputError(f"{node_type!r} is not a node type (needs `name` and `async run(ctx)`)")
        self.node_types[instance.name] = instance

    def add_function(self, name: str, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise InvalidInputError(f"function {name!r} is not callable")
        self.functions[name] = fn

    def function(self, name: str | None = None) -> Callable[[F], F]:
        """Decorator: ``@registry.function()`` registers under the function's own name."""
        def deco(fn: F) -> F:
            self.add_function(name or fn.__name__, fn)
            return fn
        return deco

    def add_tool(self, name: str, tool: Any) -> None:
        self.tools[name] = tool

    def copy(self) -> Registry:
        other = Registry()
        other.node_types = dict(self.node_types)
        other.functions = dict(self.functions)
        other.tools = dict(self.tools)
        return other


_default: Registry | None = None
_loaded_plugins: set[str] = set()


def _builtin_node_types() -> Iterable[NodeType]:
    from nodes import builtin_node_types

    return builtin_node_types()


def default_registry() -> Registry:
    """The process-wide registry: built-in node types, entry points and ``FLOWKERNEL_PLUGINS``."""
    global _default
    if _default is None:
        reg = Registry()
        for nt in _builtin_node_types():
            reg.add_node_type(nt)
        _load_entry_points(reg)
        _default = reg
        load_plugins([p for p in os.environ.get("FLOWKERNEL_PLUGINS", "").split(",") if p.strip()])
    return _default


def _load_entry_points(reg: Registry) -> None:
    for group, add in (("flowkernel.nodes", lambda n, v: reg.add_node_type(v)),
                       ("flowkernel.functions", reg.add_function),
                       ("flowkernel.tools", reg.add_tool)):
        for ep in entry_points(group=group):
            try:
                add(ep.name, ep.load())
            except Exception as exc:
                print(f"flowkernel: skipping entry point {group}:{ep.name}: {exc}", file=sys.stderr)


def load_plugins(modules: Iterable[str]) -> None:
    """Import plugin modules; they register through ``register_*`` below."""
    for mod in modules:
        mod = mod.strip()
        if not mod or mod in _loaded_plugins:
            continue
        try:
            importlib.import_module(mod)
        except Exception as exc:
            raise InvalidInputError(f"--plugin {mod}: cannot import: {exc}") from None
        _loaded_plugins.add(mod)


def register_function(name: str | None = None) -> Callable[[F], F]:
    """Decorator registering a function for ``python`` nodes in the default registry."""
    return default_registry().function(name)


def register_node_type(node_type: NodeType | type[Any]) -> None:
    default_registry().add_node_type(node_type)


def register_tool(name: str, tool: Any) -> None:
    default_registry().add_tool(name, tool)
