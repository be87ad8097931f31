"""Registries of node types, python functions and tools.

The operator chooses what code runs, never the flow file: functions and tools come from installed
packages (entry-point groups ``flowkernel.functions``, ``flowkernel.tools``, ``flowkernel.nodes``),
from ``--plugin`` modules (also ``FLOWKERNEL_PLUGINS``), or from the Python API.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from flowkernel.errors import InvalidInputError
from flowkernel.node import NodeType

F = TypeVar("F", bound=Callable[..., Any])


V = TypeVar("V")


class LazyMap(dict[str, V]):
    """A dict whose entries may be given as ``"module:attr"`` and imported on first use, and which
    asks ``on_miss`` (once) to load more entries before it says a name is unknown.

    Resuming a run should not import the anthropic SDK or scan every installed package when the
    flow only uses ``transform`` nodes: this is what keeps start-up cheap.
    """

    def __init__(self, on_miss: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._lazy: dict[str, tuple[str, bool]] = {}
        self._on_miss = on_miss

    def add_lazy(self, name: str, target: str, *, instantiate: bool = False) -> None:
        self._lazy[name] = (target, instantiate)

    def _resolve(self, name: str) -> V:
        target, instantiate = self._lazy.pop(name)
        module, _, attr = target.partition(":")
        value = getattr(importlib.import_module(module), attr)
        if instantiate:
            value = value()
        self[name] = value
        return value  # type: ignore[no-any-return]

    def _miss(self) -> None:
        if self._on_miss is not None:
            hook, self._on_miss = self._on_miss, None
            hook()

    def __missing__(self, key: str) -> V:
        if key not in self._lazy:
            self._miss()
        if key in self._lazy:
            return self._resolve(key)
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        if dict.__contains__(self, key) or key in self._lazy:
            return True
        self._miss()
        return dict.__contains__(self, key) or key in self._lazy

    def __iter__(self) -> Iterator[str]:
        self._miss()
        yield from list(dict.keys(self))
        yield from list(self._lazy)

    def __len__(self) -> int:
        return dict.__len__(self) + len(self._lazy)

    def keys(self) -> Any:
        return list(iter(self))

    def clone(self, on_miss: Callable[[], None] | None = None) -> LazyMap[V]:
        other: LazyMap[V] = LazyMap(on_miss)
        other.update(dict.items(self))
        other._lazy = dict(self._lazy)
        return other


class Registry:
    """Node types, functions and tools available to runs."""

    def __init__(self) -> None:
        self.node_types: LazyMap[NodeType] = LazyMap(self._load_entry_points)
        self.functions: LazyMap[Callable[..., Any]] = LazyMap(self._load_entry_points)
        self.tools: LazyMap[Any] = LazyMap(self._load_entry_points)
        self._entry_points_loaded = False

    def _load_entry_points(self) -> None:
        if not self._entry_points_loaded:
            self._entry_points_loaded = True
            _load_entry_points(self)

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
        other._entry_points_loaded = self._entry_points_loaded
        other.node_types = self.node_types.clone(other._load_entry_points)
        other.functions = self.functions.clone(other._load_entry_points)
        other.tools = self.tools.clone(other._load_entry_points)
        return other


_default: Registry | None = None
_loaded_plugins: set[str] = set()


def default_registry() -> Registry:
    """The process-wide registry: built-in node types, entry points and ``FLOWKERNEL_PLUGINS``."""
    global _default
    if _default is None:
        from flowkernel.nodes import BUILTIN_NODE_TYPES

        reg = Registry()
        for name, target in BUILTIN_NODE_TYPES.items():
            reg.node_types.add_lazy(name, target, instantiate=True)
        _default = reg
        load_plugins([p for p in os.environ.get("FLOWKERNEL_PLUGINS", "").split(",") if p.strip()])
    return _default


def _load_entry_points(reg: Registry) -> None:
    # Imported here: importlib.metadata costs ~20 ms at start-up, and runs of built-in node types
    # and registered functions never get here.
    from importlib.metadata import entry_points

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
