"""The Claude node's spans (DESIGN §12), with the OpenTelemetry GenAI attributes for Anthropic:
``invoke_agent {nodeId}`` for a node run, ``chat {model}`` per model call, ``execute_tool {tool}``
per tool call. Message and tool content only with ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``.
While telemetry is off each of these is a null context manager (``flowkernel.telemetry.traces``).
"""

from __future__ import annotations

from typing import Any

from flowkernel.agents.query import ModelMessage
from flowkernel.telemetry import traces as telemetry

PROVIDER = "anthropic"


def agent(node_id: str, node_run_id: str, model: str) -> Any:
    if not telemetry.enabled():
        return telemetry.NULL_SPAN
    return telemetry.span(f"invoke_agent {node_id}", {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.provider.name": PROVIDER, "gen_ai.agent.name": node_id,
        "gen_ai.agent.id": node_run_id, "gen_ai.request.model": model})


def agent_done(span: Any, output: Any) -> None:
    if span is not telemetry.NULL_SPAN and isinstance(output, dict):
        span.update({"gen_ai.conversation.id": output.get("sessionId"), **_usage(output.get("usage") or {})})


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    # Anthropic reports cache reads and writes apart from input_tokens; the convention counts them in.
    read, written = int(usage.get("cacheReadInputTokens", 0)), int(usage.get("cacheCreationInputTokens", 0))
    return {"gen_ai.usage.input_tokens": int(usage.get("inputTokens", 0)) + read + written,
            "gen_ai.usage.output_tokens": int(usage.get("outputTokens", 0)),
            "gen_ai.usage.cache_read.input_tokens": read, "gen_ai.usage.cache_creation.input_tokens": written}


def _parts(content: Any) -> list[dict[str, Any]]:
    """Anthropic content blocks as the convention's message parts."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[dict[str, Any]] = []
    for block in content or []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "content": block.get("text", "")})
        elif kind == "thinking":
            parts.append({"type": "reasoning", "content": block.get("thinking", "")})
        elif kind == "tool_use":
            parts.append({"type": "tool_call", "id": block.get("id"), "name": block.get("name"),
                          "arguments": block.get("input")})
        elif kind == "tool_result":
            parts.append({"type": "tool_call_response", "id": block.get("tool_use_id"),
                          "response": block.get("content")})
    return parts


def chat(request: dict[str, Any], session_id: str) -> Any:
    if not telemetry.enabled():
        return telemetry.NULL_SPAN
    model = str(request.get("model", ""))
    span = telemetry.span(f"chat {model}", {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": PROVIDER, "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": request.get("max_tokens"), "gen_ai.request.temperature": request.get("temperature"),
        "gen_ai.conversation.id": session_id}, client=True)
    if telemetry.capture_content():
        system = request.get("system")
        if system:
            span.set("gen_ai.system_instructions", telemetry.content(_parts(system)))
        span.set("gen_ai.input.messages", telemetry.content(
            [{"role": m.get("role"), "parts": _parts(m.get("content"))} for m in request.get("messages") or []]))
    return span


def chat_done(span: Any, answer: ModelMessage) -> None:
    if span is telemetry.NULL_SPAN:
        return
    stop = answer.get("stopReason")
    span.update({"gen_ai.response.model": answer.get("model") or None, "gen_ai.response.id": answer.get("id") or None,
                 "gen_ai.response.finish_reasons": [stop] if stop else None, **_usage(answer.get("usage") or {})})
    if telemetry.capture_content():
        span.set("gen_ai.output.messages", telemetry.content(
            [{"role": "assistant", "parts": _parts(answer.get("content")), "finish_reason": stop}]))


def tool(name: str, call_id: str, arguments: Any) -> Any:
    if not telemetry.enabled():
        return telemetry.NULL_SPAN
    span = telemetry.span(f"execute_tool {name}", {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.type": "function"})
    if telemetry.capture_content():
        span.set("gen_ai.tool.call.arguments", telemetry.content(arguments))
    return span


def tool_done(span: Any, result: str, error: str | None) -> None:
    if span is telemetry.NULL_SPAN:
        return
    if error is not None:
        span.fail("tool_error", error)
    if telemetry.capture_content():
        span.set("gen_ai.tool.call.result", result)
