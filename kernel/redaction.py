"""Credentials are never written: not in an event, an error, a stored agent message or a log line.

An upstream that fails may echo the request it was sent, headers included (some proxies do), and the
error's text becomes an ``agent:error``, a ``node:error``, the run's error, an agent run's error
message, what ``show``, ``export``, the API and the web UI give back, and a log line. So every event
is checked where it is appended (``flowkernel.run.loop`` and the commands recorded without an
executor), every agent message and tool call where it is stored, and every log record through
``RedactingFilter``; what looks like a credential is replaced by ``[REDACTED]`` before it is written:

- the values of ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_AUTH_TOKEN``, and any key or token a client was
  given (``register_secret``);
- anything shaped like an Anthropic key (``sk-ant-…``);
- the value after an ``x-api-key``, ``authorization`` or ``proxy-authorization`` header name.

The check is a few byte searches over the encoded event, so an event without any of these costs
next to nothing; one with them is redacted and decoded again, so what is applied is what is stored.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from typing import Any

REDACTED = "[REDACTED]"
CREDENTIAL_VARIABLES = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
MIN_SECRET_CHARS = 8  # shorter values ("test") would redact ordinary words

_KEY_SHAPE = r"sk-ant-[A-Za-z0-9_\-]{4,}"
# A header name, what separates it from its value in the forms it is echoed in (``name: value``,
# ``"name": "value"`` inside a JSON string, ``'name': 'value'`` of a Python dict), an optional scheme.
_HEADER = (r"(?i)((?:proxy-)?authorization|x-api-key)((?:\\?[\"'])?\s*[:=]\s*(?:\\?[\"'])?\s*"
           r"(?:(?:bearer|basic)\s+)?)(?!(?:bearer|basic)\s)([^\s\"'\\,;}\])\[]+)")
_TEXT_KEY = re.compile(_KEY_SHAPE)
_TEXT_HEADER = re.compile(_HEADER)
_BYTES_KEY = re.compile(_KEY_SHAPE.encode())
_BYTES_HEADER = re.compile(_HEADER.encode())

_registered: set[str] = set()
_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Redact ``value`` (a key or token this process uses) wherever it would be written."""
    if value and len(value) >= MIN_SECRET_CHARS:
        with _lock:
            _registered.add(value)


def _secrets() -> list[str]:
    found = [v for v in (os.environ.get(name) for name in CREDENTIAL_VARIABLES) if v and len(v) >= MIN_SECRET_CHARS]
    with _lock:
        found.extend(_registered)
    return found


def _encoded_forms(secret: str) -> list[bytes]:
    """``secret`` as it appears in UTF-8 text and inside a JSON string (escaped)."""
    raw = secret.encode("utf-8", "surrogatepass")
    escaped = json.dumps(secret)[1:-1].encode()
    return [raw] if escaped == raw else [raw, escaped]


def holds_secret(body: bytes) -> bool:
    """Whether the encoded ``body`` may hold a credential (then ``redact_bytes`` it)."""
    if b"sk-ant-" in body:
        return True
    if any(form in body for secret in _secrets() for form in _encoded_forms(secret)):
        return True
    return _BYTES_HEADER.search(body) is not None


def redact_bytes(body: bytes) -> bytes:
    """``body`` (UTF-8 text or JSON) with every credential replaced by ``[REDACTED]``; JSON stays JSON."""
    mark = REDACTED.encode()
    for secret in sorted(_secrets(), key=len, reverse=True):
        for form in _encoded_forms(secret):
            body = body.replace(form, mark)
    body = _BYTES_KEY.sub(mark, body)
    return _BYTES_HEADER.sub(lambda m: m.group(1) + m.group(2) + mark, body)


def redact_text(text: str) -> str:
    """``text`` with every credential replaced by ``[REDACTED]``."""
    for secret in sorted(_secrets(), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _TEXT_KEY.sub(REDACTED, text)
    return _TEXT_HEADER.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)


def redacted(value: Any) -> Any:
    """A JSON value with every credential in its strings replaced (the value itself when it holds none)."""
    try:
        body = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError, RecursionError):  # not JSON: the store refuses it, as it would have
        return value
    if not holds_secret(body):
        return value
    return json.loads(redact_bytes(body))


class RedactingFilter(logging.Filter):
    """A logging filter that redacts credentials from a record's message and traceback text."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not fit its format: leave it to the handler
            return True
        cleaned = redact_text(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True


_FILTER = RedactingFilter()


def install_log_redaction() -> None:
    """Put ``RedactingFilter`` on every handler this process has now (the root logger's, Python's
    last-resort handler, and each logger's own, uvicorn's included). For a command line or a server
    that owns its process; an application embedding flowkernel adds the filter to its own handlers."""
    handlers = [logging.lastResort, *logging.getLogger().handlers]
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            handlers.extend(logger.handlers)
    for handler in handlers:
        if handler is not None and _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
