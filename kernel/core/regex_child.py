"""One regular-expression operation in a process of its own, for ``flowkernel.core.bounded_regex``.

Run as a script (``python -P regex_child.py``): it imports nothing from flowkernel, so it starts in
the time Python and ``regex`` take. It reads one JSON request on stdin: ``{op, pattern, flags,
string, timeout, ...}``; writes JSON lines on stdout: ``{"m": spans}`` per match of ``finditer``, or
``{"value": ...}`` for the other operations, then ``{"end": true}``; ``{"timeout": true}`` when
the match runs past ``timeout`` (so a child whose caller died ends by itself), ``{"error": message}``
for a bad pattern or template.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import regex


def _spans(match: Any) -> list[list[int] | None]:
    out: list[list[int] | None] = []
    for group in range(len(match.groups()) + 1):
        start, end = match.span(group)
        out.append(None if start < 0 else [start, end])
    return out


def _write(value: Any) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


def main() -> None:
    request = json.loads(sys.stdin.buffer.read())
    pattern = regex.compile(request["pattern"], request["flags"])
    subject: str = request["string"]
    timeout: float = request["timeout"]
    op = request["op"]
    try:
        if op == "finditer":
            skip, limit = request.get("skip", 0), request.get("count", 0)
            for i, match in enumerate(pattern.finditer(subject, timeout=timeout)):
                if limit and i >= limit:
                    break
                if i >= skip:
                    _write({"m": _spans(match)})
        elif op == "search":
            match = pattern.search(subject, timeout=timeout)
            _write({"value": None if match is None else _spans(match)})
        elif op == "sub":
            _write({"value": pattern.sub(request["repl"], subject, request.get("count", 0), timeout=timeout)})
        elif op == "split":
            _write({"value": pattern.split(subject, request.get("maxsplit", 0), timeout=timeout)})
        else:
            _write({"error": f"unknown operation {op!r}"})
            return
    except TimeoutError:
        _write({"timeout": True})
        return
    except (regex.error, IndexError, ValueError) as exc:  # a bad template in sub
        _write({"error": str(exc)})
        return
    _write({"end": True})


if __name__ == "__main__":
    try:
        main()
    except (BrokenPipeError, KeyboardInterrupt):
        pass
