"""Functions for the HTTP run tests, loaded with ``--plugin tests.plugins.serving`` (or imported).

``serving.unless_file`` fails while its file is missing: a run fails, the test creates the file, and
a retry succeeds.
"""

from __future__ import annotations

from pathlib import Path

from flowkernel.plugins.registry import register_function


@register_function("serving.unless_file")
def unless_file(path: str) -> str:
    if not Path(path).exists():
        raise RuntimeError(f"{path} is missing")
    return "found"

