"""``claude.agent``: an agent loop over the query function, with tools, stored conversations and resume.

One execution (node run) of the loop:

1. choose the session: ``continue`` (default) uses one stable session per node and flow run, so loop
   passes, retries and resumes all extend the same conversation; ``fresh`` starts a new one per
   execution, but a *resumed* execution always continues the interrupted one's session;
2. rebuild the conversation from the stored rows, save ``agent:start`` durably (the reducer puts
   the session in ``agentSessions``) before any model call, and write what the node runs it continues
   left unwritten: the prompt (first, once), tool calls cut short, a stored answer that stands
   (``resume.py``);
3. at each turn boundary: settle tool_use blocks still without results (from stored tool-call rows;
   ``ask_human`` from a reply, or wait for one), take inbox messages (send, reply, resume) as user
   text, stop if a pause was asked, check the step budgets; then call the model, store its message,
   run its tools concurrently, store each call, and go on until the model ends its turn.

Every row is written when it happens, so a pause (the kernel cancels the task), a crash or a human
wait loses at most the call in flight, and the next execution's first request is exactly the stored
conversation plus what was delivered to it (after a crash or a pause: the resume message).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import anyio
from flowkernel.agents.default import calls_the_api, default_query
from flowkernel.agents.mcp import McpServerError, open_servers, server_of
from flowkernel.agents.query import ModelMessage, QueryFn
from flowkernel.agents.tools import ASK_HUMAN, INTERRUPTED_RESULT, as_tool, result_text
from flowkernel.core.events import (
    USAGE_KEYS,
    AgentCompaction,
    AgentComplete,
    AgentError,
    AgentStart,
    AgentTool,
    AgentUsage,
)
from flowkernel.core.jsonschemas import instance_errors
from flowkernel.core.names import KnownNames
from flowkernel.core.node import INTERRUPTED, Interrupted, WaitFor, unknown_name
from flowkernel.core.node_context import NodeContext
from flowkernel.core.services import RunServices
from flowkernel.errors import NodeFailure, PatternTimeoutError, Problem
from flowkernel.history.lineage import Lineage, find_lineage
from flowkernel.nodes.claude import spans
from flowkernel.nodes.claude.config import (
    DEFAULT_MAX_TURNS,
    INPUT_SCHEMA,
    AgentConfig,
    advise_input,
    build_request,
    check_input,
    parse_config,
)
from flowkernel.nodes.claude.context_window import compaction_at, made_by, same_model, window
from flowkernel.nodes.claude.pricing import Tally, price_table
from flowkernel.nodes.claude.resume import Pickup
from flowkernel.nodes.claude.tool_round import Toolbox, ToolRound, mcp_tools, python_tools, server_failed
from flowkernel.nodes.claude.transcript import Transcript

FINAL_STOPS = frozenset({"end_turn", "stop_sequence", "max_tokens", "refusal", None})
# Stop reasons after which the conversation goes back as it is: a server tool paused the turn, or
# the API paused after compacting the context.
RESEND_STOPS = frozenset({"pause_turn", "compaction"})


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


def _parse_json_answer(text: str) -> Any:
    body = text.strip()
    if body.startswith("```"):  # models like to fence JSON even when told not to
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0]
    return json.loads(body)


async def _schema_problem(text: str, schema: dict[str, Any], ctx: NodeContext) -> tuple[Any, str | None]:
    """The answer's value, and how it fails ``schema`` (None if it does not). Validated off the event loop
    under the run's expression limits: the schema's patterns come from the flow, the value from the model."""
    try:
        value = _parse_json_answer(text)
    except json.JSONDecodeError as exc:
        return None, f"the answer is not JSON ({exc})"

    def check() -> list[tuple[str, str]]:
        return instance_errors(schema, value, schema_at=f"{ctx.node_id}.input.outputSchema")

    try:
        errors = await ctx.off_loop(check)
    except PatternTimeoutError as exc:  # the schema's fault, not the answer's: asking again would not help
        raise NodeFailure(f"node {ctx.node_id!r}: checking the answer against outputSchema: "
                          f"{exc.where.lstrip('.') or '(root)'}: {exc}", "error_output_schema") from None
    if errors:
        return value, "; ".join(f"{where.lstrip('.') or '(root)'}: {message}" for where, message in errors)
    return value, None


class ClaudeAgentNode:
    """The ``claude.agent`` node type (DESIGN §7); input as in ``flowkernel.nodes.claude.config``."""

    name = "claude.agent"
    input_schema = INPUT_SCHEMA
    # On pause the model call or tool round in flight finishes and is stored; then the node stops.
    cooperative_pause = True
    takes_messages = True  # a send is a user message at the next turn boundary
    records_agent_runs = True  # each node run is an agent run (flowkernel.core.node.RecordsAgentRuns)

    def max_steps(self, node_input: Any) -> int | None:
        """The model calls one node run may make: its ``maxTurns``."""
        value = node_input.get("maxTurns") if isinstance(node_input, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else DEFAULT_MAX_TURNS

    def request_for(self, node_input: Any, node_id: str, messages: list[dict[str, Any]],
                    tools: Mapping[str, Any], *, tool_choice: dict[str, Any] | None = None) -> dict[str, Any]:
        """The request a node run with ``node_input`` sends for ``messages`` (``tools``: the registered
        tools), as a fixture's ``input`` records it (``flowkernel.agents.query.ReplaysRequests``): the
        same window of the conversation ``_Execution._request`` sends, with the tool_choice it kept."""
        cfg = parse_config(node_input, node_id)
        definitions = [as_tool(n, tools[n]).definition() for n in cfg.tools if n != ASK_HUMAN and n in tools]
        return build_request(cfg, window(messages, cfg.model).messages, definitions, tool_choice=tool_choice)

    def check(self, raw_input: dict[str, Any], path: str, problems: list[Problem]) -> None:
        check_input(raw_input, path, problems)

    def unavailable(self, who: str, services: RunServices) -> str | None:
        """Why ``who`` cannot run in a process with ``services``: its model calls would go to the API
        (the default query function) and no credentials are set."""
        if not calls_the_api(services.query_fn):
            return None
        from flowkernel.agents.credentials import missing_credentials

        return missing_credentials(who)

    def advise(self, raw_input: dict[str, Any], path: str, notes: list[Problem]) -> None:
        advise_input(raw_input, path, notes)

    def check_names(self, raw_input: dict[str, Any], path: str, known: KnownNames, problems: list[Problem]) -> None:
        tools = raw_input.get("tools")
        if not isinstance(tools, list):
            return
        servers = raw_input.get("mcpServers")
        for i, name in enumerate(tools):
            if isinstance(servers, dict) and server_of(str(name)) in servers:
                continue  # an MCP server's tool: known once the server runs
            if isinstance(name, str) and "{{" not in name and name != ASK_HUMAN and name not in known.tools:
                problems.append(Problem(f"{path}.tools[{i}]", unknown_name("tool", name, [*known.tools, ASK_HUMAN])
                                        + "; register it with --plugin MODULE, the flowkernel.tools entry point "
                                        "or Registry.add_tool"))

    async def run(self, ctx: NodeContext) -> Any:
        cfg = parse_config(ctx.input, ctx.node_id, ctx.services.limits)
        # The run's query function, chosen by the shell (flowkernel.run.setup.query_for).
        query: QueryFn = ctx.services.query_fn or default_query()
        with spans.agent(ctx.node_id, ctx.run_id, cfg.model) as span:
            if cfg.mcp_servers:
                output = await self._with_servers(ctx, cfg, query)
            else:
                output = await _Execution(ctx, cfg, query, Toolbox(python_tools(ctx, cfg))).run()
            spans.agent_done(span, output)
        return output

    async def _with_servers(self, ctx: NodeContext, cfg: AgentConfig, query: QueryFn) -> Any:
        """Run with the node's MCP servers, started for this node run and stopped when it ends."""
        python = python_tools(ctx, cfg)
        try:
            async with open_servers(cfg.mcp_servers) as servers:
                toolbox = Toolbox(python, mcp_tools(ctx, cfg, servers), servers)
                return await _Execution(ctx, cfg, query, toolbox).run()
        except McpServerError as exc:  # one could not start
            raise server_failed(ctx, exc) from None


class _Execution:
    """One node run of the agent loop."""

    def __init__(self, ctx: NodeContext, cfg: AgentConfig, query: QueryFn, toolbox: Toolbox) -> None:
        self.ctx = ctx
        self.cfg = cfg
        self.query = query
        self.toolbox = toolbox
        self.tally = Tally(price_table(ctx.services.prices))
        self.turns = 0
        self.schema_tries = 0
        self.pass_calls = 0  # model calls of this pass that the node runs this one continues made
        self.stored_seqs: set[int] = set()  # inbox messages those node runs had stored already
        self.resolved: dict[str, tuple[str, bool]] = {}  # toolUseId -> (result text, is_error)
        self.round = ToolRound(ctx, cfg, toolbox, self.resolved)
        self.sent_tool_choice: dict[str, Any] | None = None  # the tool_choice of the call in flight
        self.began = time.monotonic()

    # -- setup ------------------------------------------------------------------------------

    def _session_id(self, lineage: Lineage) -> str:
        ctx = self.ctx
        if self.cfg.session == "continue":
            suffix = "" if ctx.item is None else f"_{ctx.item}"
            return f"ses_{ctx.flow_run_id.removeprefix('run_')}_{ctx.node_id}{suffix}"
        return lineage.session() or f"ses_{os.urandom(10).hex()}"

    def _opening(self) -> list[dict[str, Any]]:
        """The messages a pass of the node starts its conversation with: the prompt (or ``messages``)."""
        cfg = self.cfg
        if cfg.messages is not None:
            return [{"role": m["role"], "content": m["content"]} for m in cfg.messages]
        return [{"role": "user", "content": cfg.prompt if isinstance(cfg.prompt, str | list) else
                 result_text(cfg.prompt)}]

    async def _pick_up(self, transcript: Transcript) -> dict[str, Any] | None:
        """Write what the node runs this one continues left unwritten (``resume.py``); returns their
        stored final answer when there is one to stand by."""
        ctx, cfg = self.ctx, self.cfg
        lineage = find_lineage(ctx.store, ctx.flow_run_id, ctx.node_id, ctx.item, ctx.run_id)
        transcript.session_id = self._session_id(lineage)
        transcript.load()
        pickup = Pickup(ctx, transcript, lineage)
        preamble = pickup.preamble(cfg.system, self._opening())
        missing = pickup.missing(preamble)
        opens = any(p.kind == "opening" for p in missing)
        answered = pickup.last_assistant()
        before = made_by(answered) if answered is not None else None
        await ctx.emit_durable(AgentStart(sessionId=transcript.session_id, model=cfg.model,
                                          prompt=(cfg.prompt if cfg.messages is None else self._opening())
                                          if opens else None,
                                          previousModel=before if before and not same_model(before, cfg.model)
                                          else None))
        earlier = pickup.model_calls()
        self.pass_calls = len(earlier)
        for call in earlier:  # the output counts the pass's calls, wherever it was interrupted
            self.tally.add(call.get("model") or cfg.model, call.get("usage") or {}, call.get("iterations"))
        self.schema_tries = pickup.corrections()
        for p in missing:
            if p.kind == "closing":
                # A new pass over a conversation a previous pass left mid-tool-call: close those calls
                # first, so the conversation stays valid (every tool_use answered) before the new prompt.
                uses = transcript.pending_tool_uses()
                pickup.settle(uses, self.resolved, closing=True)
                transcript.add("user", self._tool_results(uses), p.step)
                self.resolved.clear()
            else:
                transcript.add(p.role, p.content, p.step)
        if missing:
            return None
        uses = transcript.pending_tool_uses()
        self.stored_seqs = pickup.settle(uses, self.resolved) if uses else \
            pickup.stored_but_not_consumed(len(preamble))
        message = pickup.last_assistant()
        if pickup.cut_short and message is not None:  # run again, with the keys they had
            await self.round.run(transcript, pickup.cut_short, message["id"], int(message["step"]),
                                 received_by=message["runId"])
        answer = pickup.final_answer(len(preamble))
        if answer is not None and lineage.previous in lineage.failed and ctx.inbox():
            return None  # a failed agent resumed with a message: the message is its next turn
        return answer

    # -- the loop ---------------------------------------------------------------------------

    async def run(self) -> Any:
        ctx, cfg = self.ctx, self.cfg
        transcript = Transcript(ctx, "")
        stored = await self._pick_up(transcript)
        # A final answer stored before the interruption stands, as it would have (checked like a new one).
        if stored is not None and (cfg.output_schema is None
                                   or not await self._check_output(transcript, stored["content"],
                                                                   int(stored["step"]))):
            stop = (stored.get("modelCall") or {}).get("stopReason", "end_turn")
            return await self._finish(transcript, {"content": stored["content"], "stopReason": stop})
        last: ModelMessage | None = None
        while True:
            waiting = await self._turn_boundary(transcript)
            if waiting is not None:
                return waiting
            self._check_budgets(transcript)
            step = transcript.steps + 1
            answer = await self._call_unless_paused(transcript)
            if answer is None:
                return INTERRUPTED
            last = answer
            transcript.steps = step
            self.turns += 1
            model, usage = last.get("model") or cfg.model, last.get("usage") or {}
            call_cost = self.tally.add(model, usage, last.get("iterations"))
            content = last.get("content") or []
            stop = last.get("stopReason")
            call_usage = {k: int(usage.get(k, 0)) for k in USAGE_KEYS}
            message_id = transcript.add("assistant", content, step, self._model_call(last, model, call_usage))
            # The run's cost moves with every call, not only when the agent finishes.
            ctx.emit(AgentUsage(model=model, usage=call_usage, costUsd=round(call_cost, 10)))
            if compaction_at(content) is not None:
                self._compacted(transcript, last)
            if stop == "tool_use":
                await self.round.run(transcript, content, message_id, step)
                continue
            if stop in RESEND_STOPS:
                continue
            if cfg.output_schema is not None and stop in ("end_turn", "stop_sequence", "max_tokens"):
                problem = await self._check_output(transcript, content, step)
                if problem:
                    continue
            return await self._finish(transcript, last)

    def _model_call(self, answer: ModelMessage, model: str, usage: dict[str, int]) -> dict[str, Any]:
        """What the stored assistant message keeps of the call that made it: the model, the message id,
        the stop reason and usage; the model asked for when the API named another (an alias), the
        ``tool_choice`` sent, and the compaction's passes, when there were any."""
        call: dict[str, Any] = {"model": model, "id": answer.get("id"), "stopReason": answer.get("stopReason"),
                                "usage": usage}
        if model != self.cfg.model:
            call["requestModel"] = self.cfg.model
        if self.sent_tool_choice is not None:
            call["toolChoice"] = self.sent_tool_choice
        if answer.get("iterations"):
            call["iterations"] = answer["iterations"]
        return call

    def _compacted(self, transcript: Transcript, answer: ModelMessage) -> None:
        """Report a compaction the API made: how big the context was and is, what the requests carry now."""
        passes = answer.get("iterations") or []

        def size(kind: str) -> int:
            found = [i for i in passes if i.get("type") == kind]
            last = found[-1] if found else {}
            return sum(int(last.get(k, 0)) for k in ("inputTokens", "cacheCreationInputTokens",
                                                     "cacheReadInputTokens"))

        now = window(transcript.rows, self.cfg.model)
        self.ctx.emit(AgentCompaction(tokensBefore=size("compaction"), tokensAfter=size("message"),
                                      messagesKept=len(now.messages), messagesSummarized=now.summarized))

    async def _call_unless_paused(self, transcript: Transcript) -> ModelMessage | None:
        """One model call; a pause cancels it (nothing of it is stored, so the resume sends it again)."""
        ctx = self.ctx
        answer: list[ModelMessage] = []
        failure: list[Exception] = []
        with anyio.CancelScope() as paused:
            async with anyio.create_task_group() as tg:
                async def watch() -> None:
                    await ctx.wait_for_pause()
                    paused.cancel()

                tg.start_soon(watch)
                try:
                    request = self._request(transcript)
                    with spans.chat(request, transcript.session_id) as span:
                        answer.append(await self.query(request, ctx.emit, ctx))
                        spans.chat_done(span, answer[-1])
                except Exception as exc:  # re-raised below, unwrapped by the task group
                    failure.append(exc)
                tg.cancel_scope.cancel()
        if failure:
            raise failure[0]
        return answer[0] if answer else None

    async def _turn_boundary(self, transcript: Transcript) -> WaitFor | Interrupted | None:
        """Settle pending tool uses and take inbox messages as the next user message."""
        ctx = self.ctx
        if ctx.pause_requested():
            # The step in flight is finished and stored: stop here, the resume rebuilds from the rows.
            return INTERRUPTED
        inbox = ctx.inbox()
        # Messages the node run this one continues had stored already (see resume.py) are not sent again.
        fresh = [m for m in inbox if m.seq not in self.stored_seqs]
        self.stored_seqs = set()
        # A reply (or a send) answers ask_human; a resume message is not an answer, it goes on as text.
        answers = iter([i for i, m in enumerate(fresh) if m.kind != "resume"])
        used: set[int] = set()
        for b in transcript.pending_tool_uses():
            result = self.resolved.get(b["id"])
            if result is None and b.get("name") == ASK_HUMAN:
                i = next(answers, None)
                if i is None:
                    question = (b.get("input") or {}).get("question", "")
                    return WaitFor(prompt=question)
                used.add(i)
                answer = result_text(fresh[i].content)
                result = (answer, False)
                transcript.add_tool_call({"messageId": None, "toolName": ASK_HUMAN, "toolUseId": b["id"],
                                          "input": b.get("input"), "output": answer, "status": "completed",
                                          "durationMs": 0, "step": transcript.steps})
                ctx.emit(AgentTool(toolName=ASK_HUMAN, toolUseId=b["id"], toolInput=b.get("input"),
                                   toolOutput=answer, durationMs=0))
                self.resolved[b["id"]] = result
        blocks = self._tool_results(transcript.pending_tool_uses()) \
            if transcript.pending_tool_uses() else []
        texts = [result_text(m.content) for i, m in enumerate(fresh) if i not in used]
        if not blocks and not texts:
            await ctx.consume_inbox(len(inbox), step=transcript.steps)  # what was stored already, if anything
            return None
        content: Any = texts[0] if not blocks and len(texts) == 1 else \
            [*blocks, *({"type": "text", "text": t} for t in texts)]
        transcript.add("user", content, transcript.steps)
        self.resolved.clear()
        # Consumed after the row is stored, with the step that says where: a node run that continues
        # this one after a crash in between finds them stored and does not send them again.
        await ctx.consume_inbox(len(inbox), step=transcript.steps)
        return None

    def _tool_results(self, uses: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """tool_result blocks, in the order of ``uses``; a call without a result was cut short."""
        blocks: list[dict[str, Any]] = []
        for b in uses:
            text, is_error = self.resolved.get(b["id"]) or (INTERRUPTED_RESULT, True)
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": b["id"], "content": text}
            if is_error:
                block["is_error"] = True
            blocks.append(block)
        return blocks

    def _check_budgets(self, transcript: Transcript) -> None:
        ctx, cfg = self.ctx, self.cfg
        if transcript.steps >= cfg.max_total_turns:
            message = (f"node {ctx.node_id!r}: session {transcript.session_id} has used {transcript.steps} "
                       f"model calls, the cumulative limit is {cfg.max_total_turns}; refusing to continue. "
                       "Raise `maxTotalTurns`, or use `session: \"fresh\"` to start a new conversation")
            ctx.emit(AgentError(errorType="error_max_turns", message=message,
                                details={"steps": transcript.steps, "limit": cfg.max_total_turns}))
            raise NodeFailure(message, "error_max_turns")
        if self.turns >= cfg.max_turns:
            message = (f"node {ctx.node_id!r}: reached maxTurns ({cfg.max_turns}) without a final answer; "
                       "raise `maxTurns`, or resume (`flowkernel retry`) to give it a fresh budget")
            ctx.emit(AgentError(errorType="error_max_turns", message=message,
                                details={"turns": self.turns, "limit": cfg.max_turns}))
            raise NodeFailure(message, "error_max_turns")

    def _request(self, transcript: Transcript) -> dict[str, Any]:
        """The next request: what the model is sent of the stored conversation (``context_window.py``)."""
        self.sent_tool_choice = self.cfg.tool_choice_for(first_call=self.pass_calls + self.turns == 0)
        return build_request(self.cfg, window(transcript.rows, self.cfg.model).messages,
                             self.toolbox.definitions(), tool_choice=self.sent_tool_choice)

    async def _check_output(self, transcript: Transcript, content: list[dict[str, Any]], step: int) -> bool:
        """Validate the answer against ``outputSchema``; True if the model was asked to correct it."""
        assert self.cfg.output_schema is not None
        _, problem = await _schema_problem(_text_of(content), self.cfg.output_schema, self.ctx)
        if problem is None:
            return False
        retry = self.schema_tries < self.cfg.output_retries
        how = "native" if self.cfg.native_output else "instruction"
        # On the native path the API held the answer to the strict subset of the schema: what failed is
        # an assertion that subset leaves out (minLength, pattern, …), or a truncated answer.
        hint = " (native structured output: the API enforces only the strict subset of the schema)" \
            if self.cfg.native_output else ""
        self.ctx.emit(AgentError(errorType="error_output_schema", message=f"the answer does not match "
                                 f"outputSchema{hint}: {problem}", details={"try": self.schema_tries + 1,
                                                                            "willRetry": retry, "path": how}))
        if not retry:
            raise NodeFailure(f"node {self.ctx.node_id!r}: the answer does not match outputSchema after "
                              f"{self.schema_tries + 1} tries{hint}: {problem}", "error_output_schema")
        self.schema_tries += 1
        transcript.add("user", f"Your answer does not match the required JSON Schema: {problem}. Reply again "
                               "with only the corrected JSON value.", step)
        return True

    async def _finish(self, transcript: Transcript, last: ModelMessage) -> dict[str, Any]:
        content = last.get("content") or []
        text = _text_of(content)
        structured = None
        if self.cfg.output_schema is not None:
            structured, problem = await _schema_problem(text, self.cfg.output_schema, self.ctx)
            if problem is not None:
                raise NodeFailure(f"node {self.ctx.node_id!r}: the answer does not match outputSchema: {problem}",
                                  "error_output_schema")
        usage = dict(self.tally.usage)
        cost = round(self.tally.cost, 10)
        self.ctx.emit(AgentComplete(result=text, structuredOutput=structured, usage=usage,
                                    modelUsage=self.tally.by_model or None, totalCostUsd=cost,
                                    durationMs=int((time.monotonic() - self.began) * 1000),
                                    numTurns=self.pass_calls + self.turns))
        return {"text": text, "structuredOutput": structured, "usage": usage, "totalCostUsd": cost,
                "numTurns": self.pass_calls + self.turns, "sessionId": transcript.session_id, "stopReason": last.get("stopReason")}
