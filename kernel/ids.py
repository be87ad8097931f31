"""Identifiers: ``run_…`` for runs, ``nr_…`` for node runs. Sortable by creation time."""

from __future__ import annotations

import os
import random
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
# Crockford base32 two characters at a time: ten lookups per id instead of twenty shifts.
_PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]

# A generator of our own, seeded from the OS and re-seeded in a forked child, so ids stay unique
# across processes even when an application seeds the global ``random`` with a constant.
_rng = random.Random(os.urandom(16))
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _rng.seed(os.urandom(16)))


_last_ms: tuple[int, str] = (-1, "")  # the last millisecond an id was made in, and its ten characters


def _token() -> str:
    # 48 bits of milliseconds then 50 random bits, Crockford base32: sortable and collision-safe.
    # The time half is the same for every id made within a millisecond: encoded once per millisecond.
    global _last_ms
    ms = time.time_ns() // 1_000_000
    p = _PAIRS
    last = _last_ms
    if ms != last[0]:
        last = _last_ms = ms, p[ms >> 40] + p[ms >> 30 & 1023] + p[ms >> 20 & 1023] + p[ms >> 10 & 1023] + p[ms & 1023]
    r = _rng.getrandbits(50)
    return last[1] + p[r >> 40] + p[r >> 30 & 1023] + p[r >> 20 & 1023] + p[r >> 10 & 1023] + p[r & 1023]


def new_run_id() -> str:
    return f"run_{_token()}"


def new_node_run_id() -> str:
    return f"nr_{_token()}"


def now_ms() -> int:
    return int(time.time() * 1000)
