"""What a flow may name besides its own nodes, and the registry as the core sees it (``Registered``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class KnownNames:
    """What a flow may name besides its own nodes: registered functions and tools."""

    functions: Collection[str]
    tools: Collection[str]


class Registered(Protocol):
    """The node types, functions and tools available to runs, by name (``flowkernel.plugins.registry.Registry``
    is one): what the compiler, the validation cache and node contexts read."""

    @property
    def node_types(self) -> Mapping[str, Any]: ...

    @property
    def functions(self) -> Mapping[str, Any]: ...

    @property
    def tools(self) -> Mapping[str, Any]: ...
