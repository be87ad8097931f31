"""How deep JSON may nest: what flowkernel accepts, and how it reads what is deeper.

Python's JSON decoders and encoders, and every function that walks a value level by level, recurse:
a value nested a thousand levels deep is a ``RecursionError`` wherever it goes. So:

- **At the door**, a run's input, a reply, a sent or resume message and a flow document's values may
  nest at most ``MAX_DEPTH`` levels of lists and objects; deeper is refused (422, exit code 2) with the
  JSON path where the bound is passed.
- **On reading**, a stored value that is deeper than the readers can go (stored before the bound, or
  made by a node) is read with what lies below ``MAX_DEPTH`` levels replaced by ``MARKER``: ``runs``,
  ``show`` and ``export`` go on working, and say where something was left out.
- **In a file** flowkernel reads (flows, fixtures), whose parser gave up on a document nested too deeply
  (a ``RecursionError`` that says neither where nor why): ``describe`` says where (only called once
  that happened, so it costs nothing on a file that reads).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")

MAX_DEPTH = 100  # levels of lists and objects in accepted JSON; a documented constant
MARKER = f"…(nested more than {MAX_DEPTH} levels deep: not shown)"


def too_deep(value: Any, what: str, limit: int = MAX_DEPTH) -> tuple[str, str] | None:
    """``(JSON path, message)`` where ``value`` passes ``limit`` levels of nesting, or None. Iterative."""
    todo: list[tuple[Any, str, int]] = [(value, what, 0)]
    while todo:
        item, where, depth = todo.pop()
        if isinstance(item, dict):
            if depth >= limit:
                return where, _message(limit)
            todo.extend((v, f"{where}.{k}" if isinstance(k, str) and k.isidentifier() else f"{where}[{k!r}]",
                         depth + 1) for k, v in item.items())
        elif isinstance(item, (list, tuple)):
            if depth >= limit:
                return where, _message(limit)
            todo.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))
    return None


def _message(limit: int) -> str:
    return f"nested more than {limit} levels deep (lists and objects); flowkernel takes at most {limit}"


def clipped(value: Any, limit: int = MAX_DEPTH) -> Any:
    """``value`` with each list or object below ``limit`` levels replaced by ``MARKER`` (a copy; iterative)."""
    if not isinstance(value, (dict, list, tuple)):
        return value
    root: list[Any] = [None]
    todo: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 0)]  # (value, parent, key in parent, depth)
    while todo:
        item, parent, key, depth = todo.pop()
        if isinstance(item, dict):
            if depth >= limit:
                parent[key] = MARKER
                continue
            copy: dict[str, Any] = {}
            parent[key] = copy
            for k, v in item.items():
                copy[k] = None
                todo.append((v, copy, k, depth + 1))
        elif isinstance(item, (list, tuple)):
            if depth >= limit:
                parent[key] = MARKER
                continue
            items: list[Any] = [None] * len(item)
            parent[key] = items
            todo.extend((v, items, i, depth + 1) for i, v in enumerate(item))
        else:
            parent[key] = item
    return root[0]


def clipped_text(text: str | bytes, limit: int = MAX_DEPTH) -> bytes:
    """JSON ``text`` with each array or object below ``limit`` levels replaced by ``MARKER`` (as a
    JSON string), so that any decoder reads it. Works on the text, without recursing."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    marker = json.dumps(MARKER).encode()
    out = bytearray()
    depth = 0
    skip_from = -1  # depth at which the text is being left out, or -1
    in_string = escaped = False
    start = 0
    for i, byte in enumerate(data):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
            continue
        if byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            if skip_from < 0 and depth >= limit:
                out += data[start:i]
                out += marker
                skip_from = depth
            depth += 1
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
            if skip_from >= 0 and depth == skip_from:
                skip_from = -1
                start = i + 1
    if skip_from < 0:
        out += data[start:]
    return bytes(out)


def read_deep(decode: Callable[[bytes], T], text: str | bytes) -> T:
    """``decode(text)``; when the text is nested deeper than the decoder can go, the text clipped."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    try:
        return decode(raw)
    except RecursionError:
        return decode(clipped_text(raw))


def loads(text: str | bytes) -> Any:
    """``json.loads`` that reads a value nested too deeply to decode with its depths clipped."""
    return read_deep(json.loads, text)


# -- where a text nests too deeply ------------------------------------------------------------------

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
