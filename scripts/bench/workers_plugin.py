"""Functions for scripts/bench/workers.py, loaded by its worker processes with ``--plugin workers_plugin``."""

from __future__ import annotations

import anyio
from flowkernel.plugins.registry import default_registry


async def hold(seconds: float) -> str:
    """A node run that is still in flight when the benchmark kills its worker."""
    await anyio.sleep(seconds)
    return "held"


default_registry().add_function("bench.hold", hold)
