"""Words the CLI prints about counts, kept free of imports so a command that only counts pays nothing."""

from __future__ import annotations


def plural(count: int, noun: str) -> str:
    """``1 edge``, ``2 edges``."""
    return f"{count} {noun if count == 1 else noun + 's'}"
