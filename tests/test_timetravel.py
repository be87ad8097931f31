"""rerun (re-execution from a run's own recording) and fork (a new run from the snapshot after SEQ)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from flowkernel.core.events import (
    AgentTool,
    BaseEvent,
    Event,
    FlowResumed,
    FlowStart,
    NodeComplete,
    NodeStart,
)
from flowkernel.fixtures import MockQuery
from flowkernel.run.kernel import Kernel
from flowkernel.run.timetravel import create_fork, first_divergence, fork, rerun
from flowkernel.store.sql.sqlite import SqliteStore
from flowkernel.testing.harness import run_flow

ROOT = Path(__file__).resolve().parent.parent
REVIEW = ROOT / "flows" / "review-loop.json"


def recorded_review(tmp_path: Path) -> tuple[Kernel, str]:
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"),
                    services={"query_fn": MockQuery(ROOT / "fixtures" / "review-loop")})
    snap = anyio.run(kernel.run, kernel.load_flow(REVIEW), {"feature": "CSV export"})
    assert snap.status == "completed"
    return kernel, snap.runId


def edited_flow(kernel: Kernel, tmp_path: Path, change: Any) -> Any:
    doc = json.loads(REVIEW.read_text())
    change(doc)
    return kernel.compile(doc, source=str(tmp_path / "review-loop.json"), base_dir=tmp_path)


def test_rerun_of_an_unchanged_flow_matches(tmp_path: Path) -> None:
    kernel, run_id = recorded_review(tmp_path)
    report = anyio.run(rerun, kernel, run_id)
    assert report.matches, report.describe()
    assert "matches the recording" in report.describe()


def test_rerun_reports_a_changed_prompt_with_node_call_and_path(tmp_path: Path) -> None:
    kernel, run_id = recorded_review(tmp_path)

    def change(doc: dict[str, Any]) -> None:
        doc["nodes"][2]["input"]["prompt"] = "Review carefully: {{ coder.text }}"
    report = anyio.run(lambda: rerun(kernel, run_id, flow=edited_flow(kernel, tmp_path, change)))
    assert report.divergence is not None and report.divergence.kind == "request"
    assert "node 'reviewer', call 0" in report.divergence.message
    assert "messages[0].content" in report.divergence.message


def test_rerun_reports_a_different_edge_decision(tmp_path: Path) -> None:
    kernel, run_id = recorded_review(tmp_path)

    def change(doc: dict[str, Any]) -> None:
        doc["edges"][2]["when"] = "false"
    report = anyio.run(lambda: rerun(kernel, run_id, flow=edited_flow(kernel, tmp_path, change)))
    assert report.divergence is not None and report.divergence.kind == "event"
    assert "reviewer->coder" in report.divergence.message
    assert "edge:fire" in report.divergence.message and "edge:skip" in report.divergence.message


def test_rerun_reports_a_node_the_recording_did_not_have(tmp_path: Path) -> None:
    kernel, run_id = recorded_review(tmp_path)

    def change(doc: dict[str, Any]) -> None:
        doc["nodes"].append({"id": "extra", "type": "noop", "input": {}})
    report = anyio.run(lambda: rerun(kernel, run_id, flow=edited_flow(kernel, tmp_path, change)))
    assert report.divergence is not None and report.divergence.kind == "extra_event"
    assert "extra: the re-execution has an extra event: node:start" in report.divergence.message


def test_fork_starts_a_new_run_from_the_snapshot_after_seq(tmp_path: Path) -> None:
    kernel, run_id = recorded_review(tmp_path)
    events = kernel.events(run_id)
    at = next(e.seq for e in events if e.type == "node:complete" and e.nodeId == "planner")
    fork_id = create_fork(kernel, run_id, at)
    record = kernel.store.get_run(fork_id)
    assert (record.forkedFrom, record.forkedAt) == (run_id, at)
    start = kernel.events(fork_id)[0]
    assert isinstance(start, FlowStart) and start.forkedFrom == run_id and start.forkedAt == at
    forked, source = kernel.snapshot(fork_id).outputs, kernel.snapshot(run_id, at=at).outputs
    assert forked["planner"]["text"] == source["planner"]["text"]
    assert forked["planner"]["sessionId"] == source["planner"]["sessionId"].replace(run_id[4:], fork_id[4:])
    snap = anyio.run(lambda: kernel.execute(fork_id, first=[FlowResumed()]))
    assert snap.status == "completed"
    assert snap.outputs["reviewer"]["structuredOutput"] == kernel.snapshot(run_id).outputs["reviewer"]["structuredOutput"]
    # the source is untouched and both stay inspectable
    assert kernel.snapshot(run_id).seq == events[-1].seq


def test_fork_mid_agent_continues_the_conversation_as_it_stood(tmp_path: Path) -> None:
    kernel, run_id = recorded_review(tmp_path)
    events = kernel.events(run_id)
    at = next(e.seq for e in events if e.type == "agent:text:delta" and e.nodeId == "coder")
    snap = anyio.run(lambda: fork(kernel, run_id, at))
    assert snap.status == "completed", snap.error
    assert snap.loopCounters == {"reviewer->coder": 1}


def test_fork_with_changed_input_reruns_what_follows_with_it(tmp_path: Path) -> None:
    kernel, run_id = recorded_review(tmp_path)
    snap = anyio.run(lambda: fork(kernel, run_id, 1, input={"feature": "JSON export"}))
    assert snap.status == "failed"  # the planner's prompt changed, so the recording no longer fits
    assert "node 'planner', call 0" in (snap.error or "") and "JSON export" in (snap.error or "")
    assert kernel.store.get_run(snap.runId).forkedFrom == run_id


def test_harness_runs_report_messages_and_tool_calls() -> None:
    result = run_flow(ROOT / "flows" / "research.json", {"question": "Which database should our desktop app use?"},
                      fixtures=ROOT / "fixtures" / "research", replies=["Mostly record transactions."],
                      registry=_research_registry())
    assert result.status == "completed"
    assert [c["toolName"] for c in result.tool_calls] == ["lookup_fact", "lookup_fact", "ask_human"]
    assert result.outputs["report"]["answer"].startswith("Use SQLite")


def _research_registry() -> Any:
    from flowkernel.examples.research_tools import lookup_fact
    from flowkernel.plugins.registry import default_registry

    reg = default_registry().copy()
    reg.add_tool("lookup_fact", lookup_fact)
    return reg


# -- comparing two executions ---------------------------------------------------------------------

def _numbered(events: list[BaseEvent]) -> list[Event]:
    for seq, ev in enumerate(events, start=1):
        ev.seq = seq
    return list(events)  # type: ignore[arg-type]


def _agent_turn(tools: list[tuple[str, str]]) -> list[BaseEvent]:
    """One agent node run whose model turn called tools that finished in the order given."""
    return [NodeStart(nodeId="agent", runId="nr_a", input={}),
            *(AgentTool(nodeId="agent", runId="nr_a", toolName="lookup", toolUseId=use_id, toolInput={},
                        toolOutput=output) for use_id, output in tools),
            NodeComplete(nodeId="agent", runId="nr_a", output={"text": "done"})]


def test_concurrent_tool_calls_finishing_in_another_order_are_not_a_divergence() -> None:
    recorded = _numbered(_agent_turn([("toolu_1", "a"), ("toolu_2", "b")]))
    rerun = _numbered(_agent_turn([("toolu_2", "b"), ("toolu_1", "a")]))
    assert first_divergence(recorded, rerun) is None


def test_a_tool_call_with_another_result_is_a_divergence_naming_the_call() -> None:
    recorded = _numbered(_agent_turn([("toolu_1", "a"), ("toolu_2", "b")]))
    rerun = _numbered(_agent_turn([("toolu_2", "B"), ("toolu_1", "a")]))
    found = first_divergence(recorded, rerun)
    assert found is not None and found.kind == "event" and found.seq == 3
    assert "agent tool call toolu_2" in found.message and '"B"' in found.message


def _normalized(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items() if k not in ("sessionId", "usage", "totalCostUsd")}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


@pytest.mark.parametrize("name", ["review-loop", "fanout"])
def test_a_fork_at_every_seq_of_an_agent_run_completes_from_the_fixtures(tmp_path: Path, name: str) -> None:
    # Seqs inside an agent turn (after its node:start and agent:start, before its first stored message)
    # included: the forked agent sends its prompt, once.
    fixtures = ROOT / "fixtures" / name
    kernel = Kernel(SqliteStore(tmp_path / "runs.db"), services={"query_fn": MockQuery(fixtures)})
    inputs = {"feature": "CSV export"} if name == "review-loop" else {}
    source = anyio.run(kernel.run, kernel.load_flow(ROOT / "flows" / f"{name}.json"), inputs)
    assert source.status == "completed"
    events = kernel.events(source.runId)
    inside = [e.seq for e in events if e.type == "agent:start"]
    assert inside, "the recording has agent turns to fork inside"
    for at in range(1, events[-1].seq + 1):
        snap = anyio.run(lambda at=at: fork(kernel, source.runId, at))
        assert snap.status == "completed", f"fork at seq {at} ({events[at - 1].type}): {snap.error}"
        assert _normalized(snap.outputs) == _normalized(source.outputs), f"fork at seq {at}"
        for row in kernel.store.list_agent_messages(flow_run_id=snap.runId, limit=10_000):
            assert row["content"] != "", f"fork at seq {at}: an empty message"
        prompts = [(r["sessionId"], r["content"]) for r in kernel.store.list_agent_messages(flow_run_id=snap.runId,
                                                                                              limit=10_000)
                   if r["role"] == "user" and r["step"] == 1]
        assert len(prompts) == len(set(prompts)), f"fork at seq {at}: a prompt sent twice"


def test_flowkernel_fork_inside_an_agent_turn_sends_the_prompt_once_and_completes(tmp_path: Path) -> None:
    # Issue 12.9 as a user meets it: `flowkernel fork RUN --at SEQ` with SEQ after the planner's
    # agent:start and before its first stored message used to fail at messages[0] (no prompt sent).
    from tests.crash_support import conversation, flowkernel, only_run

    db, fixtures = tmp_path / "runs.db", str(ROOT / "fixtures" / "review-loop")
    done = flowkernel(db, "run", str(REVIEW), "--input", "feature=CSV export", "--fixtures", fixtures)
    assert done.returncode == 0, done.stderr
    source = only_run(db)
    kernel = Kernel(str(db))
    try:
        events = kernel.events(source)
        at = next(e.seq for e in events if e.type == "agent:start" and e.nodeId == "planner")
        prompt = conversation(kernel, source, "planner")[0]
    finally:
        kernel.close()
    forked = flowkernel(db, "fork", source, "--at", str(at), "--fixtures", fixtures)
    assert forked.returncode == 0, forked.stderr
    assert f"of {source} at seq {at}" in forked.stderr
    kernel = Kernel(str(db))
    try:
        fork_id = next(r.runId for r in kernel.runs() if r.runId != source and r.parentRunId is None)
        assert kernel.snapshot(fork_id).status == "completed"
        talk = conversation(kernel, fork_id, "planner")
        assert prompt["role"] == "user" and talk[0] == prompt, "the forked agent starts with its prompt"
        assert talk.count(prompt) == 1, "and sends it once"
    finally:
        kernel.close()
