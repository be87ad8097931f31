"""MockQuery and the fixture files: serving recorded calls, mismatches, bad files, and no network."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.events import NodeError
from flowkernel.errors import FlowkernelError
from flowkernel.fixtures import (
    FixtureError,
    MockQuery,
    fixture_path,
    fixtures_from_run,
    load_fixture_file,
    write_fixtures,
)
from flowkernel.nodes.claude.config import DEFAULT_MAX_TOKENS
from flowkernel.run.kernel import Kernel
from flowkernel.store.memory import MemoryStore
from flowkernel.testing.harness import FlowResult, assert_event_sequence, run_flow

ROOT = Path(__file__).resolve().parent.parent


def agent_doc(prompt: str = "Say hi", node: str = "agent") -> dict[str, Any]:
    return {"name": "fx", "nodes": [{"id": node, "type": "claude.agent", "input": {"prompt": prompt}}], "edges": []}


def call(prompt: str, answer: str, **extra: Any) -> dict[str, Any]:
    return {"input": {"model": "claude-sonnet-5-5", "max_tokens": DEFAULT_MAX_TOKENS,
                      "messages": [{"role": "user", "content": prompt}]},
            "output": {"content": [{"type": "text", "text": answer}], "stopReason": "end_turn",
                       "usage": {"inputTokens": 3, "outputTokens": 2}},
            "events": [{"type": "agent:text:delta", "content": answer}], **extra}


def node_error(result: FlowResult) -> NodeError:
    return next(e for e in result.events if isinstance(e, NodeError))


def write(directory: Path, node: str, body: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{node}.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


def test_mock_query_serves_the_recorded_answer_and_streams_its_events(tmp_path: Path) -> None:
    write(tmp_path, "agent", {"calls": [call("Say hi", "hi there")]})
    result = run_flow(agent_doc(), fixtures=tmp_path)
    assert result.status == "completed"
    assert result.outputs["agent"]["text"] == "hi there"
    assert_event_sequence(result.events, ["agent:start agent", "agent:text:delta agent", "agent:complete agent",
                                          "node:complete agent", "flow:complete"])
    assert [m["role"] for m in result.messages] == ["user", "assistant"]


def test_changed_prompt_fails_with_a_diff_naming_node_call_and_path(tmp_path: Path) -> None:
    write(tmp_path, "agent", {"calls": [call("Say hi", "hi")]})
    result = run_flow(agent_doc("Say hello"), fixtures=tmp_path)
    assert result.status == "failed"
    error = node_error(result)
    assert error.errorType == "fixture_mismatch"
    message = error.message
    assert "node 'agent', call 0" in message and "messages[0].content" in message
    assert '"Say hi"' in message and '"Say hello"' in message


def test_volatile_paths_are_ignored_in_the_comparison(tmp_path: Path) -> None:
    write(tmp_path, "agent", {"volatile": ["messages[*].content"], "calls": [call("Say hi", "hi")]})
    assert run_flow(agent_doc("Say hello at 12:03"), fixtures=tmp_path).status == "completed"
    write(tmp_path, "agent", {"calls": [call("Say hi", "hi")]})
    kernel = Kernel(MemoryStore(), services={"query_fn": MockQuery(tmp_path, volatile=["messages[0].content"])})
    snap = anyio.run(kernel.run, kernel.compile(agent_doc("Something else")), {})
    assert snap.status == "completed"


@pytest.mark.parametrize(("setting", "path"), [
    ({"thinking": {"type": "adaptive", "effort": "high"}}, "thinking"),
    ({"temperature": 0.2}, "temperature"),
    ({"maxTokens": 1000}, "max_tokens"),
])
def test_a_setting_changed_after_recording_fails_the_replay(tmp_path: Path, setting: dict[str, Any],
                                                            path: str) -> None:
    recorded = call("Say hi", "hi")
    recorded["input"]["model"] = "claude-sonnet-4-6"  # takes a temperature and adaptive thinking
    write(tmp_path, "agent", {"calls": [recorded]})
    doc = agent_doc()
    doc["nodes"][0]["input"].update(setting, model="claude-sonnet-4-6")
    result = run_flow(doc, fixtures=tmp_path)
    assert result.status == "failed"
    error = node_error(result)
    assert error.errorType == "fixture_mismatch"
    assert f"\n  {path}: recorded (absent)" in error.message or f"\n  {path}: recorded {DEFAULT_MAX_TOKENS}" \
        in error.message, error.message


def test_a_fixture_that_names_only_the_conversation_is_compared_on_it(tmp_path: Path) -> None:
    partial = call("Say hi", "hi")
    partial["input"] = {"model": "claude-sonnet-4-6", "messages": partial["input"]["messages"]}
    write(tmp_path, "agent", {"calls": [partial]})
    doc = agent_doc()
    doc["nodes"][0]["input"].update(temperature=0.7, model="claude-sonnet-4-6")
    assert run_flow(doc, fixtures=tmp_path).status == "completed"


def test_missing_file_names_node_and_call_and_how_to_record(tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    result = run_flow(agent_doc(), fixtures=tmp_path)
    message = node_error(result).message
    assert "node 'agent'" in message and "model call 0" in message and "flowkernel record --flow" in message


def test_an_extra_call_names_the_call_index_and_how_to_record(tmp_path: Path) -> None:
    first = call("Say hi", "not json")
    write(tmp_path, "agent", {"calls": [first]})
    doc = agent_doc()
    doc["nodes"][0]["input"]["outputSchema"] = {"type": "object"}
    first["input"]["system"] = ("When you give your final answer, reply with only a JSON value, no other text, "
                                "that matches this JSON Schema:\n{\"type\": \"object\"}")
    write(tmp_path, "agent", {"calls": [first]})
    result = run_flow(doc, fixtures=tmp_path)
    message = node_error(result).message
    assert "model call 1 is not recorded" in message and "has 1 call(s)" in message and "fixtures" in message


@pytest.mark.parametrize(("body", "field"), [
    ("{not json", "not valid JSON"),
    ([1, 2], "(root): must be an object"),
    ({"calls": {}}, "calls: must be a list"),
    ({"calls": [{"output": {"content": []}}]}, "calls[0].input: missing"),
    ({"calls": [{"input": {"messages": []}, "output": {"content": "hi"}}]}, "calls[0].output.content"),
    ({"calls": [{**call("a", "b"), "call": 1}]}, "calls[0].call: is 1 but this is call 0: calls are out of order"),
    ({"calls": [call("a", "b", events=[{"type": "node:start"}])]}, "calls[0].events[0]"),
    ({"calls": [], "nodes": 1}, "nodes: unknown field"),
    ({"node": "other", "calls": []}, "node: says 'other'"),
])
def test_malformed_fixture_files_name_the_file_and_field(tmp_path: Path, body: Any, field: str) -> None:
    path = write(tmp_path, "agent", body)
    with pytest.raises(FixtureError) as err:
        MockQuery(tmp_path)
    assert str(path) in str(err.value) and field in str(err.value)


@pytest.mark.parametrize("node", ["../x", "a/b", "..", ""])
def test_node_ids_that_leave_the_fixture_directory_are_refused(tmp_path: Path, node: str) -> None:
    with pytest.raises(FixtureError, match=r"fixture directory|cannot name a file"):
        fixture_path(tmp_path, node)


def test_a_fixture_directory_for_another_flow_is_named_as_such(tmp_path: Path) -> None:
    write(tmp_path, "agent", {"flow": "some-other-flow", "calls": [call("Say hi", "hi")]})
    result = run_flow(agent_doc(), fixtures=tmp_path)
    message = node_error(result).message
    assert "flow: recorded for flow 'some-other-flow'" in message and "fx" in message


def test_fixtures_are_never_overwritten_without_force(tmp_path: Path) -> None:
    docs = {"agent": {"node": "agent", "calls": [call("a", "b")]}}
    write_fixtures(docs, tmp_path)
    with pytest.raises(FixtureError, match="already exists; pass --force"):
        write_fixtures(docs, tmp_path)
    write_fixtures(docs, tmp_path, force=True)
    assert load_fixture_file(tmp_path / "agent.json").calls[0].output["content"][0]["text"] == "b"


def test_a_missing_fixture_directory_is_an_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(FlowkernelError, match="no such directory") as err:
        MockQuery(tmp_path / "nope")
    assert err.value.exit_code == 2


def test_foreach_items_are_served_by_item_whatever_the_interleaving(tmp_path: Path) -> None:
    result = run_flow(ROOT / "flows" / "fanout.json", {}, fixtures=ROOT / "fixtures" / "fanout")
    assert result.status == "completed"
    texts = [it["output"]["text"] for it in result.outputs["describe"]["iterations"]]
    assert texts[0].startswith("SQLite") and texts[1].startswith("PostgreSQL") and texts[2].startswith("DuckDB")


def test_a_fixture_run_makes_no_network_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise OSError("network access is forbidden in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-must-not-be-used")
    result = run_flow(ROOT / "flows" / "review-loop.json", {"feature": "CSV export"},
                      fixtures=ROOT / "fixtures" / "review-loop")
    assert result.status == "completed" and attempts == []
    assert result.snapshot.loopCounters == {"reviewer->coder": 1}


def test_fixtures_from_a_stored_run_serve_the_same_run_again(tmp_path: Path) -> None:
    first = run_flow(ROOT / "flows" / "review-loop.json", {"feature": "CSV export"},
                     fixtures=ROOT / "fixtures" / "review-loop")
    docs = fixtures_from_run(first.kernel.store, first.run_id, node_types=first.kernel.registry.node_types)
    assert sorted(docs) == ["coder", "planner", "reviewer"]
    recorded = json.loads((ROOT / "fixtures" / "review-loop" / "coder.json").read_text())
    assert [c["input"] for c in docs["coder"]["calls"]] == [c["input"] for c in recorded["calls"]]
    assert [c["events"] for c in docs["coder"]["calls"]] == [c["events"] for c in recorded["calls"]]
    write_fixtures(docs, tmp_path / "again")
    second = run_flow(ROOT / "flows" / "review-loop.json", {"feature": "CSV export"}, fixtures=tmp_path / "again")
    assert second.status == "completed"

    def without_sessions(outputs: dict[str, Any]) -> dict[str, Any]:
        return {k: {**v, "sessionId": None} for k, v in outputs.items()}
    assert without_sessions(second.outputs) == without_sessions(first.outputs)
