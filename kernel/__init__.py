"""flowkernel: a workflow-graph kernel for AI agents with snapshot-based resume.

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


def __getattr__(name: str) -> str:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("flowkernel")
        except PackageNotFoundError:  # imported from a source tree that was never installed
            return "0+unknown"
    raise AttributeError(f"module 'flowkernel' has no attribute {name!r}")
