"""flowkernel: a workflow-graph kernel for AI agents with snapshot-based resume.

The public API is importable from here (``from flowkernel import Kernel, register_tool``): each name is
imported from the module that defines it when it is first asked for (``_PUBLIC``), so ``import
flowkernel`` itself stays cheap and imports none of its modules.

``flowkernel.__version__`` is the installed distribution's version (pyproject's ``version``, read from
the package metadata on first use, so importing flowkernel does not pay for ``importlib.metadata``).

Module paths the README and docs named before the package had its folders (``_MOVED``) still import:
the module at its new home, under the old name, with a ``DeprecationWarning`` that names the new one.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from importlib.abc import Loader, MetaPathFinder

    from flowkernel.agents.tools import Tool as Tool
    from flowkernel.agents.tools import tool as tool
    from flowkernel.core import events as events
    from flowkernel.core.commands import Command as Command
    from flowkernel.core.compiler import CompiledFlow as CompiledFlow
    from flowkernel.core.expression_scope import ExpressionLimits as ExpressionLimits
    from flowkernel.core.names import KnownNames as KnownNames
    from flowkernel.core.node import INTERRUPTED as INTERRUPTED
    from flowkernel.core.node import Interrupted as Interrupted
    from flowkernel.core.node import NodeType as NodeType
    from flowkernel.core.node import WaitFor as WaitFor
    from flowkernel.core.node import bindable as bindable
    from flowkernel.core.node_context import ChildRuns as ChildRuns
    from flowkernel.core.node_context import NodeContext as NodeContext
    from flowkernel.core.reducer import fold as fold
    from flowkernel.core.services import NodeLimits as NodeLimits
    from flowkernel.core.services import RunServices as RunServices
    from flowkernel.core.snapshot import RunSnapshot as RunSnapshot
    from flowkernel.core.state_ops import get_path as get_path
    from flowkernel.errors import CommandRejectedError as CommandRejectedError
    from flowkernel.errors import FlowkernelError as FlowkernelError
    from flowkernel.errors import FlowValidationError as FlowValidationError
    from flowkernel.errors import InvalidInputError as InvalidInputError
    from flowkernel.errors import LeaseLostError as LeaseLostError
    from flowkernel.errors import NodeFailure as NodeFailure
    from flowkernel.errors import Problem as Problem
    from flowkernel.errors import StoreError as StoreError
    from flowkernel.errors import UnknownRunError as UnknownRunError
    from flowkernel.plugins.functions import blocking as blocking
    from flowkernel.plugins.registry import Registry as Registry
    from flowkernel.plugins.registry import default_registry as default_registry
    from flowkernel.plugins.registry import load_plugins as load_plugins
    from flowkernel.plugins.registry import register_function as register_function
    from flowkernel.plugins.registry import register_node_type as register_node_type
    from flowkernel.plugins.registry import register_tool as register_tool
    from flowkernel.run.kernel import Kernel as Kernel
    from flowkernel.run.tuning import Tuning as Tuning
    from flowkernel.store.memory import MemoryStore as MemoryStore
    from flowkernel.store.open import open_store as open_store
    from flowkernel.store.sql.postgres import PostgresStore as PostgresStore
    from flowkernel.store.sql.sqlite import SqliteStore as SqliteStore
    from flowkernel.workers.worker import Worker as Worker

# The public API: name -> the module that defines it (imported when the name is first asked for).
_PUBLIC: dict[str, str] = {
    "Kernel": "flowkernel.run.kernel",
    "RunServices": "flowkernel.core.services",
    "NodeLimits": "flowkernel.core.services",
    "Tuning": "flowkernel.run.tuning",
    "ExpressionLimits": "flowkernel.core.expression_scope",
    "Registry": "flowkernel.plugins.registry",
    "default_registry": "flowkernel.plugins.registry",
    "load_plugins": "flowkernel.plugins.registry",
    "register_function": "flowkernel.plugins.registry",
    "register_node_type": "flowkernel.plugins.registry",
    "register_tool": "flowkernel.plugins.registry",
    "blocking": "flowkernel.plugins.functions",
    "tool": "flowkernel.agents.tools",
    "Tool": "flowkernel.agents.tools",
    "NodeContext": "flowkernel.core.node_context",
    "ChildRuns": "flowkernel.core.node_context",
    "NodeType": "flowkernel.core.node",
    "WaitFor": "flowkernel.core.node",
    "Interrupted": "flowkernel.core.node",
    "INTERRUPTED": "flowkernel.core.node",
    "bindable": "flowkernel.core.node",
    "KnownNames": "flowkernel.core.names",
    "get_path": "flowkernel.core.state_ops",
    "fold": "flowkernel.core.reducer",
    "Command": "flowkernel.core.commands",
    "RunSnapshot": "flowkernel.core.snapshot",
    "CompiledFlow": "flowkernel.core.compiler",
    "MemoryStore": "flowkernel.store.memory",
    "SqliteStore": "flowkernel.store.sql.sqlite",
    "PostgresStore": "flowkernel.store.sql.postgres",
    "open_store": "flowkernel.store.open",
    "Worker": "flowkernel.workers.worker",
    "FlowkernelError": "flowkernel.errors",
    "InvalidInputError": "flowkernel.errors",
    "FlowValidationError": "flowkernel.errors",
    "CommandRejectedError": "flowkernel.errors",
    "UnknownRunError": "flowkernel.errors",
    "StoreError": "flowkernel.errors",
    "LeaseLostError": "flowkernel.errors",
    "NodeFailure": "flowkernel.errors",
    "Problem": "flowkernel.errors",
}
_MODULES: dict[str, str] = {"events": "flowkernel.core.events"}  # public modules, by name

__all__ = sorted([*_PUBLIC, *_MODULES])

# Old documented path -> where that module lives now.
_MOVED: dict[str, str] = {
    "flowkernel.api": "flowkernel.run.kernel",
    "flowkernel.context": "flowkernel.core.node_context",
    "flowkernel.events": "flowkernel.core.events",
    "flowkernel.expression_bounds": "flowkernel.core.expression_bounds",
    "flowkernel.nesting": "flowkernel.core.nesting",
    "flowkernel.node": "flowkernel.core.node",
    "flowkernel.reducer": "flowkernel.core.reducer",
    "flowkernel.registry": "flowkernel.plugins.registry",
    "flowkernel.state_ops": "flowkernel.core.state_ops",
    "flowkernel.store.postgres": "flowkernel.store.sql.postgres",
    "flowkernel.tools": "flowkernel.agents.tools",
    "flowkernel.worker": "flowkernel.workers.worker",
}


class _MovedModules:
    """Finds a moved module under its old name. Last on ``sys.meta_path``, so it is asked only for names
    nothing else finds, and it imports nothing until it is."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _MOVED:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(name, cast("Loader", _MovedModules))

    @staticmethod
    def create_module(spec: Any) -> Any:
        import importlib
        import warnings

        warnings.warn(f"{spec.name} is now {_MOVED[spec.name]}; import from `flowkernel` instead",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(_MOVED[spec.name])
        spec.loader_state = module.__spec__  # importlib sets module.__spec__ to ``spec``: put it back after
        return module

    @staticmethod
    def exec_module(module: Any) -> None:
        module.__spec__ = module.__spec__.loader_state


sys.meta_path.append(cast("MetaPathFinder", _MovedModules))


def __getattr__(name: str) -> Any:
    import importlib

    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("flowkernel")
        except PackageNotFoundError:  # imported from a source tree that was never installed
            value = "0+unknown"
    else:
        raise AttributeError(f"module 'flowkernel' has no attribute {name!r}")
    globals()[name] = value  # asked once: later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
