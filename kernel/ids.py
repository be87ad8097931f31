"""Identifiers: ``run_…`` for runs, ``nr_…`` for node runs. Sortable by creation time."""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def _token() -> str:
    # 48 bits of milliseconds then 50 random bits, Crockford base32: sortable and collision-safe.
    value = (int(time.time() * 1000) << 50) | int.from_bytes(os.urandom(7), "big") >> 6
    chars = []
    for _ in range(20):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_run_id() -> str:
    return f"run_{_token()}"


def new_node_run_id() -> str:
    return f"nr_{_token()}"


def now_ms() -> int:
    return int(time.time() * 1000)
