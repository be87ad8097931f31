"""Functions for the worker-pool tests, loaded with ``--plugin tests.plugins.pool``.

``pool.step`` is one link of a chain: its output is a digest of its label and its input, so a node
that ran with the wrong input, or twice, changes every output after it. ``POOL_STEP_MS`` in the
environment makes each step take that long (so a SIGKILL lands mid-run). ``pool.gate`` marks that it
has been entered (a file ``<dir>/<label>.entered``) and waits for ``<dir>/<label>.go``, so a test
can freeze or kill a worker at a known point.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import anyio
from flowkernel.plugins.registry import register_function


def digest(label: str, prev: Any) -> str:
    data = json.dumps([label, prev], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()[:16]


@register_function("pool.step")
async def step(label: str, prev: Any = None) -> str:
    ms = float(os.environ.get("POOL_STEP_MS", "0"))
    if ms:
        await anyio.sleep(ms / 1000)
    return digest(label, prev)


@register_function("pool.gate")
async def gate(label: str, dir: str) -> str:
    folder = Path(dir)
    (folder / f"{label}.entered").write_text(str(os.getpid()))
    while not (folder / f"{label}.go").exists():
        await anyio.sleep(0.01)
    return label
