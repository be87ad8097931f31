"""The input of a ``claude.agent`` node: parsing at run time and checking at load time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flowkernel.agents.mcp import ServerSpec, check_servers, parse_servers, server_of
from flowkernel.core.node import bindable, check_json_schema
from flowkernel.core.services import NodeLimits
from flowkernel.errors import NodeFailure, Problem
from flowkernel.nodes.claude.caching import mark_cache_breakpoints
from flowkernel.nodes.claude.models import ADAPTIVE, BUDGET, deprecated_models, traits
from flowkernel.nodes.claude.structured import instruction, output_format

DEFAULT_MODEL = "claude-sonnet-5-5"  # current, and not in the SDK's deprecation table
DEFAULT_MAX_TOKENS = 8192
DEFAULT_MAX_TURNS = 50
DEFAULT_MAX_TOTAL_TURNS = 500
DEFAULT_OUTPUT_RETRIES = 2
DEFAULT_TOOL_RESULT_MAX_BYTES = 100_000
MIN_THINKING_BUDGET = 1024
EFFORTS = ("low", "medium", "high", "xhigh", "max")
DISPLAYS = ("summarized", "omitted")
# Context-management compaction: the API's default trigger, and the least it takes.
DEFAULT_COMPACTION_TRIGGER = 150_000
MIN_COMPACTION_TRIGGER = 50_000
COMPACTION_EDIT = "compact_20260112"
TOOL_CHOICES = ("auto", "any", "none")

KEYS = frozenset({"prompt", "messages", "system", "model", "maxTokens", "temperature", "thinking", "maxTurns",
                  "maxTotalTurns", "tools", "toolChoice", "outputSchema", "outputRetries", "session",
                  "toolResultMaxBytes", "cache", "compaction", "mcpServers", "maxParallelTools"})


def _count(minimum: int, description: str, default: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "minimum": minimum, "description": description}
    if default is not None:
        schema["default"] = default
    return bindable(schema)


_DISPLAY = ("How thinking comes back: summarized (shown, streamed as agent:thinking:delta) or omitted (empty "
            "blocks that keep their signature); the model's default when left out.")


# For editors and load-time validation (``flowkernel schema``); ``check_input`` below also checks what a
# schema cannot say (thinking against the model, budgetTokens below maxTokens) and the resolved input.
INPUT_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "anyOf": [{"required": ["prompt"]}, {"required": ["messages"]}],
    "properties": {
        "prompt": {"description": "The first user turn: text with bindings, or Messages API content blocks."},
        "messages": bindable({"type": "array", "minItems": 1, "description": "A Messages API conversation to start from.",
                              "items": {"type": "object", "required": ["role", "content"],
                                        "properties": {"role": {"enum": ["user", "assistant"]}, "content": {}}}}),
        "system": {"type": "string", "description": "The system prompt."},
        "model": {"type": "string", "default": DEFAULT_MODEL},
        "maxTokens": _count(1, "max_tokens of each model call.", DEFAULT_MAX_TOKENS),
        "temperature": bindable({"type": "number", "minimum": 0, "maximum": 1}),
        "thinking": bindable({"oneOf": [
            {"type": "object", "required": ["type"], "additionalProperties": False,
             "description": "Adaptive thinking, for models that take it.",
             "properties": {"type": {"const": ADAPTIVE}, "effort": bindable({"enum": list(EFFORTS)}),
                            "display": bindable({"enum": list(DISPLAYS), "description": _DISPLAY})}},
            {"type": "object", "required": ["budgetTokens"], "additionalProperties": False,
             "description": "Budgeted thinking: at least 1024 tokens, below maxTokens.",
             "properties": {"type": {"const": "enabled"},
                            "budgetTokens": _count(MIN_THINKING_BUDGET, "Thinking tokens per model call."),
                            "display": bindable({"enum": list(DISPLAYS), "description": _DISPLAY})}},
        ]}),
        "maxTurns": _count(1, "Model calls this execution may make.", DEFAULT_MAX_TURNS),
        "maxTotalTurns": _count(1, "Model calls of the whole conversation, across resumes and loop passes.",
                                DEFAULT_MAX_TOTAL_TURNS),
        "tools": bindable({"type": "array", "items": {"type": "string"}, "description": (
            "Registered tool names; mcp__<server>__<tool> names pick a server's tools.")}),
        "maxParallelTools": _count(1, "Tool calls of one model message run at the same time at most (all by default)."),
        "mcpServers": bindable({"type": "object", "description": (
            "MCP servers whose tools join the node's as mcp__<server>__<tool>: {\"command\", \"args\"?, "
            "\"env\"?, \"cwd\"?} (stdio) or {\"url\", \"headers\"?} (streamable HTTP), each with "
            "\"startTimeout\"? and \"callTimeout\"? in seconds."),
            "additionalProperties": {"type": "object"}}),
        "toolChoice": bindable({"description": (
            "auto (the default), none (no tool calls), any (the first call of a pass must call a tool) or "
            "{\"tool\": NAME} (it must call that one); a forced choice is refused with thinking on."), "oneOf": [
            {"enum": list(TOOL_CHOICES)},
            {"type": "object", "required": ["tool"], "additionalProperties": False,
             "properties": {"tool": {"type": "string"}}}]}),
        "outputSchema": bindable({"type": "object", "description": (
            "A JSON Schema the final answer must match; it becomes structuredOutput.")}),
        "outputRetries": _count(0, "Extra turns to fix an answer that does not match outputSchema.",
                                DEFAULT_OUTPUT_RETRIES),
        "session": bindable({"enum": ["continue", "fresh"], "default": "continue", "description": (
            "On a loop pass or resume: continue the stored conversation, or start afresh.")}),
        "toolResultMaxBytes": _count(0, "Longer tool results are cut to this size.", DEFAULT_TOOL_RESULT_MAX_BYTES),
        "cache": bindable({"type": "boolean", "default": True,
                           "description": "Mark the stable prefix for prompt caching."}),
        "compaction": bindable({
            "type": "object", "additionalProperties": False, "description": (
                "Context-management compaction (off by default): past triggerTokens of input the API "
                "summarizes the conversation so far; the stored conversation keeps every message."),
            "properties": {
                "triggerTokens": _count(MIN_COMPACTION_TRIGGER, "Input tokens that start a compaction.",
                                        DEFAULT_COMPACTION_TRIGGER),
                "instructions": {"type": "string", "minLength": 1,
                                 "description": "What the summary must keep, for the API's summarizer."}}}),
    },
}


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """A node's resolved input. ``maxTurns`` is this execution's budget of model calls; ``maxTotalTurns``
    caps the calls of the whole conversation across resumes and loop passes."""

    prompt: Any = None
    messages: list[dict[str, Any]] | None = None
    system: str | None = None
    model: str = DEFAULT_MODEL
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    thinking_budget: int | None = None  # budgeted thinking: budget_tokens
    adaptive: bool = False  # adaptive thinking, with ``effort`` if given
    effort: str | None = None
    display: str | None = None  # thinking.display: summarized | omitted (None: the model's default)
    max_turns: int = DEFAULT_MAX_TURNS
    max_total_turns: int = DEFAULT_MAX_TOTAL_TURNS
    tools: list[str] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"  # auto | any | none | {"tool": NAME}
    output_schema: dict[str, Any] | None = None
    # ``output_config.format`` when the model takes native structured output and the subset says the
    # schema (``structured.py``); None: the schema is an instruction in the system prompt.
    output_format: dict[str, Any] | None = None
    output_retries: int = DEFAULT_OUTPUT_RETRIES
    session: str = "continue"
    tool_result_max_bytes: int = DEFAULT_TOOL_RESULT_MAX_BYTES
    cache: bool = True  # mark the stable prefix for prompt caching (``caching.py``)
    compaction_trigger: int | None = None  # input tokens that start a compaction; None: no compaction
    compaction_instructions: str | None = None
    mcp_servers: tuple[ServerSpec, ...] = ()  # the MCP servers started with each node run
    max_parallel_tools: int | None = None  # tool calls of one message at a time; None: all of them

    @property
    def mcp_server_names(self) -> frozenset[str]:
        return frozenset(s.name for s in self.mcp_servers)

    @property
    def thinking(self) -> bool:
        return self.adaptive or self.thinking_budget is not None

    @property
    def native_output(self) -> bool:
        """``outputSchema`` goes as ``output_config.format`` (else as an instruction)."""
        return self.output_format is not None

    def tool_choice_for(self, first_call: bool) -> dict[str, Any] | None:
        """The request's ``tool_choice``: a forced one (``any``, a named tool) on the first model call
        of a pass only, so the tool loop can end; ``none`` on every call; nothing for ``auto``. Never a
        forced one with thinking on (the API refuses the pair with 400; validation refuses it first)."""
        choice = self.tool_choice
        if choice == "none":
            return {"type": "none"}
        if choice == "auto" or not first_call or self.thinking:
            return None
        if choice == "any":
            return {"type": "any"}
        return {"type": "tool", "name": choice["tool"]} if isinstance(choice, dict) else None


def _binding(value: Any) -> bool:
    """An unresolved ``{{ }}`` binding: its type is only known at run time."""
    return isinstance(value, str) and "{{" in value


def _positive_int(data: dict[str, Any], key: str, path: str, problems: list[Problem], *, zero: bool = False) -> None:
    value = data.get(key)
    if value is None or _binding(value):
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if zero else 1):
        problems.append(Problem(f"{path}.{key}", f"must be {'a non-negative' if zero else 'a positive'} integer"))


def _model_of(data: dict[str, Any]) -> str | None:
    """The model the node will call, or None while a binding decides it."""
    model = data.get("model")
    if model is None:
        return DEFAULT_MODEL
    return model if isinstance(model, str) and not _binding(model) else None


THINKING_SHAPES = ('{"type": "adaptive", "effort"?: "low" | "medium" | "high" | "xhigh" | "max", "display"?: '
                   '"summarized" | "omitted"} or {"budgetTokens": <integer, at least 1024 and below maxTokens>, '
                   '"display"?: "summarized" | "omitted"}')


def _check_thinking(data: dict[str, Any], path: str, problems: list[Problem]) -> None:
    """The thinking form is well made and is one the model accepts (see ``models.TRAITS``)."""
    thinking = data.get("thinking")
    if thinking is None or _binding(thinking):
        return
    where = f"{path}.thinking"
    if not isinstance(thinking, dict) or ("budgetTokens" in thinking) == (thinking.get("type") == ADAPTIVE):
        problems.append(Problem(where, f"must be {THINKING_SHAPES}"))
        return
    model = _model_of(data)
    accepted = traits(model).thinking if model is not None else frozenset({ADAPTIVE, BUDGET})
    display = thinking.get("display")
    if display is not None and not _binding(display) and display not in DISPLAYS:
        problems.append(Problem(f"{where}.display", f"must be one of {', '.join(DISPLAYS)}"))
    if thinking.get("type") == ADAPTIVE:
        for key in sorted(set(thinking) - {"type", "effort", "display"}):
            problems.append(Problem(f"{where}.{key}", "unknown key; adaptive thinking takes type, effort and display"))
        effort = thinking.get("effort")
        if effort is not None and not _binding(effort) and effort not in EFFORTS:
            problems.append(Problem(f"{where}.effort", f"must be one of {', '.join(EFFORTS)}"))
        if ADAPTIVE not in accepted:
            problems.append(Problem(where, f"model {model} does not take adaptive thinking; give it a budget: "
                                           '{"budgetTokens": N} (at least 1024, below maxTokens)'))
        return
    for key in sorted(set(thinking) - {"budgetTokens", "type", "display"}):
        problems.append(Problem(f"{where}.{key}", "unknown key; budgeted thinking takes budgetTokens and display"))
    if thinking.get("type", "enabled") != "enabled":
        problems.append(Problem(f"{where}.type", f"must be {THINKING_SHAPES}"))
    budget = thinking["budgetTokens"]
    if _binding(budget):
        return
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < MIN_THINKING_BUDGET:
        problems.append(Problem(f"{where}.budgetTokens", f"must be an integer of at least {MIN_THINKING_BUDGET} "
                                                         "(the API's minimum thinking budget)"))
    else:
        max_tokens = data.get("maxTokens", DEFAULT_MAX_TOKENS)
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens <= budget:
            problems.append(Problem(f"{path}.maxTokens", f"must be greater than thinking.budgetTokens ({budget})"))
    if BUDGET not in accepted:
        problems.append(Problem(where, f"model {model} takes adaptive thinking only (a budget is refused with "
                                       '400): use {"type": "adaptive", "effort": "low" | "medium" | "high" | '
                                       '"xhigh" | "max"}'))


def _check_compaction(data: dict[str, Any], path: str, problems: list[Problem]) -> None:
    compaction = data.get("compaction")
    if compaction is None or _binding(compaction):
        return
    where = f"{path}.compaction"
    if not isinstance(compaction, dict):
        problems.append(Problem(where, "must be {\"triggerTokens\"?: N, \"instructions\"?: TEXT} (N at least "
                                       f"{MIN_COMPACTION_TRIGGER}, default {DEFAULT_COMPACTION_TRIGGER})"))
        return
    for key in sorted(set(compaction) - {"triggerTokens", "instructions"}):
        problems.append(Problem(f"{where}.{key}", "unknown key; compaction takes triggerTokens and instructions"))
    trigger = compaction.get("triggerTokens")
    if trigger is not None and not _binding(trigger) and (
            not isinstance(trigger, int) or isinstance(trigger, bool) or trigger < MIN_COMPACTION_TRIGGER):
        problems.append(Problem(f"{where}.triggerTokens", f"must be an integer of at least {MIN_COMPACTION_TRIGGER} "
                                                          "(the least input the API compacts at)"))
    hint = compaction.get("instructions")
    if hint is not None and not _binding(hint) and (not isinstance(hint, str) or not hint):
        problems.append(Problem(f"{where}.instructions", "must be a non-empty string"))
    model = _model_of(data)
    if model is not None and not traits(model).compaction:
        problems.append(Problem(where, f"model {model} does not take context-management compaction (the API "
                                       "answers 400); use a model from Opus 4.6 or Sonnet 4.6 on, or leave it out"))


def _check_tool_choice(data: dict[str, Any], path: str, problems: list[Problem]) -> None:
    choice = data.get("toolChoice")
    if choice is None or _binding(choice):
        return
    where = f"{path}.toolChoice"
    named = choice.get("tool") if isinstance(choice, dict) else None
    if not (choice in TOOL_CHOICES or (isinstance(choice, dict) and set(choice) == {"tool"}
                                       and isinstance(named, str) and named)):
        problems.append(Problem(where, "must be \"auto\", \"any\", \"none\" or {\"tool\": NAME}"))
        return
    tools = data.get("tools")
    servers = data.get("mcpServers")
    offered = isinstance(named, str) and isinstance(servers, dict) and server_of(named) in servers
    if isinstance(named, str) and not _binding(named) and isinstance(tools, list) and named not in tools \
            and not offered:
        problems.append(Problem(f"{where}.tool", f"names no tool of this node ({', '.join(map(str, tools)) or 'none'}"
                                                 "); add it to `tools`"))
    if choice == "any" or named is not None:
        if data.get("thinking") is not None:
            problems.append(Problem(where, "a forced tool choice cannot go with thinking (the API answers 400: "
                                           "\"Thinking may not be enabled when tool_choice forces tool use\"); use "
                                           "\"auto\", or leave thinking out"))
        elif not tools and not servers:
            problems.append(Problem(where, "forces a tool call, but the node has no `tools`"))


def advise_input(data: Any, path: str, notes: list[Problem]) -> None:
    """Append what is worth a warning in a ``claude.agent`` input: a model the installed ``anthropic``
    SDK deprecates, with the date it reaches end of life (the SDK warns at each call; better once, now)."""
    if not isinstance(data, dict):
        return
    model = _model_of(data)
    end = deprecated_models().get(model) if model is not None else None
    if model is None or end is None:
        return
    which = f"model {model!r}" if "model" in data else f"the default model {model!r}"
    notes.append(Problem(f"{path}.model" if "model" in data else path,
                         f"{which} is deprecated (the installed anthropic SDK says it reaches end of life on "
                         f"{end}); move the node to a current model"))


def check_input(data: Any, path: str, problems: list[Problem]) -> None:
    """Append every problem with a ``claude.agent`` input (bindings are taken on trust)."""
    if _binding(data):
        return
    if not isinstance(data, dict):
        problems.append(Problem(path, "claude.agent input must be an object"))
        return
    for key in sorted(set(data) - KEYS):
        problems.append(Problem(f"{path}.{key}", f"unknown key; claude.agent takes {', '.join(sorted(KEYS))}"))
    if data.get("prompt") is None and data.get("messages") is None:
        problems.append(Problem(path, "claude.agent needs a `prompt` (text) or `messages` (Messages API list)"))
    msgs = data.get("messages")
    if msgs is not None and not _binding(msgs):
        if not isinstance(msgs, list) or not msgs:
            problems.append(Problem(f"{path}.messages", "must be a non-empty list of {role, content} objects"))
        else:
            for i, m in enumerate(msgs):
                if not isinstance(m, dict) or m.get("role") not in ("user", "assistant") or "content" not in m:
                    problems.append(Problem(f"{path}.messages[{i}]",
                                            "must be {\"role\": \"user\"|\"assistant\", \"content\": ...}"))
    for key in ("system", "model"):
        if data.get(key) is not None and not isinstance(data[key], str):
            problems.append(Problem(f"{path}.{key}", "must be a string"))
    for key in ("maxTokens", "maxTurns", "maxTotalTurns", "maxParallelTools"):
        _positive_int(data, key, path, problems)
    for key in ("outputRetries", "toolResultMaxBytes"):
        _positive_int(data, key, path, problems, zero=True)
    temp = data.get("temperature")
    if temp is not None and not _binding(temp) and (not isinstance(temp, int | float) or isinstance(temp, bool)
                                                    or not 0 <= temp <= 1):
        problems.append(Problem(f"{path}.temperature", "must be a number from 0 to 1"))
    elif temp is not None and temp != 1 and not _binding(temp):
        model = _model_of(data)
        if model is not None and not traits(model).temperature:
            problems.append(Problem(f"{path}.temperature", f"model {model} takes no temperature but the default "
                                                           "(1): the API answers 400; leave it out"))
        elif data.get("thinking") is not None:
            problems.append(Problem(f"{path}.temperature", "thinking takes no temperature but the default (1); "
                                                           "leave it out, or turn thinking off"))
    _check_thinking(data, path, problems)
    _check_compaction(data, path, problems)
    _check_tool_choice(data, path, problems)
    check_servers(data.get("mcpServers"), f"{path}.mcpServers", problems)
    tools = data.get("tools")
    if tools is not None and not _binding(tools) and (
            not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)):
        problems.append(Problem(f"{path}.tools", "must be a list of tool names from the tool registry"))
    cache = data.get("cache")
    if cache is not None and not _binding(cache) and not isinstance(cache, bool):
        problems.append(Problem(f"{path}.cache", "must be true (mark the stable prefix for prompt caching, the "
                                                 "default) or false"))
    session = data.get("session")
    if session is not None and not _binding(session) and session not in ("continue", "fresh"):
        problems.append(Problem(f"{path}.session", "must be \"continue\" or \"fresh\""))
    schema = data.get("outputSchema")
    if schema is not None and not _binding(schema):
        check_json_schema(schema, f"{path}.outputSchema", problems)


def parse_config(data: Any, node_id: str, limits: NodeLimits | None = None) -> AgentConfig:
    """The resolved input as an ``AgentConfig``; ``NodeFailure`` listing every problem otherwise."""
    problems: list[Problem] = []
    check_input(data, "input", problems)
    if problems:
        raise NodeFailure(f"node {node_id!r}: invalid claude.agent input: " + "; ".join(map(str, problems)),
                          "invalid_input")
    limits = limits or NodeLimits()
    thinking = data.get("thinking")
    model = data.get("model") or DEFAULT_MODEL
    schema = data.get("outputSchema")
    compaction = data.get("compaction")
    return AgentConfig(
        prompt=data.get("prompt"),
        messages=data.get("messages"),
        system=data.get("system"),
        model=model,
        max_tokens=data.get("maxTokens", DEFAULT_MAX_TOKENS),
        temperature=data.get("temperature"),
        thinking_budget=thinking.get("budgetTokens") if thinking else None,
        adaptive=bool(thinking) and thinking.get("type") == ADAPTIVE,
        effort=thinking.get("effort") if thinking else None,
        display=thinking.get("display") if thinking else None,
        max_turns=data.get("maxTurns", DEFAULT_MAX_TURNS),
        max_total_turns=data.get("maxTotalTurns", _or(limits.agent_total_turns, DEFAULT_MAX_TOTAL_TURNS)),
        tools=list(data.get("tools") or []),
        tool_choice=data.get("toolChoice") or "auto",
        output_schema=schema,
        output_format=output_format(schema) if schema is not None and traits(model).structured_output else None,
        output_retries=data.get("outputRetries", DEFAULT_OUTPUT_RETRIES),
        session=data.get("session", "continue"),
        tool_result_max_bytes=data.get("toolResultMaxBytes",
                                       _or(limits.tool_result_bytes, DEFAULT_TOOL_RESULT_MAX_BYTES)),
        cache=data.get("cache", True),
        compaction_trigger=compaction.get("triggerTokens", DEFAULT_COMPACTION_TRIGGER) if compaction else None,
        compaction_instructions=compaction.get("instructions") if compaction else None,
        mcp_servers=parse_servers(data.get("mcpServers")),
        max_parallel_tools=data.get("maxParallelTools"),
    )


def build_request(cfg: AgentConfig, messages: list[dict[str, Any]], tool_definitions: list[dict[str, Any]], *,
                  tool_choice: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Messages API request body for one model call (what a fixture's ``input`` records).
    ``tool_choice``: what ``cfg.tool_choice_for`` gives for this call."""
    from flowkernel.agents.tools import ASK_HUMAN, ASK_HUMAN_DEFINITION

    req: dict[str, Any] = {"model": cfg.model, "max_tokens": cfg.max_tokens, "messages": messages}
    system = cfg.system
    if cfg.output_schema is not None and cfg.output_format is None:
        told = instruction(cfg.output_schema)
        system = f"{system}\n\n{told}" if system else told
    if system:
        req["system"] = system
    definitions = list(tool_definitions)
    if ASK_HUMAN in cfg.tools:
        definitions.append(ASK_HUMAN_DEFINITION)
    if definitions:
        req["tools"] = definitions
    if tool_choice is not None and definitions:
        req["tool_choice"] = tool_choice
    if cfg.temperature is not None:
        req["temperature"] = cfg.temperature
    output_config: dict[str, Any] = {}
    display = {"display": cfg.display} if cfg.display is not None else {}
    if cfg.adaptive:
        req["thinking"] = {"type": "adaptive", **display}
        if cfg.effort is not None:
            output_config["effort"] = cfg.effort
    elif cfg.thinking_budget is not None:
        req["thinking"] = {"type": "enabled", "budget_tokens": cfg.thinking_budget, **display}
    if cfg.output_format is not None:
        output_config["format"] = cfg.output_format
    if output_config:
        req["output_config"] = output_config
    if cfg.compaction_trigger is not None:
        edit: dict[str, Any] = {"type": COMPACTION_EDIT, "trigger": {"type": "input_tokens",
                                                                     "value": cfg.compaction_trigger}}
        if cfg.compaction_instructions:
            edit["instructions"] = cfg.compaction_instructions
        req["context_management"] = {"edits": [edit]}
    return mark_cache_breakpoints(req) if cfg.cache else req


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
