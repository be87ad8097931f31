"""Flow files on disk: reading a JSON (or YAML) document (its content address is ``core.canonical``). No pydantic here:
resuming a stored run needs neither validation nor its import cost."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from flowkernel.core.nesting import MAX_DEPTH, deep_point, describe
from flowkernel.errors import FlowFileError
from flowkernel.flowfiles.localfiles import (
    DEFAULT_MAX_FLOW_BYTES,
    MAX_FLOW_BYTES_ENV,
    limit_from_env,
    read_limited,
)


def read_flow_document(path: Path) -> tuple[Any, str]:
    """Read a flow file as a JSON (or YAML) document; returns the document and its text.

    The file must be a regular file of at most ``FLOWKERNEL_MAX_FLOW_BYTES`` (10 MiB by default). An
    error names the file, the line and the column, never the offending text: a child flow's load error
    is recorded in its parent's event log.
    """
    limit = limit_from_env(MAX_FLOW_BYTES_ENV, DEFAULT_MAX_FLOW_BYTES)
    raw = read_limited(path, limit, "flow file", FlowFileError)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FlowFileError(f"{path}: not UTF-8 text (byte {exc.start} cannot be decoded)") from None
    if path.suffix in (".yaml", ".yml"):
        return _load_yaml(path, text), text
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise FlowFileError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    except RecursionError:
        point = deep_point(text, MAX_DEPTH)
        if point is not None and point.beyond:
            raise FlowFileError(f"{path}:{point.line}:{point.column}: not a flow: arrays and objects nested more "
                                f"than {MAX_DEPTH} levels deep (a flow may nest at most {MAX_DEPTH})") from None
        raise FlowFileError(f"{path}: not a flow: {describe(text, MAX_DEPTH)}") from None
    except ValueError as exc:  # NaN / Infinity, or an integer of more digits than Python converts
        raise FlowFileError(f"{path}: not valid JSON: {exc}") from None
    return data, text


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _load_yaml(path: Path, text: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise FlowFileError(f"{path}: YAML flows need PyYAML (pip install pyyaml)") from None

    class Loader(yaml.SafeLoader):
        """No aliases: ``*a`` repeats a value without copying it, so a few lines can stand for a
        document of billions of nodes once it is written out as JSON."""

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.MarkedYAMLError(problem="aliases (*name) are not allowed in a flow file",
                                           problem_mark=mark)
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = exc.problem or exc.context
        if exc.problem and exc.context and exc.problem.startswith("but "):  # one sentence in two halves
            problem = f"{exc.context}, {exc.problem}"
        raise FlowFileError(f"{path}{where}: not valid YAML: {_without_quotes(problem)}") from None
    except yaml.YAMLError:
        raise FlowFileError(f"{path}: not valid YAML") from None
    except RecursionError:
        raise FlowFileError(f"{path}: not a flow: nested too deeply") from None


def _without_quotes(problem: str | None) -> str:
    """YAML's message in words: the tokens it names (``'<block end>'``, ``','``) said plainly, and any
    other text it quotes from the file left out (the file's text never goes into an error: a flow file
    may hold a secret, and errors are stored in runs' logs)."""
    return re.sub(r"'[^']*'|\"[^\"]*\"|<[a-z ]+>", _token, problem or "malformed")


# What PyYAML calls the tokens its messages name.
_TOKENS = {
    "<stream end>": "the end of the file", "<stream start>": "the start of the file",
    "<block end>": "the end of the indented block", "<block mapping start>": "a new indented mapping",
    "<block sequence start>": "a new indented list", "<block entry>": "a list item ('-')",
    "<document start>": "a document start ('---')", "<document end>": "a document end ('...')",
    "<directive>": "a directive ('%')", "<alias>": "an alias ('*')", "<anchor>": "an anchor ('&')",
    "<tag>": "a tag ('!')", "<scalar>": "a value", "<key>": "a key", "<value>": "a value (':')",
}


def _token(match: re.Match[str]) -> str:
    quoted = match.group(0)
    text = quoted[1:-1] if quoted[0] in "'\"" else quoted
    if text in _TOKENS:
        return _TOKENS[text]
    if len(text) == 1 or (text.startswith("\\") and len(text) <= 6):  # one character ('?', '\\t'): not a secret
        return f"'{text}'"
    return "(quoted text left out)"
