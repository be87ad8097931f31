"""Where flowkernel's log records go: the loggers the library logs on, and the command line's set-up.

The library only logs (a logger ``flowkernel.<part>`` per part, below); it never prints and never
configures ``logging``. The command line sends the records to stderr (``configure_logging``); a program
that embeds flowkernel configures ``logging`` as it likes (with no handler at all, Python's last-resort
handler still writes warnings and errors to stderr).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

# The loggers flowkernel logs on, and what each says. Modules name theirs as a literal
# (``logging.getLogger("flowkernel.run")``: this module is no import of theirs); a test checks that
# every name they use is listed here.
LOGGERS = {
    "flowkernel.run": "the run shell: a commit watcher that failed",
    "flowkernel.plugins": "plugins: an entry point that could not be loaded and was skipped",
    "flowkernel.nodes": "node types: what a node could not store beside its events",
    "flowkernel.telemetry": "traces: an exporter that failed (once per kind of failure)",
    "flowkernel.worker": "workers: each run claimed, recovered or handed over, and how its execution ended",
    "flowkernel.server": "serve: a request that failed inside the server",
    "flowkernel.server.access": "serve: one line per request (client, method, path, status, time)",
    "flowkernel.server.feed": "serve: the event feed could not read new events",
    "flowkernel.regex": "bounded regular expressions: a matcher process that could not be used",
    "flowkernel.agents.claude_sdk": "claude.code sessions: what the Claude Code CLI said on stderr when its session failed",
    "flowkernel.agents.mcp": "MCP servers: a tool left out (a name the Messages API does not take), why a server failed (debug)",
}


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes (as ``logging.lastResort`` does)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


_handler: logging.Handler | None = None


def configure_logging(level: str) -> None:
    """Send flowkernel's log records (loggers ``flowkernel.*``) to stderr, one line each with its time,
    level and logger, at ``level`` and above. The library only logs; the command line says where to."""
    global _handler
    logger = logging.getLogger("flowkernel")
    if _handler is None:  # once, however many times main() runs in one process
        _handler = _Stderr()
        _handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
                                                "%Y-%m-%d %H:%M:%S"))
        logger.addHandler(_handler)
    logger.setLevel(level.upper())
