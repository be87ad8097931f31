"""How deeply JSON nests, and where: for the files flowkernel reads (flows, fixtures), whose parser gives
up on a document nested too deeply for it (a ``RecursionError`` that says neither where nor why).
Only called once that happened, so it costs nothing on a file that reads.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# A whole string (its brackets are text), or a bracket.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)


class DeepPoint(NamedTuple):
    """Where a text nests deepest or past a bound: the level reached, its line and column (1-based)."""

    level: int
    line: int
    column: int
    beyond: bool  # the text nests deeper than the bound asked about, first at this point


def deep_point(text: str, limit: int) -> DeepPoint | None:
    """The first bracket of ``text`` that opens a level past ``limit``; else the first that opens its
    deepest level; None for a text without arrays or objects."""
    depth = deepest = 0
    at = -1
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > limit:
                return _point(text, match.start(), depth, beyond=True)
            if depth > deepest:
                deepest, at = depth, match.start()
        elif token in "]}":
            depth -= 1
    return _point(text, at, deepest, beyond=False) if at >= 0 else None


def describe(text: str, limit: int) -> str:
    """Where and why ``text`` is too deeply nested to read, as ``line L, column C: …``."""
    point = deep_point(text, limit)
    if point is None:
        return "nested too deeply to read"
    where = f"line {point.line}, column {point.column}"
    if point.beyond:
        return f"{where}: arrays and objects nested more than {limit} levels deep"
    return f"{where}: arrays and objects nested {point.level} levels deep, too deep to read"


def _point(text: str, offset: int, level: int, *, beyond: bool) -> DeepPoint:
    line = text.count("\n", 0, offset) + 1
    return DeepPoint(level, line, offset - text.rfind("\n", 0, offset), beyond)
