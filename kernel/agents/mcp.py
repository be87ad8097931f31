"""Model Context Protocol servers as tools of an agent node: their input, their lifetime, their calls.

A node's ``mcpServers`` maps a server name to how to reach it: ``{"command", "args"?, "env"?, "cwd"?}``
starts a process and speaks MCP over its stdin/stdout, ``{"url", "headers"?}`` speaks streamable HTTP.
Each may bound its start (``startTimeout``, seconds: spawn, handshake and tool list) and its calls
(``callTimeout``). The servers' tools join the node's tools as ``mcp__<server>__<tool>``.

``open_servers`` starts every server of one node run and stops them all when the node run ends,
however it ends (an answer, a pause, an abort, a timeout: the task is cancelled, and the ``mcp``
package's stdio transport kills the process group). Each connection is entered and left by one
task of its own, which never raises: a connection that breaks is recorded, and the calls made to it
fail with ``McpServerError`` naming the server and the tail of its stderr. A server that cannot
start, dies during a call or does not answer within its bound is such an error; a tool that
answers ``isError`` is not (the model is told, as for a Python tool that raises).

The ``mcp`` package is an optional extra (``pip install 'flowkernel[mcp]'``) and costs seconds to
import: nothing here imports it until a server is started.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import re
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO, cast

import anyio
from anyio.abc import TaskStatus
from flowkernel.errors import Problem

if TYPE_CHECKING:
    from mcp import ClientSession

log = logging.getLogger("flowkernel.agents.mcp")

PREFIX = "mcp__"
EXTRA_HINT = "pip install 'flowkernel[mcp]'"
DEFAULT_START_TIMEOUT = 30.0
DEFAULT_CALL_TIMEOUT = 300.0
STDERR_TAIL_BYTES = 2000
SERVER_NAME = re.compile(r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$")  # no "__": it separates server and tool
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")  # what the Messages API takes as a tool name
STDIO_KEYS = frozenset({"command", "args", "env", "cwd", "startTimeout", "callTimeout"})
HTTP_KEYS = frozenset({"url", "headers", "startTimeout", "callTimeout"})
SHAPE = ('{"command": TEXT, "args"?: [TEXT], "env"?: {NAME: TEXT}, "cwd"?: TEXT} (stdio) or '
         '{"url": "http(s)://…", "headers"?: {NAME: TEXT}} (streamable HTTP)')


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """How to reach one server (``command`` or ``url``) and how long to wait for it."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None
    start_timeout: float = DEFAULT_START_TIMEOUT
    call_timeout: float = DEFAULT_CALL_TIMEOUT


@dataclass(frozen=True, slots=True)
class McpTool:
    """A tool a server offers, under the name the model sees (``mcp__<server>__<tool>``)."""

    name: str
    server: str
    tool: str
    description: str
    input_schema: dict[str, Any]

    def definition(self) -> dict[str, Any]:
        """The entry of the Messages API ``tools`` list."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


class McpServerError(Exception):
    """A server that could not start, broke or did not answer in time (not a tool's own error)."""

    def __init__(self, server: str, what: str, stderr_tail: str | None = None) -> None:
        tail = f"; its stderr ends with: {stderr_tail}" if stderr_tail else ""
        super().__init__(f"MCP server {server!r} {what}{tail}")
        self.server = server
        self.stderr_tail = stderr_tail


def tool_name(server: str, tool: str) -> str:
    return f"{PREFIX}{server}__{tool}"


def server_of(name: str) -> str | None:
    """The server an ``mcp__<server>__<tool>`` name belongs to (None for any other name)."""
    if not name.startswith(PREFIX) or "__" not in name[len(PREFIX):]:
        return None
    return name[len(PREFIX):].split("__", 1)[0]


def available() -> bool:
    """Whether the ``mcp`` package can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("mcp") is not None
    except (ImportError, ValueError):
        return False


def _binding(value: Any) -> bool:
    return isinstance(value, str) and "{{" in value


def _texts(value: Any, where: str, problems: list[Problem], what: str) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(item, str):
                problems.append(Problem(f"{where}.{key}", f"must be a string ({what})"))
    elif not _binding(value):
        problems.append(Problem(where, f"must be an object of strings ({what})"))


def check_servers(value: Any, path: str, problems: list[Problem]) -> None:
    """Append every problem with an ``mcpServers`` value at ``path`` (bindings are taken on trust)."""
    if value is None or _binding(value):
        return
    if not isinstance(value, dict):
        problems.append(Problem(path, f"must be an object: server name -> {SHAPE}"))
        return
    if value and not available():
        problems.append(Problem(path, f"MCP servers need the `mcp` package, which is not installed: {EXTRA_HINT}"))
    for name, spec in value.items():
        where = f"{path}.{name}"
        if not SERVER_NAME.match(name):
            problems.append(Problem(where, "a server name is letters, digits, '-' and single '_' (tools are "
                                           "named mcp__<server>__<tool>)"))
        if _binding(spec):
            continue
        if not isinstance(spec, dict) or ("command" in spec) == ("url" in spec):
            problems.append(Problem(where, f"must be {SHAPE}"))
            continue
        keys = STDIO_KEYS if "command" in spec else HTTP_KEYS
        for key in sorted(set(spec) - keys):
            problems.append(Problem(f"{where}.{key}", f"unknown key; this server takes {', '.join(sorted(keys))}"))
        command, url = spec.get("command"), spec.get("url")
        if "command" in spec and (not isinstance(command, str) or not command):
            problems.append(Problem(f"{where}.command", "must be a non-empty string (the program to start)"))
        if "url" in spec and not (_binding(url) or (isinstance(url, str) and url.startswith(("http://", "https://")))):
            problems.append(Problem(f"{where}.url", "must be an http:// or https:// URL (streamable HTTP)"))
        args = spec.get("args")
        if args is not None and not _binding(args) and (
                not isinstance(args, list) or not all(isinstance(a, str) for a in args)):
            problems.append(Problem(f"{where}.args", "must be a list of strings"))
        if spec.get("cwd") is not None and not isinstance(spec["cwd"], str):
            problems.append(Problem(f"{where}.cwd", "must be a string (a folder)"))
        for key, what in (("env", "environment variables"), ("headers", "HTTP headers")):
            if spec.get(key) is not None:
                _texts(spec[key], f"{where}.{key}", problems, what)
        for key in ("startTimeout", "callTimeout"):
            limit = spec.get(key)
            if limit is not None and not _binding(limit) and (
                    not isinstance(limit, int | float) or isinstance(limit, bool) or not 0 < limit < math.inf):
                problems.append(Problem(f"{where}.{key}", "must be a positive number of seconds"))


def parse_servers(value: Any) -> tuple[ServerSpec, ...]:
    """The servers of a checked ``mcpServers`` value, in the order given."""
    specs: list[ServerSpec] = []
    for name, spec in (value or {}).items():
        start = float(spec.get("startTimeout", DEFAULT_START_TIMEOUT))
        call = float(spec.get("callTimeout", DEFAULT_CALL_TIMEOUT))
        if "command" in spec:
            specs.append(ServerSpec(name, command=spec["command"], args=tuple(spec.get("args") or ()),
                                    env=spec.get("env"), cwd=spec.get("cwd"), start_timeout=start, call_timeout=call))
        else:
            specs.append(ServerSpec(name, url=spec["url"], headers=spec.get("headers"), start_timeout=start,
                                    call_timeout=call))
    return tuple(specs)


def result_text(result: Any) -> tuple[str, bool]:
    """A ``CallToolResult`` as the text the model is sent, and whether the tool reported an error:
    text blocks as they are, other blocks as their JSON, structured content when nothing else came."""
    parts: list[str] = []
    for block in result.content or []:
        if getattr(block, "type", None) == "text":
            parts.append(block.text)
        else:
            parts.append(json.dumps(block.model_dump(by_alias=True, exclude_none=True, mode="json"),
                                    ensure_ascii=False))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts), bool(result.is_error)


@dataclass(slots=True)
class _Connection:
    """One server: its owner task enters and leaves the transport and the session (``serve``)."""

    spec: ServerSpec
    session: ClientSession | None = None
    tools: list[McpTool] = field(default_factory=list)
    failure: str | None = None  # what broke, once something did
    _stop: anyio.Event = field(default_factory=anyio.Event)
    _errlog: TextIO | None = None
    _tail: str | None = None  # the stderr tail, kept when the server's connection is closed

    def stderr_tail(self) -> str | None:
        """The last lines the server wrote to its stderr (stdio servers), on one line."""
        if self._errlog is None or self._errlog.closed:
            return self._tail
        fd = self._errlog.fileno()
        size = os.fstat(fd).st_size
        data = os.pread(fd, STDERR_TAIL_BYTES, max(0, size - STDERR_TAIL_BYTES))
        lines = [line.strip() for line in data.decode("utf-8", errors="replace").splitlines() if line.strip()]
        return " | ".join(lines[-10:]) or None

    def error(self, what: str) -> McpServerError:
        return McpServerError(self.spec.name, what, self.stderr_tail())

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the server, list its tools, then hold the connection until ``stop``. Never raises
        (but for cancellation): a failure is kept in ``failure`` for the callers to report."""
        spec, started = self.spec, False
        if spec.command is not None:
            # A real file (the child writes to it directly), read from its end when something fails.
            self._errlog = cast(TextIO, tempfile.TemporaryFile("w+", encoding="utf-8"))  # noqa: SIM115 (closed in finally)
        try:
            # The start bound is a deadline on this task's scope, lifted once started (a narrower
            # scope could not be left while the transport's own task groups are open).
            with anyio.CancelScope(deadline=anyio.current_time() + spec.start_timeout) as scope:
                async with AsyncExitStack() as stack:
                    session = await self._connect(stack)
                    await session.initialize()
                    self.tools = await self._list_tools(session)
                    scope.deadline = math.inf
                    self.session, started = session, True
                    task_status.started()
                    await self._stop.wait()
            if scope.cancelled_caught and not started:
                self.failure = f"did not start within {spec.start_timeout:g}s (startTimeout)"
        except Exception as exc:  # anything the transport raises: kept for the callers, never a crash here
            self.failure = ("died" if started else "could not start") + f" ({_leaf(exc)})"
            log.debug("MCP server %r: %s", spec.name, self.failure)
        finally:
            self.session = None
            if self._errlog is not None:
                self._tail = self.stderr_tail()
                self._errlog.close()
            if not started:
                task_status.started()

    async def _connect(self, stack: AsyncExitStack) -> ClientSession:
        from mcp import ClientSession, StdioServerParameters, stdio_client

        spec = self.spec
        if spec.url is not None:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            http = await stack.enter_async_context(create_mcp_http_client(headers=dict(spec.headers or {})))
            read, write = await stack.enter_async_context(streamable_http_client(spec.url, http_client=http))
        else:
            assert spec.command is not None and self._errlog is not None
            params = StdioServerParameters(command=spec.command, args=list(spec.args),
                                           env=dict(spec.env) if spec.env is not None else None, cwd=spec.cwd)
            read, write = await stack.enter_async_context(stdio_client(params, errlog=self._errlog))
        return await stack.enter_async_context(ClientSession(read, write))

    async def _list_tools(self, session: ClientSession) -> list[McpTool]:
        from mcp_types import PaginatedRequestParams

        tools: list[McpTool] = []
        cursor: str | None = None
        while True:
            page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            for t in page.tools:
                name = tool_name(self.spec.name, t.name)
                if not TOOL_NAME.match(name):
                    log.warning("MCP server %r: tool %r left out: %r is not a name the Messages API takes",
                                self.spec.name, t.name, name)
                    continue
                tools.append(McpTool(name, self.spec.name, t.name, t.description or t.title or "",
                                     dict(t.input_schema)))
            cursor = page.next_cursor
            if not cursor:
                return tools

    def stop(self) -> None:
        self._stop.set()

    async def call(self, tool: str, arguments: dict[str, Any], idempotency_key: str) -> tuple[str, bool]:
        """Call ``tool``; its text and error flag, or ``McpServerError`` when the server fails."""
        session = self.session
        if session is None:
            raise self.error(self.failure or "is not running")
        try:
            with anyio.fail_after(self.spec.call_timeout):
                result = await session.call_tool(tool, arguments, meta=_meta(idempotency_key))
        except TimeoutError:
            raise self.error(f"did not answer tools/call {tool!r} within {self.spec.call_timeout:g}s "
                             "(callTimeout)") from None
        except Exception as exc:
            raise self.error(f"failed during tools/call {tool!r} ({_leaf(exc)})") from None
        if getattr(result, "content", None) is None:
            raise self.error(f"answered tools/call {tool!r} with a result that is not a tool result")
        return result_text(result)


def _meta(idempotency_key: str) -> Any:
    """The ``_meta`` of a tools/call request: the call's idempotency key (an open map in MCP)."""
    from mcp_types import RequestParamsMeta

    return RequestParamsMeta(idempotencyKey=idempotency_key)  # type: ignore[typeddict-unknown-key]


def _leaf(exc: BaseException) -> str:
    """The first leaf of nested exception groups, as ``Type: message``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


class McpServers:
    """The running servers of one node run and the tools they offer."""

    def __init__(self, connections: list[_Connection]) -> None:
        self._by_name = {c.spec.name: c for c in connections}

    def tools(self) -> list[McpTool]:
        return [t for c in self._by_name.values() for t in c.tools]

    async def call(self, tool: McpTool, arguments: dict[str, Any], idempotency_key: str) -> tuple[str, bool]:
        return await self._by_name[tool.server].call(tool.tool, arguments, idempotency_key)


@asynccontextmanager
async def open_servers(specs: tuple[ServerSpec, ...]) -> AsyncIterator[McpServers]:
    """Start ``specs`` together; ``McpServerError`` for the first that cannot start. All of them are
    stopped when the block is left, however it is left. What the block raises comes out as it was
    raised (not wrapped in the owners' task group's exception group)."""
    connections = [_Connection(spec) for spec in specs]
    raised: list[Exception] = []
    async with anyio.create_task_group() as owners:
        try:
            async with anyio.create_task_group() as starting:
                for c in connections:
                    starting.start_soon(owners.start, c.serve)
            failed = next((c for c in connections if c.failure is not None), None)
            if failed is not None:
                raised.append(failed.error(failed.failure or "could not start"))
            else:
                try:
                    yield McpServers(connections)
                except Exception as exc:  # re-raised below, once the servers are stopped
                    raised.append(exc)
        finally:
            for c in connections:
                c.stop()
    if raised:
        raise raised[0]
