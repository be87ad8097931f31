"""What the fake Messages API (``fake_api``) does with the newer request fields, as the real API does:

- **native structured output** (``output_config.format``): the format and its schema are checked (the
  strict subset: every object closed, with its properties; no assertion keywords such as
  ``minLength``), a model without it is refused; a scripted ``Structured()`` block answers with a
  value of the request's schema (or the value given, which must match it), while a scripted ``Text``
  answers as it is, which is how a test scripts an answer the user's own schema refuses;
- **thinking display** (``thinking.display``): ``summarized`` or ``omitted`` (``updates`` with its
  beta); ``omitted`` serves each thinking block empty, signed as usual;
- **thinking bound to its model**: a thinking block this fake served, sent back with another text
  (``Invalid signature``) or to another model, is refused;
- **forced tool choice with thinking**: refused, as the API does ("Thinking may not be enabled when
  tool_choice forces tool use.");
- **context-management compaction** (``context_management.edits[]`` of type ``compact_20260112``, with
  the ``anthropic-beta: compact-2026-01-12`` header): when a request's input, counted from its last
  compaction block on (about four characters of canonical JSON a token), reaches the edit's trigger,
  the reply starts with a ``compaction`` block summarizing it, its usage has ``iterations`` (the
  summarizing pass, then the message) and its ``input_tokens`` are the message's. A test may also
  script ``Compaction(...)`` itself. Every compaction block sent back is checked against what was
  served: one with a summary at most (``compaction_block_ambiguous``), only in assistant turns
  (``compaction_block_misplaced``), its summary and opaque content as served
  (``compaction_content_mismatch``), its signature one this fake made
  (``compaction_signature_invalid``); errors carry ``error.details.error_code`` as the API's do.

With ``pause_after_compaction`` a request that reaches the trigger is answered with the compaction
block alone (``stop_reason: "compaction"``), made by the fake without taking a scripted response: the
client sends the conversation back with it and the next scripted response answers that. The explicit
``compaction: {"type": "summarize"}`` request is not emulated (the fake says so instead of pretending).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

JSONObject = dict[str, Any]

COMPACTION_BETA = "compact-2026-01-12"
COMPACTION_EDIT = "compact_20260112"
DISPLAY_UPDATES_BETA = "thinking-display-updates-2026-08-18"
MIN_COMPACTION_TRIGGER = 50_000
TRIGGER_WHEN_UNSET = 150_000
DEFAULT_SUMMARY = "Summary of the conversation so far."
FORCED_WITH_THINKING = "Thinking may not be enabled when tool_choice forces tool use."
# Model id prefixes without native structured output (older than Sonnet 4.5 / Opus 4.5 / Haiku 4.5).
NO_STRUCTURED_OUTPUT = ("claude-3", "claude-opus-4-0", "claude-opus-4-1", "claude-opus-4-2025",
                        "claude-sonnet-4-0", "claude-sonnet-4-2025")
# The keywords a strict output schema may use.
STRICT_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "items", "minItems",
                             "enum", "const", "anyOf", "allOf", "$ref", "$defs", "definitions", "description",
                             "title", "format", "default"})
STRING_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6",
                            "uuid"})


# --- blocks a test scripts -------------------------------------------------------------------


@dataclass(frozen=True)
class Compaction:
    """A compaction block at the start of a reply (the fake also makes one when the trigger is reached)."""

    content: str | None = DEFAULT_SUMMARY  # None: a failed compaction (the API's no-op block)
    encrypted_content: str | None = None
    signature: str | None = None  # None: "fake-compaction-sig-<request>"


class _Generated:
    def __repr__(self) -> str:
        return "GENERATED"


GENERATED: Any = _Generated()


@dataclass(frozen=True)
class Structured:
    """The answer of a request with ``output_config.format``: ``value`` as JSON text, or by default a
    value the fake makes from the request's schema."""

    value: Any = GENERATED
    deltas: int = 2


# --- wire shapes -------------------------------------------------------------------------------


def compaction_json(block: Compaction, request_index: int) -> JSONObject:
    """The block as a JSON message holds it (and as the client must send it back)."""
    return {"type": "compaction", "content": block.content, "encrypted_content": block.encrypted_content,
            "signature": block.signature or f"fake-compaction-sig-{request_index}"}


def compaction_stream(block: Compaction, request_index: int) -> tuple[JSONObject, list[JSONObject]]:
    """``content_block_start``'s block and the deltas: the signature comes with the start (the SDK
    applies ``signature_delta`` to thinking blocks only), the summary whole in one ``compaction_delta``."""
    full = compaction_json(block, request_index)
    start = {"type": "compaction", "content": None, "signature": full["signature"]}
    delta: JSONObject = {"type": "compaction_delta", "content": full["content"]}
    if full["encrypted_content"] is not None:
        delta["encrypted_content"] = full["encrypted_content"]
    return start, [delta]


def usage_entry(kind: str, input_tokens: int, output_tokens: int) -> JSONObject:
    """One entry of ``usage.iterations``."""
    return {"type": kind, "input_tokens": input_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


# --- measuring ---------------------------------------------------------------------------------


def measure(item: Any) -> int:
    """The fake's stand-in for a tokenizer: about four characters of canonical JSON a token."""
    if item is None:
        return 0
    return max(1, len(json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)) // 4)


def _has_summary(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "compaction" and bool(block.get("content"))


def context_tokens(body: JSONObject) -> int:
    """The input a request's model pass reads: tools, system and the messages from the last compaction
    block with a summary on (the API drops what precedes it)."""
    kept: list[Any] = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        blocks = content if isinstance(content, list) else [content]
        at = max((i for i, b in enumerate(blocks) if _has_summary(b)), default=None)
        if at is not None:
            kept = [blocks[at:]]
        else:
            kept.append(content)
    return measure(body.get("tools")) + measure(body.get("system")) + sum(measure(k) for k in kept)


def frame_tokens(body: JSONObject) -> int:
    """What every pass reads besides the conversation: tools and system."""
    return measure(body.get("tools")) + measure(body.get("system"))


def compaction_edit(body: JSONObject) -> JSONObject | None:
    edits = (body.get("context_management") or {}).get("edits") if isinstance(body.get("context_management"),
                                                                               dict) else None
    for edit in edits or []:
        if isinstance(edit, dict) and edit.get("type") == COMPACTION_EDIT:
            return edit
    return None


def pauses_after_compaction(body: JSONObject) -> bool:
    """The request asks the API to stop after compacting (and its context reached the trigger)."""
    edit = compaction_edit(body)
    return edit is not None and edit.get("pause_after_compaction") is True and compaction_due(body)


def compaction_due(body: JSONObject) -> bool:
    """The request's context reached its compaction edit's trigger."""
    edit = compaction_edit(body)
    if edit is None:
        return False
    trigger = (edit.get("trigger") or {}).get("value", TRIGGER_WHEN_UNSET)
    return context_tokens(body) >= int(trigger)


# --- structured output -------------------------------------------------------------------------


def output_schema(body: JSONObject) -> JSONObject | None:
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    schema = fmt.get("schema") if isinstance(fmt, dict) else None
    return schema if isinstance(schema, dict) else None


_SAMPLE_STRINGS = {"date-time": "2026-01-01T00:00:00Z", "date": "2026-01-01", "time": "00:00:00",
                   "duration": "P1D", "email": "someone@example.com", "hostname": "example.com",
                   "uri": "https://example.com/", "ipv4": "127.0.0.1", "ipv6": "::1",
                   "uuid": "00000000-0000-4000-8000-000000000000"}


def instance_of(schema: Any, root: JSONObject | None = None) -> Any:
    """A value of a strict schema (what the model, held to it, could answer)."""
    root = root if root is not None else schema
    if not isinstance(schema, dict):
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        return instance_of(target, root)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "allOf"):
        if schema.get(key):
            return instance_of(schema[key][0], root)
    kind = schema.get("type")
    if kind == "object":
        return {k: instance_of(v, root) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [instance_of(schema.get("items"), root)] if schema.get("minItems") == 1 else []
    if kind == "string":
        return _SAMPLE_STRINGS.get(str(schema.get("format")), "text")
    return {"integer": 0, "number": 0.5, "boolean": True}.get(str(kind))


def structured_problem(value: Any, schema: JSONObject) -> str | None:
    """How ``value`` fails ``schema`` (None if it does not)."""
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path))
    return "; ".join(f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors) or None


def _strict_problem(schema: Any, where: str) -> str | None:
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            if (problem := _strict_problem(item, f"{where}.{i}")) is not None:
                return problem
        return None
    if not isinstance(schema, dict):
        return f"{where}: must be a JSON Schema object"
    for key in schema:
        if key not in STRICT_KEYWORDS:
            return f"{where}: the '{key}' keyword is not supported in output_config.format schemas"
    if schema.get("type") == "object" and schema.get("additionalProperties") is not False:
        return f"{where}: for 'object' type, 'additionalProperties' must be explicitly set to false"
    if schema.get("type") == "string" and "format" in schema and schema["format"] not in STRING_FORMATS:
        return f"{where}.format: string format {schema['format']!r} is not supported"
    if schema.get("type") == "array" and schema.get("minItems", 0) not in (0, 1):
        return f"{where}.minItems: only 0 and 1 are supported"
    for key in ("properties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                if (problem := _strict_problem(sub, f"{where}.{key}.{name}")) is not None:
                    return problem
    for key in ("items", "anyOf", "allOf"):
        if key in schema and (problem := _strict_problem(schema[key], f"{where}.{key}")) is not None:
            return problem
    return None


# --- what the API refuses ------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    message: str
    error_code: str | None = None  # error.details.error_code
    status: int = 400  # 500: what the fake does not emulate


def _betas(headers: Mapping[str, str]) -> set[str]:
    return {b.strip() for b in headers.get("anthropic-beta", "").split(",") if b.strip()}


def _thinking_on(body: JSONObject) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


class Conversations:
    """What the fake served that a later request must send back as it was (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thinking: dict[str, set[tuple[str, str]]] = {}  # signature -> {(thinking, model)}
        self._compactions: dict[str, tuple[str | None, str | None]] = {}  # signature -> (content, encrypted)

    def remember(self, message: JSONObject) -> None:
        """Keep the signed blocks of a message served (its JSON form)."""
        model = str(message.get("model"))
        with self._lock:
            for block in message.get("content") or []:
                if block.get("type") == "thinking":
                    self._thinking.setdefault(block["signature"], set()).add((block["thinking"], model))
                elif block.get("type") == "compaction":
                    self._compactions[block["signature"]] = (block.get("content"), block.get("encrypted_content"))

    def refuse(self, body: JSONObject, headers: Mapping[str, str]) -> Refusal | None:
        """What the real API would refuse in a request's newer fields (None: nothing)."""
        betas = _betas(headers)
        for check in (_output_format_problem, _display_problem, _tool_choice_problem):
            problem = check(body, betas)
            if problem is not None:
                return problem
        return _context_management_problem(body, betas) or self._sent_back_problem(body, betas)

    def _sent_back_problem(self, body: JSONObject, betas: set[str]) -> Refusal | None:
        model = str(body.get("model"))
        summaries = 0
        for i, message in enumerate(body.get("messages") or []):
            content = message.get("content") if isinstance(message, dict) else None
            for j, block in enumerate(content if isinstance(content, list) else []):
                if not isinstance(block, dict):
                    continue
                where = f"messages.{i}.content.{j}"
                kind = block.get("type")
                if kind == "thinking" and message.get("role") == "assistant":
                    problem = self._thinking_problem(block, model, where)
                elif kind == "compaction":
                    if COMPACTION_BETA not in betas:
                        return Refusal(f"{where}.type: Input tag 'compaction' found using 'type' does not match any "
                                       "of the expected tags (compaction blocks need the compact-2026-01-12 beta)")
                    if message.get("role") != "assistant":
                        return Refusal(f"{where}: a compaction block may only be in an assistant turn",
                                       "compaction_block_misplaced")
                    summaries += 1 if block.get("content") else 0
                    problem = self._compaction_problem(block, where)
                else:
                    continue
                if problem is not None:
                    return problem
        if summaries > 1:
            return Refusal("more than one compaction block with content: send only the block the conversation "
                           "returned last", "compaction_block_ambiguous")
        return None

    def _thinking_problem(self, block: JSONObject, model: str, where: str) -> Refusal | None:
        with self._lock:
            served = self._thinking.get(str(block.get("signature")))
        if served is None or (block.get("thinking"), model) in served:
            return None  # not one of ours (a hand-made block), or as served
        if any(text == block.get("thinking") for text, _ in served):
            makers = sorted({m for text, m in served if text == block.get("thinking")})
            return Refusal(f"{where}: this thinking block was made by {', '.join(makers)} and cannot be sent to "
                           f"{model}: thinking is bound to the model that made it")
        return Refusal(f"{where}: Invalid `signature` in `thinking` block")

    def _compaction_problem(self, block: JSONObject, where: str) -> Refusal | None:
        signature = block.get("signature")
        with self._lock:
            served = self._compactions.get(str(signature))
        if served is None:
            return Refusal(f"{where}.signature: not a signature the API made", "compaction_signature_invalid")
        if (block.get("content"), block.get("encrypted_content")) != served:
            return Refusal(f"{where}.content: the compaction block's content is not what its signature was made "
                           "over; send the block back exactly as it came", "compaction_content_mismatch")
        return None


def _output_format_problem(body: JSONObject, betas: set[str]) -> Refusal | None:
    config = body.get("output_config")
    if not isinstance(config, dict) or config.get("format") is None:
        return None
    fmt = config["format"]
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return Refusal("output_config.format.type: Input should be 'json_schema'")
    if not isinstance(fmt.get("schema"), dict):
        return Refusal("output_config.format.schema: Field required (a JSON Schema object)")
    model = str(body.get("model"))
    if model.startswith(NO_STRUCTURED_OUTPUT):
        return Refusal(f"output_config.format: model {model} does not support structured outputs")
    problem = _strict_problem(fmt["schema"], "output_config.format.schema")
    return Refusal(problem) if problem is not None else None


def _display_problem(body: JSONObject, betas: set[str]) -> Refusal | None:
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or "display" not in thinking:
        return None
    kind, display = thinking.get("type"), thinking.get("display")
    if kind not in ("enabled", "adaptive"):
        return Refusal(f"thinking.{kind}.display: Extra inputs are not permitted")
    allowed = ("summarized", "omitted", *(("updates",) if DISPLAY_UPDATES_BETA in betas else ()))
    if display not in allowed:
        return Refusal(f"thinking.{kind}.display: Input should be {' or '.join(repr(a) for a in allowed)}")
    return None


def _tool_choice_problem(body: JSONObject, betas: set[str]) -> Refusal | None:
    choice = body.get("tool_choice")
    if choice is None:
        return None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        return Refusal(f"tool_choice.type: Input tag {kind!r} found using 'type' does not match any of the expected "
                       "tags: 'auto', 'any', 'tool', 'none'")
    if kind == "tool":
        names = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
        if choice.get("name") not in names:
            return Refusal(f"tool_choice.name: no tool named {choice.get('name')!r} in tools")
    if kind in ("any", "tool") and _thinking_on(body):
        return Refusal(FORCED_WITH_THINKING)
    return None


CLEAR_THINKING_EDIT = "clear_thinking_20251015"


def _context_management_problem(body: JSONObject, betas: set[str]) -> Refusal | None:
    if "compaction" in body:
        return Refusal("fake: the explicit compaction request (compaction: {type: summarize}) is not emulated", None,
                       500)
    management = body.get("context_management")
    if management is None:
        return None
    if not isinstance(management, dict) or not isinstance(management.get("edits"), list):
        return Refusal("context_management.edits: Field required (a list of edits)")
    for i, edit in enumerate(management["edits"]):
        where = f"context_management.edits.{i}"
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind == CLEAR_THINKING_EDIT:
            continue  # what the Claude Code CLI sends (keep: "all"): the fake clears no thinking anyway
        if kind != COMPACTION_EDIT:
            return Refusal(f"{where}.type: fake: only the {COMPACTION_EDIT} edit is emulated", None, 500)
        if COMPACTION_BETA not in betas:
            return Refusal(f"{where}: the {COMPACTION_EDIT} edit needs the anthropic-beta header "
                           f"{COMPACTION_BETA}")
        unknown = sorted(set(edit) - {"type", "trigger", "instructions", "pause_after_compaction"})
        if unknown:
            return Refusal(f"{where}.{unknown[0]}: Extra inputs are not permitted")
        trigger = edit.get("trigger")
        if trigger is not None:
            value = trigger.get("value") if isinstance(trigger, dict) else None
            if not isinstance(trigger, dict) or trigger.get("type") != "input_tokens":
                return Refusal(f"{where}.trigger.type: Input should be 'input_tokens'")
            if not isinstance(value, int) or isinstance(value, bool) or value < MIN_COMPACTION_TRIGGER:
                return Refusal(f"{where}.trigger.value: Input should be greater than or equal to "
                               f"{MIN_COMPACTION_TRIGGER}")
        if "instructions" in edit and edit["instructions"] is not None and not isinstance(edit["instructions"], str):
            return Refusal(f"{where}.instructions: Input should be a valid string")
        if not isinstance(edit.get("pause_after_compaction", False), bool):
            return Refusal(f"{where}.pause_after_compaction: Input should be a valid boolean")
    return None
