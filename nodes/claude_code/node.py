"""``claude.code``: a Claude Code session (Claude Agent SDK) as a durable node (DESIGN §7b).

One node run:

1. find the session: the one the node runs this one continues worked in (after a crash, a pause, a
   reply), else the node's earlier session in this run (a loop pass goes on with it), else a new id
   the kernel mints; ``agent:start`` with it is committed before the CLI starts (``agentSessions``);
2. a session that finished before an interruption (its ``agent:complete`` is in the log) is not run
   again: its result stands. A session the store holds is resumed with the resume message (default
   ``continue``), never with the prompt again; one it does not hold starts with the prompt;
3. the session's messages become events and stored history (``stream.py``) as they come; its
   transcript is mirrored into the run's store (``RunSessionStore``), so any worker can resume it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
from flowkernel.agents.session_store import RunSessionStore
from flowkernel.agents.sessions import SERVICE, LiveSession, SessionQuery, SessionRequest, run_workspace
from flowkernel.core.events import AgentComplete, AgentError, AgentStart, NodeStart, NodeWaiting, decode
from flowkernel.core.node import WaitFor
from flowkernel.core.node_context import NodeContext
from flowkernel.errors import InvalidInputError, NodeFailure, Problem
from flowkernel.flowfiles.localfiles import is_inside, resolve_inside
from flowkernel.history.lineage import Lineage, find_lineage
from flowkernel.nodes.claude.pricing import price_table
from flowkernel.nodes.claude.transcript import Transcript
from flowkernel.nodes.claude_code.approvals import REPLY_SCHEMA, Approvals
from flowkernel.nodes.claude_code.config import (
    DEFAULT_RESUME_MESSAGE,
    EXTRA,
    INPUT_SCHEMA,
    CodeConfig,
    check_input,
    parse_config,
    sdk_missing,
)
from flowkernel.nodes.claude_code.stream import SessionStream

SEND_POLL_S = 0.2  # how often a running session's inbox is looked at for sends
_WANTED = (b'"node:start"', b'"agent:start"', b'"agent:complete"', b'"node:waiting"')


class ClaudeCodeNode:
    """The ``claude.code`` node type (DESIGN §7b); input as in ``flowkernel.nodes.claude_code.config``."""

    name = "claude.code"
    input_schema = INPUT_SCHEMA
    takes_messages = True  # a send is a user message at the session's next turn boundary
    records_agent_runs = True  # each node run is an agent run (flowkernel.core.node.RecordsAgentRuns)

    def max_steps(self, node_input: Any) -> int | None:
        value = node_input.get("maxTurns") if isinstance(node_input, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def check(self, raw_input: dict[str, Any], path: str, problems: list[Problem]) -> None:
        if sdk_missing():
            problems.append(Problem(path, f"claude.code needs the Claude Agent SDK, which is not installed: {EXTRA}"))
        check_input(raw_input, path, problems)

    def unavailable(self, who: str, services: Any) -> str | None:
        """Why ``who`` cannot run here: its sessions would call the API (no session query given, no
        fixtures) and no credentials are set (a session's home is its own: no login of the user's)."""
        if services.extra.get(SERVICE) is not None or services.fixtures is not None:
            return None
        from flowkernel.agents.credentials import missing_credentials

        return missing_credentials(who)

    async def run(self, ctx: NodeContext) -> Any:
        cfg = parse_config(ctx.input, ctx.node_id)
        return await _Execution(ctx, cfg).run()

    def session_request_for(self, node_input: Any, node_id: str, *, prompt: str, session_id: str, resumed: bool,
                            cwd: str | None) -> dict[str, Any]:
        """The request (prompt and options, as JSON) a session process of this node sent, rebuilt from its
        resolved input: what ``flowkernel fixtures RUN`` writes for each stored session process."""
        cfg = parse_config(node_input, node_id)
        return SessionRequest(prompt, session_options(cfg, cwd, session_id, resumed)).as_json()


def session_options(cfg: CodeConfig, cwd: str | None, session_id: str, resume: bool) -> dict[str, Any]:
    """The JSON options a session process of ``cfg`` is opened with (``SessionRequest.options``)."""
    options: dict[str, Any] = {"resume": session_id} if resume else {"sessionId": session_id}
    if cwd is not None:
        options["cwd"] = cwd
    given = {"model": cfg.model, "systemPrompt": cfg.system_prompt, "allowedTools": cfg.allowed_tools or None,
             "disallowedTools": cfg.disallowed_tools or None, "permissionMode": cfg.permission_mode,
             "ask": cfg.ask or None, "mcpServers": cfg.mcp_servers or None, "maxTurns": cfg.max_turns,
             "maxBudgetUsd": cfg.max_budget_usd, "thinking": cfg.thinking, "effort": cfg.effort,
             "outputSchema": cfg.output_schema, "settingSources": cfg.setting_sources or None}
    options.update({k: v for k, v in given.items() if v is not None})
    return options


def session_query_for(ctx: NodeContext) -> SessionQuery:
    """The session query this node run uses: ``services.extra["session_query"]`` when given (an
    embedding program, a test), else the run's fixtures replayed (``--fixtures``), else the real SDK."""
    services = ctx.services
    given = services.extra.get(SERVICE)
    if given is not None:
        return given  # type: ignore[no-any-return]
    if services.session_query is not None:  # the run's fixtures (run/setup.query_for)
        return services.session_query(ctx.flow.name)  # type: ignore[no-any-return]
    from flowkernel.agents.claude_sdk import SdkSessionQuery

    return SdkSessionQuery()


def workspace(ctx: NodeContext) -> Path:
    """The folder a node run works in when its input gives no ``cwd``: one per run, node and item, in the
    run's workspace (the same path on every worker: a session's store key is its folder)."""
    suffix = "" if ctx.item is None else f"_{ctx.item}"
    return run_workspace(ctx.flow_run_id) / f"{ctx.node_id}{suffix}"


class _Execution:
    def __init__(self, ctx: NodeContext, cfg: CodeConfig) -> None:
        self.ctx = ctx
        self.cfg = cfg
        self.began = time.monotonic()
        self.calls = 0
        self.approvals = Approvals()
        self.asked: Any = None  # the prompt of the node run this one continues, if it waited for a human

    def _cwd(self) -> Path:
        ctx, cfg = self.ctx, self.cfg
        if cfg.cwd is None:
            folder = workspace(ctx)
            folder.mkdir(parents=True, exist_ok=True)
            return folder
        own = run_workspace(ctx.flow_run_id).resolve()
        given = Path(cfg.cwd).expanduser()
        if given.is_absolute() and is_inside(given.resolve(), [own]):
            folder = given.resolve()  # the run's own workspace (a node before this one made the folder)
        else:
            try:
                folder = resolve_inside(ctx.flow.base_dir, cfg.cwd, f"node {ctx.node_id!r}: input.cwd")
            except InvalidInputError as exc:
                raise NodeFailure(str(exc), "invalid_input") from None
        if not folder.is_dir():
            raise NodeFailure(f"node {ctx.node_id!r}: input.cwd {cfg.cwd!r}: {folder} is not a folder",
                              "invalid_input")
        return folder

    def _history(self, lineage: Lineage) -> tuple[str | None, AgentComplete | None]:
        """The node's earlier session in this run (same forEach item), and the ``agent:complete`` of a
        node run this one continues, if its session finished before the interruption. Counts the
        node's earlier session processes (``self.calls``)."""
        ctx = self.ctx
        items: dict[str, int | None] = {}
        earlier: str | None = None
        finished: AgentComplete | None = None
        for body in ctx.store.read_events(ctx.flow_run_id):
            if not any(t in body for t in _WANTED):
                continue
            ev = decode(body)
            if ev.nodeId != ctx.node_id:
                continue
            if isinstance(ev, NodeStart):
                items[ev.runId or ""] = ev.item
            elif isinstance(ev, AgentStart) and ev.runId != ctx.run_id and items.get(ev.runId or "") == ctx.item:
                earlier = ev.sessionId
                self.calls += 1
            elif isinstance(ev, AgentComplete) and ev.runId in lineage.resumed[1:]:
                finished = ev
            elif isinstance(ev, NodeWaiting) and ev.runId == lineage.previous:
                self.asked = ev.prompt
        return earlier, finished

    def _stored(self, session_id: str) -> bool:
        sessions = self.ctx.store.list_sessions(run_id=self.ctx.flow_run_id)  # type: ignore[attr-defined]
        return any(s.sessionId == session_id for s in sessions)

    async def run(self) -> Any:
        ctx, cfg = self.ctx, self.cfg
        lineage = find_lineage(ctx.store, ctx.flow_run_id, ctx.node_id, ctx.item, ctx.run_id)
        earlier, finished = self._history(lineage)
        session_id = lineage.session() or earlier or _mint()
        if finished is not None:  # the session ended before the interruption: its result stands
            return self._output(finished, session_id, "success")
        cwd = self._cwd()
        resume = self._stored(session_id)
        inbox = ctx.inbox()
        said = [self.approvals.answered(self.asked, m.content) or _text(m.content) if m.kind == "reply"
                else _text(m.content) for m in inbox]
        if resume:
            prompt = "\n\n".join(t for t in said if t) or DEFAULT_RESUME_MESSAGE
        else:  # messages given before the session began go with the prompt
            prompt = "\n\n".join([cfg.prompt, *(t for t in said if t)])
        await ctx.emit_durable(AgentStart(sessionId=session_id, model=cfg.model or "default",
                                          prompt=None if resume else cfg.prompt))
        transcript = Transcript(ctx, session_id)
        transcript.load()
        transcript.add("user", prompt, transcript.steps)
        await ctx.consume_inbox(len(inbox), step=transcript.steps)
        stream = SessionStream(ctx, transcript, price_table(ctx.services.prices), cfg.model or "default")
        request = SessionRequest(prompt, session_options(cfg, str(cwd), session_id, resume))
        query = session_query_for(ctx)
        store = RunSessionStore(ctx.store, ctx.flow_run_id)  # type: ignore[arg-type]  # a Store: SessionRows
        try:
            async with query.open(request, node_id=ctx.node_id, store=store, permission=self.approvals.decide,
                                  call=self.calls) as live, anyio.create_task_group() as tg:
                tg.start_soon(self._forward_sends, live, transcript)
                async for message in live.messages():
                    stream.take(message)
                tg.cancel_scope.cancel()
        except NodeFailure:
            raise
        except Exception as exc:
            notes = "; ".join(getattr(exc, "__notes__", []) or [])
            text = f"node {ctx.node_id!r}: the Claude Code session failed: {type(exc).__name__}: {exc}" + \
                (f" ({notes})" if notes else "")
            ctx.emit(AgentError(errorType="session_error", message=text))
            raise NodeFailure(text, "session_error") from None
        if self.approvals.waiting is not None:  # stopped to ask a human: the session resumes with the answer
            return WaitFor(prompt=self.approvals.waiting, schema=REPLY_SCHEMA)
        return await self._finish(stream, session_id)

    async def _forward_sends(self, live: LiveSession, transcript: Transcript) -> None:
        """Pass each ``send`` delivered to this node run to the live session, which takes it as a user
        message at its next turn boundary; stored, then marked taken, so none is sent twice."""
        ctx = self.ctx
        while True:
            await anyio.sleep(SEND_POLL_S)
            inbox = ctx.inbox()
            if not inbox:
                continue
            for m in inbox:
                if m.kind == "send":
                    text = _text(m.content)
                    await live.send(text)
                    transcript.add("user", text, transcript.steps)
            await ctx.consume_inbox(len(inbox), step=transcript.steps)

    async def _finish(self, stream: SessionStream, session_id: str) -> dict[str, Any]:
        ctx = self.ctx
        result = stream.result
        if result is None:
            message = f"node {ctx.node_id!r}: the Claude Code session ended without a result"
            ctx.emit(AgentError(errorType="session_error", message=message))
            raise NodeFailure(message, "session_error")
        subtype = str(result.get("subtype") or "success")
        if subtype != "success" or result.get("is_error"):
            error_type = subtype if subtype != "success" else "api_error"
            errors = result.get("errors") or [result.get("result") or subtype]
            message = f"node {ctx.node_id!r}: the Claude Code session ended with {error_type}: " + \
                "; ".join(map(str, errors))
            ctx.emit(AgentError(errorType=error_type, message=message,
                                details={k: result.get(k) for k in ("terminal_reason", "api_error_status",
                                                                    "num_turns", "total_cost_usd")}))
            raise NodeFailure(message, error_type)
        structured = result.get("structured_output")
        if self.cfg.output_schema is not None and structured is None:
            message = f"node {ctx.node_id!r}: the session ended without an answer matching outputSchema"
            ctx.emit(AgentError(errorType="error_output_schema", message=message))
            raise NodeFailure(message, "error_output_schema")
        complete = AgentComplete(result=result.get("result") or "", structuredOutput=structured,
                                 usage=dict(stream.usage), modelUsage=result.get("model_usage"),
                                 totalCostUsd=round(stream.cost, 10),
                                 durationMs=int((time.monotonic() - self.began) * 1000),
                                 numTurns=int(result.get("num_turns") or 0))
        # Durable: a crash from here on finds the session finished, and does not run it again.
        await ctx.emit_durable(complete)
        return self._output(complete, session_id, subtype)

    def _output(self, done: AgentComplete, session_id: str, subtype: str) -> dict[str, Any]:
        return {"text": done.result, "structuredOutput": done.structuredOutput, "usage": done.usage,
                "modelUsage": done.modelUsage, "totalCostUsd": done.totalCostUsd, "numTurns": done.numTurns,
                "durationMs": done.durationMs, "sessionId": session_id, "subtype": subtype}


def _mint() -> str:
    import uuid

    return str(uuid.uuid4())


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    import json

    return json.dumps(content, ensure_ascii=False)
