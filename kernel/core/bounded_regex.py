"""Regular expressions that flows, inputs and replies bring (JSONata's ``/…/`` and ``$match``, JSON
Schema's ``pattern`` and ``patternProperties``), matched within a deadline and stoppable at once.

A backtracking pattern such as ``^(a|a)+$`` takes time exponential in its subject, and Python's
``re`` holds the GIL all along: one such match in a request freezes every thread of the process.
Here every match runs in the ``regex`` module (``re``'s syntax) without the GIL and with a timeout:

- first in the calling thread, for a short slice (``SLICE_S``): nearly every match ends within it;
- a match that needs longer runs again in a child process (``flowkernel/core/regex_child.py``) that the
  caller waits for, looking at its deadline and its cancellation every ``POLL_S``. When either comes,
  the child is killed: a pause, an abort or a node's timeout stops the match at once, and no CPU goes
  on being spent on a match that nobody waits for. (A thread cannot be stopped in the middle of a C
  call; a process can.)

A match past its deadline raises ``RegexTimeout``; a cancelled one raises ``EvaluationCancelled``.
Where no child process can be started (no ``sys.executable``), the match runs in the calling thread
with the whole remaining time as its timeout: still bounded, no longer stoppable early.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import closing
from functools import lru_cache
from pathlib import Path
from typing import Any

import regex
from flowkernel.core.expression_scope import EvaluationCancelled

log = logging.getLogger("flowkernel.regex")

SLICE_S = 0.05  # CPU seconds a match may take in the calling thread before it moves to a child process
POLL_S = 0.02  # how often the caller of a child looks at its deadline and cancellation
_CHILD = str(Path(__file__).with_name("regex_child.py"))


class RegexTimeout(Exception):
    """A match ran past its deadline."""

    def __init__(self, pattern: str, subject: str) -> None:
        super().__init__(f"matching {pattern!r} ran past its deadline")
        self.pattern = pattern
        self.subject = subject


class Bound:
    """The deadline of a match (``time.monotonic()`` seconds) and whether its caller was cancelled."""

    __slots__ = ("cancelled", "until")

    def __init__(self, until: float, cancelled: Callable[[], bool] = lambda: False) -> None:
        self.until = until
        self.cancelled = cancelled

    def remaining(self, pattern: regex.Pattern[str], subject: str) -> float:
        """Seconds left; raises when the caller was cancelled or the time is up."""
        if self.cancelled():
            raise EvaluationCancelled
        left = self.until - time.monotonic()
        if left <= 0:
            raise RegexTimeout(pattern.pattern, subject)
        return left


@lru_cache(maxsize=512)
def compile_pattern(pattern: str, flags: int = 0) -> regex.Pattern[str]:
    """``pattern`` compiled by ``regex`` with ``re``'s syntax (``regex.V0``); raises ``regex.error``."""
    return regex.compile(pattern, regex.V0 | flags)


class SpanMatch:
    """A match found in a child process: what ``re.Match`` offers that callers use, from the group spans."""

    __slots__ = ("_names", "_spans", "string")

    def __init__(self, string: str, spans: list[list[int] | None], names: dict[str, int]) -> None:
        self.string = string
        self._spans = spans
        self._names = names

    def _index(self, group: int | str) -> int:
        index = self._names[group] if isinstance(group, str) else group
        if not 0 <= index < len(self._spans):
            raise IndexError("no such group")
        return index

    def _text(self, group: int | str, default: Any = None) -> Any:
        span = self._spans[self._index(group)]
        return default if span is None else self.string[span[0]:span[1]]

    def group(self, *groups: int | str) -> Any:
        if len(groups) <= 1:
            return self._text(groups[0] if groups else 0)
        return tuple(self._text(g) for g in groups)

    def __getitem__(self, group: int | str) -> Any:
        return self._text(group)

    def groups(self, default: Any = None) -> tuple[Any, ...]:
        return tuple(self._text(g, default) for g in range(1, len(self._spans)))

    def groupdict(self, default: Any = None) -> dict[str, Any]:
        return {name: self._text(index, default) for name, index in self._names.items()}

    def span(self, group: int | str = 0) -> tuple[int, int]:
        span = self._spans[self._index(group)]
        return (-1, -1) if span is None else (span[0], span[1])

    def start(self, group: int | str = 0) -> int:
        return self.span(group)[0]

    def end(self, group: int | str = 0) -> int:
        return self.span(group)[1]


def _slice(pattern: regex.Pattern[str], subject: str, bound: Bound) -> float:
    return min(SLICE_S, bound.remaining(pattern, subject))


def search(pattern: regex.Pattern[str], subject: str, bound: Bound) -> Any:
    """The first match of ``pattern`` in ``subject`` (a ``regex`` match or a ``SpanMatch``), or None."""
    try:
        return pattern.search(subject, timeout=_slice(pattern, subject, bound), concurrent=True)
    except TimeoutError:
        pass
    spans = _answer(pattern, subject, bound, {"op": "search"})
    return None if spans is None else SpanMatch(subject, spans, dict(pattern.groupindex))


def finditer(pattern: regex.Pattern[str], subject: str, bound: Bound, count: int = 0) -> Iterator[Any]:
    """The matches of ``pattern`` in ``subject`` in order (at most ``count`` when it is positive);
    stopping the iteration early kills the child process if one was needed."""
    seen = 0
    try:
        for match in pattern.finditer(subject, timeout=_slice(pattern, subject, bound), concurrent=True):
            if count and seen >= count:
                return
            seen += 1
            yield match
        return
    except TimeoutError:
        pass
    names = dict(pattern.groupindex)
    with closing(_in_child(pattern, subject, bound, {"op": "finditer", "skip": seen, "count": count})) as answers:
        for message in answers:
            yield SpanMatch(subject, message["m"], names)


def sub(pattern: regex.Pattern[str], repl: str | Callable[[Any], str], subject: str, bound: Bound,
        count: int = 0) -> str:
    """``pattern.sub(repl, subject, count)``; a callable ``repl`` is given each match."""
    try:
        return str(pattern.sub(repl, subject, count, timeout=_slice(pattern, subject, bound), concurrent=True))
    except TimeoutError:
        pass
    if isinstance(repl, str):
        return str(_answer(pattern, subject, bound, {"op": "sub", "repl": repl, "count": count}))
    parts: list[str] = []
    last = 0
    for match in finditer(pattern, subject, bound, count):
        parts.append(subject[last:match.start()])
        parts.append(repl(match))
        last = match.end()
    parts.append(subject[last:])
    return "".join(parts)


def split(pattern: regex.Pattern[str], subject: str, bound: Bound, maxsplit: int = 0) -> list[str | None]:
    """``pattern.split(subject, maxsplit)``."""
    try:
        return list(pattern.split(subject, maxsplit, timeout=_slice(pattern, subject, bound), concurrent=True))
    except TimeoutError:
        pass
    return list(_answer(pattern, subject, bound, {"op": "split", "maxsplit": maxsplit}))


# -- the child process -------------------------------------------------------------------------------

_children: set[subprocess.Popen[bytes]] = set()
_children_lock = threading.Lock()
_warned = False


def live_children() -> int:
    """How many child processes are matching right now (for tests and diagnostics)."""
    with _children_lock:
        return len(_children)


def _spawn() -> subprocess.Popen[bytes] | None:
    global _warned
    if not sys.executable:
        return None
    try:
        # -P: the script's folder (flowkernel's own) is not put on sys.path, so no module there shadows one
        # of the standard library's.
        proc = subprocess.Popen([sys.executable, "-P", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, close_fds=True)
    except OSError as exc:
        if not _warned:
            _warned = True
            log.warning("cannot start a process for long regular-expression matches (%s); they run in the "
                        "calling thread, bounded by their deadline but not stoppable early", exc)
        return None
    with _children_lock:
        _children.add(proc)
    return proc


def _answer(pattern: regex.Pattern[str], subject: str, bound: Bound, request: dict[str, Any]) -> Any:
    """The one ``value`` a child answers ``request`` with."""
    with closing(_in_child(pattern, subject, bound, request)) as answers:
        for message in answers:
            return message["value"]
    raise RuntimeError("the process matching a regular expression ended without an answer")


def _spans(match: Any) -> list[list[int] | None]:
    return [None if match.span(g)[0] < 0 else list(match.span(g)) for g in range(len(match.groups()) + 1)]


def _in_child(pattern: regex.Pattern[str], subject: str, bound: Bound,
              request: dict[str, Any]) -> Generator[dict[str, Any], None, None]:
    """Run ``request`` in a child process; yield its answer lines until its end. Raises RegexTimeout at
    the deadline and EvaluationCancelled when the caller is cancelled, killing the child either way."""
    left = bound.remaining(pattern, subject)
    proc = _spawn()
    if proc is None:
        yield from _in_thread(pattern, subject, left, request)
        return
    assert proc.stdin is not None and proc.stdout is not None
    try:
        body = json.dumps({**request, "pattern": pattern.pattern, "flags": pattern.flags, "string": subject,
                           "timeout": left}).encode()
        try:
            proc.stdin.write(body)
            proc.stdin.close()
        except OSError:
            raise RuntimeError("the process matching a regular expression ended before it read its task") from None
        fd = proc.stdout.fileno()
        buffer = b""
        while True:
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                message = json.loads(line)
                if "end" in message:
                    return
                if "timeout" in message:
                    raise RegexTimeout(pattern.pattern, subject)
                if "error" in message:
                    raise regex.error(message["error"])
                yield message
            left = bound.remaining(pattern, subject)
            ready, _, _ = select.select([fd], [], [], min(POLL_S, left))
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise RuntimeError("the process matching a regular expression ended without an answer")
                buffer += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        if not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
        with _children_lock:
            _children.discard(proc)


def _in_thread(pattern: regex.Pattern[str], subject: str, timeout: float,
               request: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """What the child would answer, computed here with the whole remaining time as the timeout."""
    op = request["op"]
    try:
        if op == "finditer":
            skip, limit = request.get("skip", 0), request.get("count", 0)
            for i, match in enumerate(pattern.finditer(subject, timeout=timeout, concurrent=True)):
                if limit and i >= limit:
                    return
                if i >= skip:
                    yield {"m": _spans(match)}
        elif op == "search":
            match = pattern.search(subject, timeout=timeout, concurrent=True)
            yield {"value": None if match is None else _spans(match)}
        elif op == "sub":
            yield {"value": pattern.sub(request["repl"], subject, request.get("count", 0), timeout=timeout,
                                        concurrent=True)}
        elif op == "split":
            yield {"value": pattern.split(subject, request.get("maxsplit", 0), timeout=timeout, concurrent=True)}
    except TimeoutError:
        raise RegexTimeout(pattern.pattern, subject) from None
