"""Native structured output: ``outputSchema`` goes as ``output_config.format`` to the models that take it,
as an instruction in the system prompt to the others; the answer is validated against the user's own
schema either way and lands in ``structuredOutput``.

The requests are the ones the real ``anthropic`` client sent to the loopback fake, which refuses a
format whose schema is not in the API's strict subset and a model without structured outputs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from flowkernel.core.events import AgentError
from flowkernel.fixtures.mock import MockQuery
from flowkernel.nodes.claude.structured import output_format, strict_schema
from flowkernel.testing.fake_api import FakeAnthropic, Structured, Text, reply
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.claude_support import agent_events, agent_flow, make_kernel, sent

REVIEW = {"type": "object", "required": ["passed", "issues"],
          "properties": {"passed": {"type": "boolean"}, "issues": {"type": "array", "items": {"type": "string"}}}}


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as f:
        yield f


async def test_a_model_with_structured_outputs_gets_the_schema_as_output_config_format(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Structured({"passed": False, "issues": ["no tests"]})))
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="Review it", system="Be strict.",
                                                      thinking={"type": "adaptive", "effort": "high"},
                                                      outputSchema=REVIEW)), {})

    assert snap.status == "completed", snap.error
    assert snap.outputs["agent"]["structuredOutput"] == {"passed": False, "issues": ["no tests"]}
    body = sent(fake.requests[0].body)
    assert body["system"] == "Be strict.", "no instruction in the system prompt on the native path"
    assert body["output_config"] == {"effort": "high", "format": {"type": "json_schema", "schema": {
        "type": "object", "additionalProperties": False, "required": ["passed", "issues"],
        "properties": {"passed": {"type": "boolean"}, "issues": {"type": "array", "items": {"type": "string"}}}}}}


async def test_a_model_without_structured_outputs_gets_the_instruction_and_no_format(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Text('{"passed": true, "issues": []}')))
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="Review it", model="claude-opus-4-1",
                                                      outputSchema=REVIEW)), {})

    assert snap.outputs["agent"]["structuredOutput"] == {"passed": True, "issues": []}
    body = fake.requests[0].body
    assert "output_config" not in body
    assert json.dumps(REVIEW, sort_keys=True) in sent(body)["system"]


@pytest.mark.parametrize("schema", [
    {"type": "object"},  # free-form: closing it would allow only {}
    {"type": "object", "required": ["on"]},
    {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}},
    {"type": ["object", "null"], "properties": {"a": {"type": "string"}}},
    {"required": ["a"]},  # no type: the strict subset cannot say it
])
async def test_a_schema_the_strict_subset_cannot_say_goes_as_the_instruction(
        tmp_path: Path, fake: FakeAnthropic, schema: dict[str, Any]) -> None:
    assert output_format(schema) is None
    fake.script(reply(Text('{"on": "yes", "a": "x"}')))
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="x", outputSchema=schema)), {})
    assert snap.status == "completed", snap.error
    assert "output_config" not in fake.requests[0].body
    assert "JSON Schema" in sent(fake.requests[0].body)["system"]


LONG_NAME = {"type": "object", "required": ["name"],
             "properties": {"name": {"type": "string", "minLength": 5, "description": "The full name."}}}


async def test_an_answer_that_fails_an_assertion_the_strict_subset_dropped_is_sent_back_and_corrected(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    # The API holds the model to the strict schema, which has no minLength: "Ada" passes it, not the user's.
    fake.script(reply(Structured({"name": "Ada"})), reply(Structured({"name": "Ada Lovelace"})))
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="Who wrote the first program?",
                                                      outputSchema=LONG_NAME)), {})

    assert snap.status == "completed", snap.error
    assert snap.outputs["agent"]["structuredOutput"] == {"name": "Ada Lovelace"}
    strict = fake.requests[0].body["output_config"]["format"]["schema"]
    assert strict["properties"]["name"] == {"type": "string", "description": "The full name.\n\n{minLength: 5}"}
    feedback = sent(fake.requests[1].body)["messages"][-1]
    assert feedback["role"] == "user" and "'Ada' is too short" in feedback["content"]
    assert fake.requests[1].body["output_config"] == fake.requests[0].body["output_config"]
    [error] = [e for e in agent_events(kernel, snap.runId) if isinstance(e, AgentError)]
    assert error.errorType == "error_output_schema" and error.details["path"] == "native"
    assert "native structured output" in error.message


async def test_a_mismatch_on_the_native_path_past_the_retries_fails_the_node_with_a_clear_error(
        tmp_path: Path, fake: FakeAnthropic) -> None:
    fake.script(reply(Structured({"name": "Ada"})))
    kernel = make_kernel(tmp_path, fake)
    snap = await kernel.run(kernel.compile(agent_flow(prompt="x", outputSchema=LONG_NAME, outputRetries=0)), {})

    assert snap.status == "failed"
    fault = snap.faults["agent"]
    assert fault.errorType == "error_output_schema"
    assert "native structured output" in fault.message and "name: 'Ada' is too short" in fault.message


def test_the_strict_subset_follows_the_installed_sdks_transform_schema() -> None:
    schema = {"type": "object", "title": "T", "properties": {
        "when": {"type": "string", "format": "date-time"},
        "word": {"type": "string", "format": "regex", "pattern": "^a"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 3},
        "one": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "minItems": 1},
        "kind": {"enum": ["a", "b"]}, "fixed": {"const": 3},
        "either": {"oneOf": [{"type": "integer", "maximum": 9}, {"type": "null"}]},
        "both": {"allOf": [{"type": "number"}]}},
        "required": ["when"], "additionalProperties": False,
        "$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer"}}}}}
    assert strict_schema(schema) == anthropic.transform_schema(schema)


_LEAF = st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number", "boolean", "null"])},
                              optional={"description": st.text(max_size=5), "minimum": st.integers(0, 3),
                                        "minLength": st.integers(0, 3), "format": st.sampled_from(["uri", "regex"]),
                                        "title": st.text(max_size=3)})
_SCHEMAS = st.recursive(_LEAF | st.fixed_dictionaries({"enum": st.lists(st.integers(), min_size=1, max_size=3)}),
                        lambda inner: st.fixed_dictionaries(
                            {"type": st.just("object"), "properties": st.dictionaries(
                                st.sampled_from(["a", "b", "c"]), inner, min_size=1, max_size=3)},
                            optional={"required": st.lists(st.sampled_from(["a", "b"]), max_size=2, unique=True),
                                      "additionalProperties": st.booleans()})
                        | st.fixed_dictionaries({"type": st.just("array"), "items": inner},
                                                optional={"minItems": st.integers(0, 4)})
                        | st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=2)}),
                        max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(_SCHEMAS)
def test_the_strict_subset_matches_transform_schema_on_any_schema_it_takes(schema: dict[str, Any]) -> None:
    assert strict_schema(schema) == anthropic.transform_schema(schema)


async def test_a_fixture_recorded_on_the_other_path_does_not_replay(tmp_path: Path) -> None:
    from flowkernel.run.kernel import Kernel
    from flowkernel.store.memory import MemoryStore

    instruction_request = {
        "model": "claude-sonnet-5-5", "max_tokens": 8192,
        "messages": [{"role": "user", "content": "Review it"}],
        "system": "When you give your final answer, reply with only a JSON value, no other text, that matches "
                  "this JSON Schema:\n" + json.dumps(REVIEW, sort_keys=True)}
    (tmp_path / "agent.json").write_text(json.dumps({"calls": [{"input": instruction_request, "output": {
        "content": [{"type": "text", "text": '{"passed": true, "issues": []}'}], "stopReason": "end_turn",
        "usage": {}}}]}))
    kernel = Kernel(MemoryStore(), services={"query_fn": MockQuery(tmp_path)})
    snap = await kernel.run(kernel.compile(agent_flow(prompt="Review it", outputSchema=REVIEW)), {})

    assert snap.status == "failed"
    fault = snap.faults["agent"]
    assert fault.errorType == "fixture_mismatch"
    paths = {d["path"] for d in fault.details["diff"]}
    assert "output_config" in paths and "system" in paths, paths


def test_the_fake_refuses_a_format_outside_the_strict_subset_and_a_model_without_structured_outputs() -> None:
    from flowkernel.testing.fake_conversation import Conversations

    rules = Conversations()
    base = {"model": "claude-sonnet-5-5", "max_tokens": 100, "messages": [{"role": "user", "content": "x"}]}

    def refused(schema: Any, model: str = "claude-sonnet-5-5") -> str | None:
        body = {**base, "model": model, "output_config": {"format": {"type": "json_schema", "schema": schema}}}
        refusal = rules.refuse(body, {})
        return refusal.message if refusal is not None else None

    assert refused(strict_schema(REVIEW)) is None
    assert "additionalProperties" in str(refused(REVIEW))
    assert "'minLength' keyword is not supported" in str(refused(
        {"type": "string", "minLength": 2}))
    assert "does not support structured outputs" in str(refused(strict_schema(REVIEW), "claude-opus-4-1"))
