"""The default ``SessionQuery`` (``flowkernel.agents.sessions``): a Claude Code session driven through
the Claude Agent SDK's ``ClaudeSDKClient`` and the CLI its wheel bundles.

Each session runs hermetic: a ``HOME`` and ``CLAUDE_CONFIG_DIR`` of its own (removed afterwards: the
transcript lives in the run's store, mirrored eagerly through the ``SessionStore`` the node gives),
no user or project settings unless the node asks (``setting_sources=[]``), no nonessential traffic.
The CLI runs under ``cli_supervisor.py``, so stopping the session (its end, a pause, an abort, a
timeout, the worker's death) stops the CLI and every process its tools started. Messages come out
as JSON (``message_json``); ``claude_agent_sdk`` is imported on the first session only (it takes
about two seconds).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
import warnings
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from flowkernel.agents.sessions import Permission, SessionRequest

log = logging.getLogger("flowkernel.agents.claude_sdk")
SUPERVISOR = Path(__file__).with_name("cli_supervisor.py")
STOP_TIMEOUT_S = 10.0

_BLOCKS = {"TextBlock": "text", "ThinkingBlock": "thinking", "ToolUseBlock": "tool_use",
           "ToolResultBlock": "tool_result", "ServerToolUseBlock": "server_tool_use"}
_MESSAGES = {"AssistantMessage": "assistant", "UserMessage": "user", "ResultMessage": "result",
             "StreamEvent": "stream_event"}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kind = _BLOCKS.get(type(value).__name__)
        fields = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"type": kind, **fields} if kind else fields
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def message_json(message: Any) -> dict[str, Any]:
    """An SDK message as JSON: ``{"type": …, <its fields>}``, content blocks as Messages API blocks."""
    name = type(message).__name__
    kind = _MESSAGES.get(name) or ("system" if hasattr(message, "subtype") and hasattr(message, "data") else name)
    body = _plain(message)
    return {"type": kind, **(body if isinstance(body, dict) else {"value": body})}


def sdk_options(request: SessionRequest) -> dict[str, Any]:
    """``ClaudeAgentOptions`` keyword arguments for the JSON options of ``request``."""
    o = request.options
    out: dict[str, Any] = {"cwd": o["cwd"], "setting_sources": list(o.get("settingSources") or []),
                           "include_partial_messages": True}
    if o.get("resume"):
        out["resume"] = o["resume"]
    elif o.get("sessionId"):
        out["session_id"] = o["sessionId"]
    simple = {"model": "model", "systemPrompt": "system_prompt", "allowedTools": "allowed_tools",
              "disallowedTools": "disallowed_tools", "permissionMode": "permission_mode", "maxTurns": "max_turns",
              "maxBudgetUsd": "max_budget_usd", "effort": "effort", "mcpServers": "mcp_servers"}
    for key, name in simple.items():
        if o.get(key) is not None:
            out[name] = o[key]
    thinking = o.get("thinking")
    if thinking:
        out["thinking"] = {"type": "enabled", "budget_tokens": thinking["budgetTokens"]} \
            if "budgetTokens" in thinking else {"type": thinking["type"]}
    if o.get("outputSchema") is not None:
        out["output_format"] = {"type": "json_schema", "schema": o["outputSchema"]}
    return out


class _Live:
    def __init__(self, client: Any, prompt: str) -> None:
        self.client = client
        self.prompt = prompt

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        from claude_agent_sdk import ResultMessage

        async for message in self.client.receive_messages():
            yield message_json(message)
            if isinstance(message, ResultMessage):
                return

    async def send(self, text: str) -> None:
        await self.client.query(text)

    async def interrupt(self) -> None:
        await self.client.interrupt()


class SdkSessionQuery:
    """Sessions of the bundled Claude Code CLI. ``env``: variables laid over the process's own for the
    CLI (``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``, …); ``cli``: another CLI binary."""

    def __init__(self, env: Mapping[str, str] | None = None, *, cli: str | None = None) -> None:
        self.env = dict(env or {})
        self.cli = cli

    @asynccontextmanager
    async def open(self, request: SessionRequest, *, node_id: str, store: Any, permission: Permission | None,
                   call: int = 0) -> AsyncIterator[_Live]:
        from claude_agent_sdk import CanUseToolShadowedWarning, ClaudeAgentOptions, ClaudeSDKClient

        home = Path(tempfile.mkdtemp(prefix="flowkernel-cc-"))
        stderr: list[str] = []
        try:
            options = ClaudeAgentOptions(**sdk_options(request), env=self._env(home),
                                         cli_path=str(self._wrapper(home)), stderr=stderr.append,
                                         session_store=store, session_store_flush="eager",
                                         can_use_tool=_can_use_tool(permission, request) if permission else None)
            client = ClaudeSDKClient(options)
            ended = False
            try:
                with warnings.catch_warnings():
                    # Allowed tools are meant to pass without asking: the callback is for the others.
                    warnings.simplefilter("ignore", CanUseToolShadowedWarning)
                    await client.connect()
                await client.query(request.prompt)
                yield _Live(client, request.prompt)
                ended = True
            except Exception as exc:
                if stderr:
                    exc.add_note("the Claude Code CLI said: " + "".join(stderr)[-2000:])
                    log.warning("node %s: the Claude Code CLI said: %s", node_id, "".join(stderr)[-2000:])
                raise
            finally:
                with anyio.CancelScope(shield=True):
                    if not ended:  # stopped midway (pause, abort, timeout, failure): the whole tree, now
                        _stop_supervisor(home)
                    with anyio.move_on_after(STOP_TIMEOUT_S):
                        await client.disconnect()
                    _stop_supervisor(home)
        finally:
            shutil.rmtree(home, ignore_errors=True)

    def _env(self, home: Path) -> dict[str, str]:
        return {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", **self.env, "HOME": str(home),
                "CLAUDE_CONFIG_DIR": str(home / ".claude"),
                "FLOWKERNEL_CC_CLI": self.cli or bundled_cli_path()}

    def _wrapper(self, home: Path) -> Path:
        """The ``cli_path`` the SDK starts: the supervisor, which notes its pid in ``home``."""
        script = home / "claude"
        script.write_text(f'#!/bin/sh\necho $$ > "{home}/cli.pid"\nexec "{sys.executable}" "{SUPERVISOR}" "$@"\n')
        script.chmod(0o755)
        return script


def _stop_supervisor(home: Path) -> None:
    """SIGTERM the supervisor if it still runs: it stops the CLI and kills what is left of its tree."""
    try:
        pid = int((home / "cli.pid").read_text().strip())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass


def bundled_cli_path() -> str:
    """The Claude Code CLI the installed ``claude-agent-sdk`` wheel bundles."""
    import claude_agent_sdk

    return str(Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude")


def _can_use_tool(permission: Permission, request: SessionRequest) -> Any:
    from claude_agent_sdk import PermissionResultAllow, PermissionResultDeny

    async def decide(tool_name: str, tool_input: dict[str, Any], context: Any) -> Any:
        answer = await permission(tool_name, tool_input, str(getattr(context, "tool_use_id", "") or ""))
        if answer.get("allow"):
            return PermissionResultAllow()
        return PermissionResultDeny(message=str(answer.get("reason") or "denied by a human"),
                                    interrupt=bool(answer.get("interrupt")))

    return decide
