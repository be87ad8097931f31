"""The input of a ``claude.code`` node (DESIGN §7b): its JSON Schema, the checks a schema cannot say,
and the resolved input as a ``CodeConfig``."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from typing import Any

from flowkernel.core.node import bindable, check_json_schema
from flowkernel.errors import NodeFailure, Problem

EXTRA = "pip install 'flowkernel[claude-code]'"
PERMISSION_MODES = ("default", "acceptEdits", "plan", "bypassPermissions")
SETTING_SOURCES = ("user", "project", "local")
EFFORTS = ("low", "medium", "high", "xhigh", "max")
DEFAULT_RESUME_MESSAGE = "continue"


def _count(minimum: int, description: str) -> dict[str, Any]:
    return bindable({"type": "integer", "minimum": minimum, "description": description})


def _names(description: str) -> dict[str, Any]:
    return bindable({"type": "array", "items": {"type": "string", "minLength": 1}, "description": description})


_MCP_SERVER: dict[str, Any] = {"oneOf": [
    {"type": "object", "required": ["command"], "additionalProperties": False,
     "description": "A stdio server the CLI starts.",
     "properties": {"type": {"const": "stdio"}, "command": {"type": "string", "minLength": 1},
                    "args": {"type": "array", "items": {"type": "string"}},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}}}},
    {"type": "object", "required": ["url"], "additionalProperties": False,
     "description": "A server over HTTP (streamable HTTP, or SSE).",
     "properties": {"type": {"enum": ["http", "sse"]}, "url": {"type": "string", "minLength": 1},
                    "headers": {"type": "object", "additionalProperties": {"type": "string"}}}},
]}

# For editors and load-time validation (``flowkernel schema``; unknown keys get a did-you-mean).
INPUT_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["prompt"],
    "properties": {
        "prompt": {"type": "string", "minLength": 1, "description": "The task: the session's first user message."},
        "model": {"type": "string", "minLength": 1, "description": "The model (the CLI's default when left out)."},
        "systemPrompt": {"type": "string", "description": "Added to the SDK's system prompt."},
        "cwd": {"type": "string", "minLength": 1, "description": (
            "The folder the session works in: inside the flow's folder or one allowed with --allow-dir; "
            "default a workspace folder of the run.")},
        "allowedTools": _names("Tools the session may use without asking (Read, Edit, Bash, …)."),
        "disallowedTools": _names("Tools removed from the session."),
        "permissionMode": bindable({"enum": list(PERMISSION_MODES)}),
        "ask": _names("Tools that need a human's approval (reply --to NODE_RUN '{\"allow\": true}')."),
        "mcpServers": bindable({"type": "object", "additionalProperties": _MCP_SERVER,
                                "description": "MCP servers by name; their tools are mcp__<name>__<tool>."}),
        "maxTurns": _count(1, "Turns this execution may take."),
        "maxBudgetUsd": bindable({"type": "number", "exclusiveMinimum": 0,
                                  "description": "The SDK's own cap on what this execution spends."}),
        "thinking": bindable({"oneOf": [
            {"type": "object", "required": ["type"], "additionalProperties": False,
             "properties": {"type": {"enum": ["adaptive", "disabled"]}}},
            {"type": "object", "required": ["budgetTokens"], "additionalProperties": False,
             "properties": {"type": {"const": "enabled"}, "budgetTokens": _count(1024, "Thinking tokens.")}}]}),
        "effort": bindable({"enum": list(EFFORTS)}),
        "outputSchema": bindable({"type": "object", "description": (
            "A JSON Schema the session's final answer must match; it becomes structuredOutput.")}),
        "settingSources": bindable({"type": "array", "items": {"enum": list(SETTING_SOURCES)}, "description": (
            "Settings the session reads (default none: it reads no user or project settings).")}),
    },
}
KEYS = frozenset(INPUT_SCHEMA["properties"])


@dataclass(frozen=True, slots=True)
class CodeConfig:
    """A ``claude.code`` node's resolved input."""

    prompt: str
    model: str | None = None
    system_prompt: str | None = None
    cwd: str | None = None
    allowed_tools: list[str] = field(default_factory=list)
    disallowed_tools: list[str] = field(default_factory=list)
    permission_mode: str | None = None
    ask: list[str] = field(default_factory=list)
    mcp_servers: dict[str, Any] = field(default_factory=dict)
    max_turns: int | None = None
    max_budget_usd: float | None = None
    thinking: dict[str, Any] | None = None
    effort: str | None = None
    output_schema: dict[str, Any] | None = None
    setting_sources: list[str] = field(default_factory=list)


def sdk_missing() -> bool:
    """Whether ``claude_agent_sdk`` cannot be imported here (found without importing it)."""
    if "claude_agent_sdk" in sys.modules:
        return sys.modules["claude_agent_sdk"] is None
    try:
        return importlib.util.find_spec("claude_agent_sdk") is None
    except (ImportError, ValueError):
        return True


def _binding(value: Any) -> bool:
    return isinstance(value, str) and "{{" in value


def check_input(data: Any, path: str, problems: list[Problem]) -> None:
    """What the schema cannot say: tools both allowed and asked about, an outputSchema that is no schema."""
    if not isinstance(data, dict):
        return
    allowed, ask = data.get("allowedTools"), data.get("ask")
    if isinstance(allowed, list) and isinstance(ask, list):
        for i, name in enumerate(ask):
            if name in allowed:
                problems.append(Problem(f"{path}.ask[{i}]", f"{name!r} is in allowedTools too: an allowed tool is "
                                                            "never asked about; keep it in one of the two"))
    schema = data.get("outputSchema")
    if schema is not None and not _binding(schema):
        check_json_schema(schema, f"{path}.outputSchema", problems)


def parse_config(data: Any, node_id: str) -> CodeConfig:
    """The resolved input as a ``CodeConfig``; ``NodeFailure`` naming every problem otherwise."""
    from flowkernel.core.jsonschemas import instance_errors

    problems = [Problem(f"input{where}", why) for where, why in instance_errors(INPUT_SCHEMA, data, schema_at="input")]
    if not problems:
        check_input(data, "input", problems)
    if problems:
        raise NodeFailure(f"node {node_id!r}: invalid claude.code input: " + "; ".join(map(str, problems)),
                          "invalid_input")
    thinking = data.get("thinking")
    return CodeConfig(
        prompt=data["prompt"], model=data.get("model"), system_prompt=data.get("systemPrompt"), cwd=data.get("cwd"),
        allowed_tools=list(data.get("allowedTools") or []), disallowed_tools=list(data.get("disallowedTools") or []),
        permission_mode=data.get("permissionMode"), ask=list(data.get("ask") or []),
        mcp_servers=dict(data.get("mcpServers") or {}), max_turns=data.get("maxTurns"),
        max_budget_usd=data.get("maxBudgetUsd"), thinking=dict(thinking) if thinking else None,
        effort=data.get("effort"), output_schema=data.get("outputSchema"),
        setting_sources=list(data.get("settingSources") or []))
