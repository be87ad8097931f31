"""Argument types the commands share: counts and durations, refused with a message that says what
is wrong (argparse adds the option's name and exits 2)."""

from __future__ import annotations

import argparse
from typing import Any

from flowkernel.workers.defaults import DEFAULT_GRACE_S


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def non_negative_float(text: str) -> float:
    """A number of seconds, 0 or more (not NaN, not infinite)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("must be a number of seconds, 0 or more")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def add_executor_options(sp: Any, *, stopped_by: str) -> None:
    """The options of a process that executes runs (``worker``, ``serve``): its grace on ``stopped_by``
    and fixtures in place of the API (``--plugin``, as every command's, comes from ``flowkernel.cli``)."""
    sp.add_argument("--grace-s", type=non_negative_float, default=DEFAULT_GRACE_S, metavar="S",
                    help=f"on {stopped_by}, how long node runs in flight may take to finish before they are "
                         f"paused and handed over (default {DEFAULT_GRACE_S:g})")
    sp.add_argument("--fixtures", metavar="DIR", help="serve model calls from fixture files: a run's node "
                                                      "files in DIR/<flow name>/, then DIR/ (no network)")
