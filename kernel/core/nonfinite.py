"""Floats JSON cannot hold: NaN, Infinity and -Infinity.

msgspec encodes them as ``null`` (as JavaScript does), and Python's ``json`` reads and writes them as
bare ``NaN``/``Infinity`` tokens no other JSON parser accepts. Either way a value would change without a
word on its way into the store, so where the kernel takes a value in (node outputs, state patches, run
input, commands, JSON text) such a float is an error that names its JSON path.

Kept cheap on the hot path: an encoded value holds ``null`` wherever msgspec met one of these floats,
so a value whose encoding has no ``null`` needs no walk (``check_encoded``).
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["check_encoded", "describe", "find_non_finite", "loads_strict", "non_finite_problem", "refuse_non_finite"]

_NULL = b"null"


def describe(number: float) -> str:
    """``NaN``, ``Infinity`` or ``-Infinity``: the name the value goes by in JavaScript and Python's json."""
    if math.isnan(number):
        return "NaN"
    return "Infinity" if number > 0 else "-Infinity"


def _key(path: str, key: str) -> str:
    return f"{path}.{key}" if key.isidentifier() else f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def find_non_finite(value: Any, root: str = "$") -> tuple[str, float] | None:
    """The JSON path (under ``root``) and value of the first NaN or ±Infinity in ``value``, or None."""
    stack: list[tuple[Any, str]] = [(value, root)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return where, item
        elif isinstance(item, dict):
            # Reversed onto the stack, so the first one in document order is found first.
            stack.extend((v, _key(where, str(k))) for k, v in reversed(item.items()))
        elif isinstance(item, list | tuple):
            stack.extend((item[i], f"{where}[{i}]") for i in range(len(item) - 1, -1, -1))
    return None


def non_finite_problem(value: Any, root: str = "$") -> str | None:
    """``"<path> is NaN, which JSON cannot hold"`` for the first such float in ``value``, or None."""
    found = find_non_finite(value, root)
    if found is None:
        return None
    where, number = found
    return f"{where} is {describe(number)}, which JSON cannot hold (it would be stored as null)"


def check_encoded(value: Any, encoded: bytes, root: str = "$") -> None:
    """Raise ValueError if ``value`` (whose msgspec encoding is ``encoded``) holds NaN or ±Infinity.
    Walks ``value`` only when ``encoded`` has a ``null``: without one, it holds no such float."""
    if _NULL in encoded:
        refuse_non_finite(value, root)


def refuse_non_finite(value: Any, root: str = "$") -> None:
    """Raise ValueError naming where ``value`` holds NaN or ±Infinity, if it does."""
    problem = non_finite_problem(value, root)
    if problem is not None:
        raise ValueError(problem)


def _refuse_constant(token: str) -> Any:
    raise ValueError(f"{token} is not JSON (JSON has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is too large for a JSON number here (it would read as {describe(number)})")
    return number


def loads_strict(text: str | bytes) -> Any:
    """``json.loads`` that refuses ``NaN``, ``Infinity`` and numbers too large for a float (ValueError;
    a ``json.JSONDecodeError`` for text that is not JSON at all)."""
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
