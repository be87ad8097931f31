"""Run and node-run ids: unique, sortable by creation time, in Crockford base32."""

from __future__ import annotations

import random
import re
import time

from flowkernel.ids import _ALPHABET, new_node_run_id, new_run_id

ID = re.compile(r"^(run|nr)_[0-9a-hjkmnp-tv-z]{20}$")


def _millis(token: str) -> int:
    value = 0
    for ch in token:
        value = value * 32 + _ALPHABET.index(ch)
    return value >> 50


def test_ids_have_their_prefix_and_twenty_crockford_characters() -> None:
    assert ID.match(new_run_id()) and new_run_id().startswith("run_")
    assert ID.match(new_node_run_id()) and new_node_run_id().startswith("nr_")


def test_an_id_carries_its_creation_time_in_milliseconds_so_ids_sort_by_creation() -> None:
    before = time.time_ns() // 1_000_000
    first = new_node_run_id()
    after = time.time_ns() // 1_000_000
    assert before <= _millis(first[3:]) <= after
    while time.time_ns() // 1_000_000 == after:
        pass
    second = new_node_run_id()
    assert second > first
    assert _millis(second[3:]) > after, "an id made in a later millisecond carries that millisecond"


def test_ids_are_unique_even_when_the_application_seeds_the_global_random() -> None:
    random.seed(7)
    a = new_node_run_id()
    random.seed(7)
    b = new_node_run_id()
    assert a != b
    assert len({new_node_run_id() for _ in range(20_000)}) == 20_000
