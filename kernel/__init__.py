"""flowkernel: a workflow-graph kernel for AI agents with snapshot-based resume.

``flowkernel.__version__`` is the installed distribution's version (pyproject's ``version``, read from
the package metadata on first use, so importing flowkernel does not pay for ``importlib.metadata``).
"""

from __future__ import annotations


def __getattr__(name: str) -> str:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("flowkernel")
        except PackageNotFoundError:  # imported from a source tree that was never installed
            return "0+unknown"
    raise AttributeError(f"module 'flowkernel' has no attribute {name!r}")
