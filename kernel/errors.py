"""The one error hierarchy of flowkernel.

Every error says what is wrong, where (JSON path, node id, run id) and what to do. The CLI prints
``str(error)`` without a traceback and exits with ``error.exit_code``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class FlowkernelError(Exception):
    """Root of all errors flowkernel raises on purpose."""

    exit_code = 1


class InvalidInputError(FlowkernelError):
    """The caller gave something unusable: a flow file, an argument, a command."""

    exit_code = 2


@dataclass(frozen=True)
class Problem:
    """One validation problem: where (a JSON path such as ``$.edges[2].to``) and what."""

    path: str
    message: str

    def __post_init__(self) -> None:
        # Keys and values come from the document: a key "a\nb" must not break the one-line report.
        object.__setattr__(self, "path", self.path.translate(_ESCAPES))
        object.__setattr__(self, "message", self.message.translate(_ESCAPES))

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


# Control characters (and the Unicode line and paragraph separators) as escapes.
_ESCAPES = {c: ascii(chr(c))[1:-1] for c in [*range(0x20), 0x7F, 0x85, 0x2028, 0x2029]}


class FlowValidationError(InvalidInputError):
    """A flow file has one or more problems; all of them are listed."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        noun = "problem" if len(problems) == 1 else "problems"
        lines = [f"{source}: {len(problems)} {noun}"] + [f"  {p}" for p in problems]
        super().__init__("\n".join(lines))


class FlowFileError(InvalidInputError):
    """The flow file cannot be read or parsed at all."""


class RunInputError(InvalidInputError):
    """The run input does not satisfy the flow's ``inputs`` schema; ``problems`` lists (path, message)
    pairs, paths starting at ``input``."""

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


class PatternTimeoutError(InvalidInputError):
    """Matching a regular expression that a JSON Schema brings (``pattern``, ``patternProperties``) ran
    past its time limit (``FLOWKERNEL_EXPR_TIMEOUT_MS``). ``where``: the JSON path of the value below
    the validated instance (``""``, ``.a[0]``); ``keyword``: the JSON path of the schema keyword."""

    def __init__(self, where: str, keyword: str, message: str) -> None:
        super().__init__(message)
        self.where = where
        self.keyword = keyword


class UnknownRunError(InvalidInputError):
    """No run with that id exists in the store."""

    def __init__(self, run_id: str, where: str) -> None:
        super().__init__(f"no run {run_id!r} in {where}; `flowkernel runs` lists the runs there")
        self.run_id = run_id


class CommandRejectedError(InvalidInputError):
    """A command was refused (and recorded as ``command:received`` with ``accepted: false``).

    ``invalid``: the command itself is wrong (no node run named, a node run of another run, a reply
    that does not match its schema), rather than refused by the run's state.
    """

    def __init__(self, message: str, *, invalid: bool = False) -> None:
        super().__init__(message)
        self.invalid = invalid


class NotPooledError(CommandRejectedError):
    """A run a ``flowkernel run`` process started (not queued for the workers) was asked to go on through
    the workers; nothing is recorded."""


class FlowUpdateError(InvalidInputError):
    """A run cannot continue on an updated flow (``resume``/``retry --flow``); ``problems`` lists every
    reason, one line each. Nothing was recorded."""

    def __init__(self, run_id: str, source: str, problems: list[str]) -> None:
        noun = "problem" if len(problems) == 1 else "problems"
        lines = [f"run {run_id} cannot continue on {source}: {len(problems)} {noun} (nothing was recorded)"]
        super().__init__("\n".join(lines + [f"  {p}" for p in problems]))
        self.run_id = run_id
        self.problems = problems


class RunBusyError(FlowkernelError):
    """Another process holds the lease of the run."""


class StoreError(FlowkernelError):
    """The store cannot be opened, read or written."""


class LeaseLostError(FlowkernelError):
    """A commit named a lease that no longer holds the run: another execution took it over.

    The execution that gets it stops and writes nothing more; the run goes on elsewhere."""

    def __init__(self, run_id: str, holder: str | None) -> None:
        whom = f"now held by {holder}" if holder else "since released"
        super().__init__(f"run {run_id}: this execution lost its lease ({whom}); it stops and writes nothing more")
        self.run_id = run_id
        self.holder = holder


class KernelFault(FlowkernelError):
    """The kernel itself failed while executing a run (a bug in flowkernel or in a node type that
    escaped the node's own error handling). The run is marked ``failed`` with the error recorded."""


class NodeFailure(FlowkernelError):
    """Raised by node types for an expected failure; ``error_type`` lands in ``node:error``."""

    def __init__(self, message: str, error_type: str = "node_error", details: Any = None) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.details = details  # JSON for ``node:error`` ``details`` (what a program needs beyond the message)


class ExpressionError(FlowkernelError):
    """A JSONata expression failed to evaluate."""


class ExpressionLimitError(ExpressionError):
    """A JSONata expression went past a time, depth or size limit (``flowkernel.core.expression_bounds``)."""
