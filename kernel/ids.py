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


def _token() -> str:
    # 48 bits of milliseconds then 50 random bits, Crockford base32: sortable and collision-safe.
    v = (time.time_ns() // 1_000_000) << 50 | _rng.getrandbits(50)
    p = _PAIRS
    return (p[v >> 90] + p[v >> 80 & 1023] + p[v >> 70 & 1023] + p[v >> 60 & 1023] + p[v >> 50 & 1023]
            + p[v >> 40 & 1023] + p[v >> 30 & 1023] + p[v >> 20 & 1023] + p[v >> 10 & 1023] + p[v & 1023])


def new_run_id() -> str:
    return f"run_{_token()}"


def new_node_run_id() -> str:
    return f"nr_{_token()}"


def now_ms() -> int:
    return int(time.time() * 1000)
