"""Holding Python's cycle collector off while a burst of long-lived, acyclic objects is built.

Loading a stored flow of 10,000 nodes (its document decoded, then compiled) or a large checkpoint
allocates a hundred thousand objects at once. Each few hundred allocations would set off a
collection of the young objects, and the growing heap full collections of everything the process
holds, imports included: a third of the load's time, spent finding no garbage, since decoded JSON
and compiled structs hold no reference cycles. The collector is held off for the burst and takes
up its schedule afterwards.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0  # bursts in progress (in any thread) while the collector is held off by this module


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection while the block runs, unless it was off already (then it stays off)."""
    global _holders
    with _lock:
        if _holders == 0 and not gc.isenabled():
            held = False  # someone else turned it off: leave it as it is
        else:
            held = True
            _holders += 1
            gc.disable()
    try:
        yield
    finally:
        if held:
            with _lock:
                _holders -= 1
                if _holders == 0:
                    gc.enable()
