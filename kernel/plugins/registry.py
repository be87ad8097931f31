"""Registries of node types, python functions and tools.

The operator chooses what code runs, never the flow file: functions and tools come from installed
packages (entry-point groups ``flowkernel.functions``, ``flowkernel.tools``, ``flowkernel.nodes``),
from ``--plugin`` modules (also ``FLOWKERNEL_PLUGINS``), or from the Python API.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

from flowkernel.core.node import NodeType, takes_messages
from flowkernel.errors import InvalidInputError
from flowkernel.plugins.builtins import BUILTIN_AGENT_TYPES, BUILTIN_NODE_TYPES
from flowkernel.plugins.functions import Blocking as Blocking  # (documented here too)
from flowkernel.plugins.functions import blocking as blocking  # ``flowkernel.registry.blocking`` in the docs
from flowkernel.plugins.lazy import LazyMap

log = logging.getLogger("flowkernel.plugins")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class Registry:
    """Node types, functions and tools available to runs."""

    def __init__(self) -> None:
        # One scan of the entry points fills all three maps, under one lock: a thread that misses in
        # one of them while another thread scans waits for the scan rather than find it marked done
        # and the entries not there yet.
        self._loading = threading.RLock()
        self.node_types: LazyMap[NodeType] = LazyMap(self._load_entry_points, lock=self._loading)
        self.functions: LazyMap[Callable[..., Any]] = LazyMap(self._load_entry_points, lock=self._loading)
        self.tools: LazyMap[Any] = LazyMap(self._load_entry_points, lock=self._loading)
        self._entry_points_loaded = False

    def _load_entry_points(self) -> None:
        # Marked before it runs, so a lookup the scan itself makes (same thread) does not start another.
        with self._loading:
            if not self._entry_points_loaded:
                self._entry_points_loaded = True
                _load_entry_points(self)

    # -- registration: one form for each of functions, tools and node types -------------------
    #
    #   @registry.register_function                 def f(...)    under its own name
    #   @registry.register_function("name")         def f(...)    under "name" (also name="name")
    #   registry.register_function(f)  /  registry.register_function("name", f)
    #
    # and the same for register_tool (a function or a flowkernel.agents.tools.Tool; description= too) and
    # register_node_type (a class or an instance; its ``name`` unless one is given). The decorator
    # forms return what they decorate, unchanged. add_function, add_tool and add_node_type are the
    # plain forms underneath, with every argument explicit.

    @overload
    def register_function(self, fn: F, /) -> F: ...
    @overload
    def register_function(self, key: str, fn: F, /) -> F: ...
    @overload
    def register_function(self, key: str | None = None, /) -> Callable[[F], F]: ...
    @overload
    def register_function(self, *, name: str) -> Callable[[F], F]: ...

    def register_function(self, *args: Any, name: str | None = None) -> Any:
        """Register a function for ``python`` nodes: a decorator (with or without a name) or a plain call."""
        return _register("register_function", args, name,
                         lambda key, fn: self.add_function(key or _own_name(fn, "function"), fn))

    @overload
    def register_tool(self, tool: F, /) -> F: ...
    @overload
    def register_tool(self, key: str, tool: T, /, *, description: str | None = None) -> T: ...
    @overload
    def register_tool(self, tool: T, /, *, description: str | None = None) -> T: ...
    @overload
    def register_tool(self, key: str | None = None, /, *, description: str | None = None) -> Callable[[T], T]: ...
    @overload
    def register_tool(self, *, name: str, description: str | None = None) -> Callable[[T], T]: ...

    def register_tool(self, *args: Any, name: str | None = None, description: str | None = None) -> Any:
        """Register a tool for ``claude.agent`` nodes (a function, or a ``Tool`` made with ``@tool``):
        a decorator (with or without a name) or a plain call. ``description`` overrides the docstring."""
        def add(key: str | None, entry: Any) -> None:
            if key is None:  # a Tool carries its name; a function's is its own
                own = getattr(entry, "name", None)
                key = own if isinstance(own, str) and not callable(entry) else _own_name(entry, "tool")
            if description is not None:
                from flowkernel.agents.tools import as_tool, make_tool  # pydantic: only when asked for

                entry = make_tool(as_tool(key, entry).fn, name=key, description=description)
            self.add_tool(key, entry)
        return _register("register_tool", args, name, add)

    @overload
    def register_node_type(self, node_type: T, /) -> T: ...
    @overload
    def register_node_type(self, key: str, node_type: T, /) -> T: ...
    @overload
    def register_node_type(self, key: str | None = None, /) -> Callable[[T], T]: ...
    @overload
    def register_node_type(self, *, name: str) -> Callable[[T], T]: ...

    def register_node_type(self, *args: Any, name: str | None = None) -> Any:
        """Register a node type (a class, instantiated once, or an instance): a decorator (with or without
        a name, which overrides the type's own ``name``) or a plain call."""
        return _register("register_node_type", args, name, self._add_named_node_type)

    def _add_named_node_type(self, name: str | None, node_type: Any) -> None:
        instance = node_type() if isinstance(node_type, type) else node_type
        if name is not None:
            try:
                instance.name = name
            except AttributeError:
                raise InvalidInputError(f"node type {node_type!r}: cannot set its name to {name!r}") from None
        self.add_node_type(instance)

    def add_node_type(self, node_type: NodeType | type[Any]) -> None:
        """Register a node type under its ``name``; a class is instantiated once."""
        instance = node_type() if isinstance(node_type, type) else node_type
        if not isinstance(instance, NodeType) or not isinstance(getattr(instance, "name", None), str):
            raise InvalidInputError(f"{node_type!r} is not a node type (needs a `name` string and `async run(ctx)`)")
        self.node_types[instance.name] = instance

    def records_agent_runs(self, type_name: str) -> bool:
        """Whether nodes of type ``type_name`` record agent runs (the node type's ``records_agent_runs``,
        ``flowkernel.core.node.RecordsAgentRuns``). A built-in type not imported yet is answered from the
        built-in table, without importing it: a command on a run need not load its agent's code."""
        node_type = self.node_types.loaded(type_name)
        if node_type is None and self.node_types.lazy(type_name):
            return type_name in BUILTIN_AGENT_TYPES
        if node_type is None:
            node_type = self.node_types.get(type_name)
        return bool(getattr(node_type, "records_agent_runs", False))

    def agent_max_steps(self, type_name: str, node_input: Any) -> int | None:
        """The step budget a node run of ``type_name`` with ``node_input`` has (its ``max_steps``), if any."""
        max_steps = getattr(self.node_types.get(type_name), "max_steps", None)
        return max_steps(node_input) if max_steps is not None else None

    def takes_messages(self, type_name: str, raw_input: Any) -> bool:
        """Whether a node of type ``type_name`` with ``raw_input`` reads ``send`` messages (see
        ``flowkernel.core.node.takes_messages``). A type this process has not registered (a plugin it did not
        load) is not refused for it: only the type can tell."""
        node_type = self.node_types.get(type_name)
        return True if node_type is None else takes_messages(node_type, raw_input, self)

    def add_function(self, name: str, fn: Callable[..., Any]) -> None:
        """Register ``fn`` for ``python`` nodes under ``name``."""
        if not callable(fn):
            raise InvalidInputError(f"function {name!r} is not callable")
        self.functions[name] = fn

    def add_tool(self, name: str, tool: Any) -> None:
        """Register a tool (a function or a ``flowkernel.agents.tools.Tool``) under ``name``."""
        if not callable(tool) and not callable(getattr(tool, "definition", None)):
            raise InvalidInputError(f"tool {name!r} is {type(tool).__name__}, not a function or flowkernel.agents.tools.Tool")
        self.tools[name] = tool

    def copy(self) -> Registry:
        other = Registry()
        other._entry_points_loaded = self._entry_points_loaded
        other.node_types = self.node_types.clone(other._load_entry_points, lock=other._loading)
        other.functions = self.functions.clone(other._load_entry_points, lock=other._loading)
        other.tools = self.tools.clone(other._load_entry_points, lock=other._loading)
        return other


_default: Registry | None = None
_loaded_plugins: set[str] = set()


def default_registry() -> Registry:
    """The process-wide registry: built-in node types, entry points and ``FLOWKERNEL_PLUGINS``."""
    global _default
    if _default is None:
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
                log.warning("skipping entry point %s:%s: %s", group, ep.name, exc)


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


def _own_name(obj: Any, what: str) -> str:
    name = getattr(obj, "__name__", None)
    if not isinstance(name, str) or name == "<lambda>":
        raise InvalidInputError(f"{what} {obj!r} has no name of its own; register it with a name")
    return name


def _register(api: str, args: tuple[Any, ...], name: str | None, add: Callable[[str | None, Any], None]) -> Any:
    """The decorator and plain-call forms of one ``register_*``, over ``add(name or None, target)``."""
    if len(args) > 2:
        raise InvalidInputError(f"{api} takes a name, a target, or both (name first); got {len(args)} arguments")
    first, second = (*args, None, None)[:2]
    if second is not None:  # register_x("name", target)
        if not isinstance(first, str) or name is not None:
            raise InvalidInputError(f"{api}(name, target): the name comes first, once")
        add(first, second)
        return second
    if first is None or isinstance(first, str):  # @register_x / @register_x("name") / @register_x(name=...)
        if first is not None and name is not None:
            raise InvalidInputError(f"{api}: give the name once")
        chosen = first if first is not None else name

        def decorate(target: Any) -> Any:
            add(chosen, target)
            return target
        return decorate
    add(name, first)  # @register_x on the target itself, or register_x(target)
    return first


# The process-wide forms: the same as the Registry methods, on ``default_registry()``.

@overload
def register_function(fn: F, /) -> F: ...
@overload
def register_function(key: str, fn: F, /) -> F: ...
@overload
def register_function(key: str | None = None, /) -> Callable[[F], F]: ...
@overload
def register_function(*, name: str) -> Callable[[F], F]: ...


def register_function(*args: Any, name: str | None = None) -> Any:
    """Register a function for ``python`` nodes in the default registry (see ``Registry.register_function``)."""
    registry: Any = default_registry()  # the overloads above are checked at the caller
    return registry.register_function(*args, name=name)


@overload
def register_tool(tool: F, /) -> F: ...
@overload
def register_tool(key: str, tool: T, /, *, description: str | None = None) -> T: ...
@overload
def register_tool(tool: T, /, *, description: str | None = None) -> T: ...
@overload
def register_tool(key: str | None = None, /, *, description: str | None = None) -> Callable[[T], T]: ...
@overload
def register_tool(*, name: str, description: str | None = None) -> Callable[[T], T]: ...


def register_tool(*args: Any, name: str | None = None, description: str | None = None) -> Any:
    """Register a tool in the default registry (see ``Registry.register_tool``)."""
    registry: Any = default_registry()  # the overloads above are checked at the caller
    return registry.register_tool(*args, name=name, description=description)


@overload
def register_node_type(node_type: T, /) -> T: ...
@overload
def register_node_type(key: str, node_type: T, /) -> T: ...
@overload
def register_node_type(key: str | None = None, /) -> Callable[[T], T]: ...
@overload
def register_node_type(*, name: str) -> Callable[[T], T]: ...


def register_node_type(*args: Any, name: str | None = None) -> Any:
    """Register a node type in the default registry (see ``Registry.register_node_type``)."""
    registry: Any = default_registry()  # the overloads above are checked at the caller
    return registry.register_node_type(*args, name=name)
