"""State patches (``set``, ``merge``, ``append`` at a dotted path), applied without mutation."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from flowkernel.errors import NodeFailure

OPS = ("set", "merge", "append")
_VERB = {"set": "set", "merge": "merge into", "append": "append to"}


@lru_cache(maxsize=1024)
def split_path(path: str) -> tuple[str, ...]:
    """``"a.b"`` -> ``("a", "b")``; flows use a handful of paths, so each is split once."""
    return tuple(p for p in path.split(".") if p) if path else ()


def get_path(state: Any, path: str) -> Any:
    cur = state
    for key in split_path(path):
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return cur


def apply_patch(state: dict[str, Any], op: str, path: str, value: Any) -> dict[str, Any]:
    """A new state with the patch applied; containers along the path are copied, the rest shared."""
    keys = split_path(path)
    if not keys:
        if op == "set":
            if not isinstance(value, dict):
                raise NodeFailure("setting the whole state needs an object", "state_error")
            return dict(value)
        if op == "merge":
            if not isinstance(value, dict):
                raise NodeFailure("merge needs an object", "state_error")
            return {**state, **value}
        raise NodeFailure("append needs a path to a list", "state_error")
    return _patch(state, keys, op, value, path)


def apply_patches(state: dict[str, Any], patches: Iterable[tuple[str, str, Any]]) -> dict[str, Any]:
    """``state`` with ``(op, path, value)`` patches applied in order; one that does not apply (another
    node run changed the type at its path meanwhile) is left out, so this never fails."""
    for op, path, value in patches:
        try:
            state = apply_patch(state, op, path, value)
        except NodeFailure:
            continue
    return state


def _patch(node: dict[str, Any], keys: tuple[str, ...], op: str, value: Any, path: str,
           depth: int = 0) -> dict[str, Any]:
    out = dict(node)
    head = keys[0]
    if len(keys) > 1:
        child = node.get(head)
        if child is not None and not isinstance(child, dict):
            # Replacing it with {} would silently lose the user's data: refuse, naming where.
            through = ".".join(split_path(path)[:depth + 1])
            raise NodeFailure(f"state.{through} is {_kind(child)}, not an object: cannot {_VERB.get(op, op)} "
                              f"state.{path} through it", "state_error")
        out[head] = _patch(child or {}, keys[1:], op, value, path, depth + 1)
        return out
    current = node.get(head)
    if op == "set":
        out[head] = value
    elif op == "merge":
        if current is not None and not isinstance(current, dict):
            raise NodeFailure(f"state.{path} is not an object; cannot merge into it", "state_error")
        if not isinstance(value, dict):
            raise NodeFailure(f"merge into state.{path} needs an object", "state_error")
        out[head] = {**(current or {}), **value}
    elif op == "append":
        if current is not None and not isinstance(current, list):
            raise NodeFailure(f"state.{path} is not a list; cannot append to it", "state_error")
        out[head] = [*(current or []), value]
    else:
        raise NodeFailure(f"unknown state op {op!r}; use one of {', '.join(OPS)}", "state_error")
    return out


def _kind(value: Any) -> str:
    """A JSON value's kind, for error messages: 'a list', 'a string', ..."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"
