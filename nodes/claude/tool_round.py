"""The tools of a ``claude.agent`` node run and one assistant turn's round of tool calls.

A node's tools are its registered Python functions (``tools``) and the tools its MCP servers offer
(``mcpServers``, ``flowkernel.agents.mcp``), named ``mcp__<server>__<tool>``. Every server's tools
join, unless ``tools`` names some of a server's: then only those of that server do.

The calls of one turn run concurrently (at most ``maxParallelTools`` at a time); each is stored (a tool-call row), evented (``agent:tool``),
timed, truncated and traced, whatever kind of tool it is. A tool that raises, or an MCP tool that
answers ``isError``, is a failed call the model is told about; an MCP *server* that breaks or does
not answer in time fails the node run (``agent:error`` ``error_mcp_server``, naming the server and
its stderr's tail), the other calls of the round cancelled.

Each call has an idempotency key, ``<node run id>:<tool use id>`` of the node run that received the
tool_use block: a Python tool gets it as ``ToolContext.idempotency_key``, an MCP tool in the request's
``_meta`` (``{"idempotencyKey": …}``). A call cut short by a crash runs again on resume (``resume.py``)
with the same key; a call whose result is stored never runs again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import anyio
from flowkernel.agents.mcp import McpServerError, McpServers, McpTool, server_of
from flowkernel.agents.tools import ASK_HUMAN, Tool, ToolContext, as_tool, result_text, truncate
from flowkernel.core.events import AgentError, AgentTool
from flowkernel.core.node_context import NodeContext
from flowkernel.errors import NodeFailure
from flowkernel.nodes.claude import spans
from flowkernel.nodes.claude.config import AgentConfig
from flowkernel.nodes.claude.transcript import Transcript

MCP_SERVER_ERROR = "error_mcp_server"


def python_tools(ctx: NodeContext, cfg: AgentConfig) -> dict[str, Tool]:
    """The registered tools ``tools`` names (``ask_human`` and MCP tools aside)."""
    tools: dict[str, Tool] = {}
    for name in cfg.tools:
        if name == ASK_HUMAN or server_of(name) in cfg.mcp_server_names:
            continue
        entry = ctx.registry.tools.get(name)
        if entry is None:
            known = ", ".join(sorted([*ctx.registry.tools, ASK_HUMAN]))
            raise NodeFailure(f"node {ctx.node_id!r}: no tool {name!r} (known: {known}); register it "
                              "with Registry.add_tool, --plugin MODULE or the flowkernel.tools entry point",
                              "invalid_input")
        tools[name] = as_tool(name, entry)
    return tools


def mcp_tools(ctx: NodeContext, cfg: AgentConfig, servers: McpServers | None) -> dict[str, McpTool]:
    """The servers' tools that join the node's: all of a server's, or those ``tools`` names."""
    if servers is None:
        return {}
    offered = servers.tools()
    named = {n for n in cfg.tools if server_of(n) is not None}
    chosen: dict[str, McpTool] = {}
    for server in cfg.mcp_server_names:
        own = {t.name: t for t in offered if t.server == server}
        wanted = {n for n in named if server_of(n) == server}
        for name in sorted(wanted - set(own)):
            raise NodeFailure(f"node {ctx.node_id!r}: `tools` names {name!r}, but MCP server {server!r} offers no "
                              f"such tool (it offers: {', '.join(sorted(own)) or 'none'})", "invalid_input")
        chosen.update({n: t for n, t in own.items() if not wanted or n in wanted})
    return chosen


def server_failed(ctx: NodeContext, exc: McpServerError, **details: Any) -> NodeFailure:
    """``agent:error`` for a server that broke, and the node failure to raise for it."""
    info = {"server": exc.server, "stderrTail": exc.stderr_tail, **details}
    ctx.emit(AgentError(errorType=MCP_SERVER_ERROR, message=str(exc), details=info))
    return NodeFailure(f"node {ctx.node_id!r}: {exc}", MCP_SERVER_ERROR, info)


@dataclass(slots=True)
class Toolbox:
    """Every tool a node run can call, by the name the model sees."""

    python: dict[str, Tool]
    mcp: dict[str, McpTool] = field(default_factory=dict)
    servers: McpServers | None = None

    def definitions(self) -> list[dict[str, Any]]:
        return [*(t.definition() for t in self.python.values()), *(t.definition() for t in self.mcp.values())]

    def names(self) -> list[str]:
        return sorted([*self.python, *self.mcp])


class ToolRound:
    """Runs the tool calls of assistant turns; each result lands in ``resolved`` (by tool use id)."""

    def __init__(self, ctx: NodeContext, cfg: AgentConfig, toolbox: Toolbox,
                 resolved: dict[str, tuple[str, bool]]) -> None:
        self.ctx, self.cfg, self.toolbox, self.resolved = ctx, cfg, toolbox, resolved

    async def run(self, transcript: Transcript, content: list[dict[str, Any]], message_id: int | None,
                  step: int, *, received_by: str | None = None) -> None:
        """Run the message's tool calls concurrently; ``ask_human`` is left for the turn boundary.
        ``received_by``: the node run that stored the message (this one when None), for the keys."""
        calls = [b for b in content if b.get("type") == "tool_use" and b.get("name") != ASK_HUMAN]
        failure: list[NodeFailure] = []
        limit = anyio.CapacityLimiter(self.cfg.max_parallel_tools or max(len(calls), 1))
        node_run = received_by or self.ctx.run_id

        async def one(block: dict[str, Any]) -> None:
            try:
                async with limit:
                    await self._run_tool(transcript, block, message_id, step, f"{node_run}:{block.get('id')}")
            except NodeFailure as exc:  # the first one is raised below, unwrapped; the others are cancelled
                failure.append(exc)
                tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            for block in calls:
                tg.start_soon(one, block)
        if failure:
            raise failure[0]

    async def _call(self, name: str, use_id: str, tool_input: Any, key: str) -> tuple[str, bool]:
        """The tool's result text (not yet truncated) and whether it is an error."""
        box = self.toolbox
        mcp_tool = box.mcp.get(name)
        if mcp_tool is not None and box.servers is not None:
            try:
                return await box.servers.call(mcp_tool, tool_input if isinstance(tool_input, dict) else {}, key)
            except McpServerError as exc:
                raise server_failed(self.ctx, exc, toolName=name, toolUseId=use_id) from None
        tool = box.python.get(name)
        if tool is None:
            raise LookupError(f"no tool named {name!r} is available to this agent "
                              f"(available: {', '.join(box.names()) or 'none'})")
        context = ToolContext(idempotency_key=key, tool_use_id=use_id, node_id=self.ctx.node_id,
                              run_id=self.ctx.flow_run_id)
        return result_text(await tool.call(tool_input, context)), False

    async def _run_tool(self, transcript: Transcript, block: dict[str, Any], message_id: int | None,
                        step: int, key: str) -> None:
        ctx, limit = self.ctx, self.cfg.tool_result_max_bytes
        name, use_id, tool_input = str(block.get("name")), str(block.get("id")), block.get("input") or {}
        began = time.monotonic()
        error: str | None = None
        with spans.tool(name, use_id, tool_input) as span:
            try:
                text, is_error = await self._call(name, use_id, tool_input, key)
                text = truncate(text, limit)
                if is_error:
                    error = text
            except NodeFailure:
                raise
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                text = truncate(error, limit)
            spans.tool_done(span, text, error)
        duration = int((time.monotonic() - began) * 1000)
        self.resolved[use_id] = (text, error is not None)
        transcript.add_tool_call({"messageId": message_id, "toolName": name, "toolUseId": use_id,
                                  "input": tool_input, "output": text, "step": step, "durationMs": duration,
                                  "status": "error" if error else "completed"})
        ctx.emit(AgentTool(toolName=name, toolUseId=use_id, toolInput=tool_input, toolOutput=text,
                           durationMs=duration, error=error))
        if error is not None:
            ctx.emit(AgentError(errorType="error_tool_use", message=f"tool {name!r} failed: {error}",
                                details={"toolName": name, "toolUseId": use_id}))
